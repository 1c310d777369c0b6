"""Structured outputs: JSON schema, regex, choice and grammar constraints compiled with
llguidance into per-request grammar states, and the token masks a step's sampler applies
(docs/structured-outputs.md)."""
