"""fasttoken: an inference-only byte-level BPE tokenizer compiled with Cython."""
