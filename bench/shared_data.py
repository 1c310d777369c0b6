"""Where the shared data (real tokenizer files) lives: $PRELUDE_TEST_DATA, else ../shared beside
the checkout. Benchmarks and tests both read it; nothing here imports either."""
from __future__ import annotations

import os
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def shared_dir() -> Path:
    return Path(os.environ.get("PRELUDE_TEST_DATA", REPO.parent / "shared"))
