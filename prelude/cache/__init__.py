"""KV block accounting: ref-counted block pool and block-level prefix cache."""
