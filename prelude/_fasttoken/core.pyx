# cython: language_level=3
"""Placeholder proving the Cython build pipeline; the fasttoken issue replaces it."""


def build_ok() -> bool:
    return True
