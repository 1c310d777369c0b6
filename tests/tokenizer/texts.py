"""Long texts for the fasttoken tests, made of the equality gate's corpus fragments."""
from __future__ import annotations

import random

from bench.tokenizer.corpus import FRAGMENTS


def long_text(length: int, seed: int = 7) -> str:
    """`length` characters of corpus fragments in a seeded random order, joined by spaces."""
    rng = random.Random(seed)
    chunks = []
    size = 0
    while size < length:
        frag = rng.choice(FRAGMENTS)
        chunks.append(frag)
        size += len(frag) + 1
    return " ".join(chunks)[:length]
