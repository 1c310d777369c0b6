"""Where the shared test data (real tokenizer files) lives: $PRELUDE_TEST_DATA, else ../shared."""
from __future__ import annotations

import functools
import warnings
from pathlib import Path

import pytest

from bench.shared_data import shared_dir

__all__ = ["hf_reference_tokenizer", "shared_dir", "tokenizer_dir", "tokenizer_file"]


def tokenizer_dir(name: str) -> Path:
    """Folder of one real tokenizer (qwen3, llama3, gpt2, ...); skips the test when absent."""
    path = shared_dir() / "tokenizers" / name
    if not (path / "tokenizer.json").is_file():
        pytest.skip(f"tokenizer data not found at {path} (set PRELUDE_TEST_DATA to the shared folder)")
    return path



def tokenizer_file(name: str) -> str:
    """The tokenizer.json of one real tokenizer, as a path string (skips the test when absent)."""
    return str(tokenizer_dir(name) / "tokenizer.json")


@functools.cache
def hf_reference_tokenizer(name: str):
    """transformers' AutoTokenizer for one real tokenizer, loaded once per session (skips the test
    when transformers or the data is missing; a skip is not cached)."""
    transformers = pytest.importorskip("transformers")
    path = tokenizer_dir(name)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return transformers.AutoTokenizer.from_pretrained(str(path))
