"""Table, JSON and PNG output of the tokenizer benchmark."""
from __future__ import annotations

import json
from pathlib import Path

from bench.tokenizer.measure import ROWS

LIBS = ("fasttoken", "hf", "tiktoken", "fastokens", "kitoken")


def _cell(value: float | None, best: bool = False) -> str:
    if value is None:
        return "-"
    text = f"{value:,.1f}" if value < 1000 else f"{value:,.0f}"
    return text + ("*" if best else " ")


def _present(results: dict[str, dict[str, dict[str, float]]]) -> list[str]:
    return [lib for lib in LIBS if any(lib in cells for rows in results.values() for cells in rows.values())]


def table(results: dict[str, dict[str, dict[str, float]]]) -> str:
    """Rows per tokenizer and operation: median per library, * on the fastest, and how many
    times slower the best other library is than fasttoken."""
    libs = _present(results)
    header = f"{'tokenizer':<16} {'operation':<26} {'unit':<9} " + " ".join(f"{lib:>11}" for lib in libs)
    header += f" {'best other/ft':>14}"
    lines = [header, "-" * len(header)]
    for name, rows in results.items():
        for row, unit in ROWS:
            cells = rows.get(row, {})
            if not cells:
                continue
            best = min(cells.values())
            others = [v for lib, v in cells.items() if lib != "fasttoken"]
            ratio = f"{min(others) / cells['fasttoken']:.2f}x" if others and cells.get("fasttoken") else "-"
            lines.append(f"{name:<16} {row:<26} {unit:<9} "
                         + " ".join(f"{_cell(cells.get(lib), cells.get(lib) == best):>11}" for lib in libs)
                         + f" {ratio:>14}")
    return "\n".join(lines)


def wins(results: dict[str, dict[str, dict[str, float]]]) -> tuple[int, int]:
    """(rows where fasttoken is the fastest, rows with at least two libraries)."""
    won = total = 0
    for rows in results.values():
        for cells in rows.values():
            if len(cells) < 2 or "fasttoken" not in cells:
                continue
            total += 1
            won += cells["fasttoken"] <= min(cells.values())
    return won, total


def write_json(path: Path, payload: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(payload, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def plot(path: Path, results: dict[str, dict[str, dict[str, float]]]) -> None:
    """Speedup of fasttoken over HF and tiktoken per operation, one panel per tokenizer."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(results)
    others = [lib for lib in _present(results) if lib != "fasttoken"]
    colours = dict(zip(others, ("tab:orange", "tab:green", "tab:red", "tab:purple")))
    fig, axes = plt.subplots(len(names), 1, figsize=(14, 3.4 * len(names)), squeeze=False)
    labels = [row for row, _ in ROWS]
    width = 0.8 / max(len(others), 1)
    for ax, name in zip(axes[:, 0], names):
        rows = results[name]
        for offset, other in enumerate(others):
            speedups = [rows.get(r, {}).get(other, 0) / rows[r]["fasttoken"]
                        if rows.get(r, {}).get(other) and rows[r].get("fasttoken") else 0 for r in labels]
            xs = [i + (offset - (len(others) - 1) / 2) * width for i in range(len(labels))]
            ax.bar(xs, speedups, width=width, color=colours[other], label=f"{other} / fasttoken")
        ax.axhline(1.0, color="black", linewidth=0.8)
        ax.set_yscale("log")
        ax.set_ylabel("time ratio (x)")
        ax.set_title(f"{name}: other library's time / fasttoken's (above 1: fasttoken faster)")
        ax.set_xticks(range(len(labels)))
        ax.set_xticklabels(labels, rotation=20, ha="right", fontsize=8)
        ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
