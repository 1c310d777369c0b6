"""Charts beside benchmark results: PNGs drawn with matplotlib's Agg backend (no display needed),
written by default next to the JSON a tool saves."""
from __future__ import annotations

from pathlib import Path
from typing import Callable


def write_chart(draw: Callable[[Path], object], path: Path) -> None:
    """Draws the chart at `path`, or says why not (matplotlib comes with the dev extra)."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        print("(no chart: matplotlib is not installed; pip install -e '.[dev]')")
        return
    draw(path)
    print(f"chart: {path}")
