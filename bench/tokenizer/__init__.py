"""Tokenizer benchmark: fasttoken vs HF tokenizers vs tiktoken (python -m bench.tokenizer)."""
