"""Prelude: a resource-adaptive LLM inference server for decision-style traffic."""

__version__ = "0.1.0"
