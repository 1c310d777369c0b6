"""Attention backends behind one contract (torch reference, flashinfer)."""
