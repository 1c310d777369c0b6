"""HF-format checkpoint loading and the Qwen3 / Qwen2 / Llama decoder."""
