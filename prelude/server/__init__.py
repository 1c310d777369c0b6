"""HTTP layer: Starlette app, OpenAI/vLLM-compatible endpoints, errors, metrics."""
