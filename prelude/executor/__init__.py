"""Executors: run a ForwardBatch on a device (torch reference, null, CUDA)."""
