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


def save_figure(fig, path: Path, dpi: int = 100) -> None:
    """Lays out a finished matplotlib figure, writes it at `path` (its folder made if need be)
    and frees it."""
    import matplotlib.pyplot as plt

    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=dpi)
    plt.close(fig)
