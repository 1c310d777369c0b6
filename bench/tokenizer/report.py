"""Table, JSON and PNG output of the tokenizer benchmark."""
from __future__ import annotations

import json
from pathlib import Path

from bench.tokenizer.measure import ROWS

LIBS = ("fasttoken", "hf", "tiktoken")


def _cell(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:,.1f}" if value < 1000 else f"{value:,.0f}"


def _ratio(num: float | None, den: float | None) -> str:
    return "-" if num is None or den is None or den <= 0 else f"{num / den:.1f}x"


def table(results: dict[str, dict[str, dict[str, float]]]) -> str:
    """Rows per tokenizer and operation: median µs per library and the speedups."""
    header = (f"{'tokenizer':<16} {'operation':<24} {'unit':<9} {'fasttoken':>10} {'HF':>10} "
              f"{'tiktoken':>10} {'HF/ft':>7} {'tt/ft':>7}")
    lines = [header, "-" * len(header)]
    for name, rows in results.items():
        for row, unit in ROWS:
            cells = rows.get(row, {})
            ft, hf, tt = (cells.get(lib) for lib in LIBS)
            lines.append(f"{name:<16} {row:<24} {unit:<9} {_cell(ft):>10} {_cell(hf):>10} {_cell(tt):>10} "
                         f"{_ratio(hf, ft):>7} {_ratio(tt, ft):>7}")
    return "\n".join(lines)


def write_json(path: Path, payload: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(payload, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def plot(path: Path, results: dict[str, dict[str, dict[str, float]]]) -> None:
    """Speedup of fasttoken over HF and tiktoken per operation, one panel per tokenizer."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(results)
    fig, axes = plt.subplots(len(names), 1, figsize=(13, 3.2 * len(names)), squeeze=False)
    labels = [row for row, _ in ROWS]
    for ax, name in zip(axes[:, 0], names):
        rows = results[name]
        for offset, (other, colour) in enumerate((("hf", "tab:orange"), ("tiktoken", "tab:green"))):
            speedups = [rows.get(r, {}).get(other, 0) / rows[r]["fasttoken"] if rows.get(r, {}).get(other) else 0
                        for r in labels]
            xs = [i + (offset - 0.5) * 0.38 for i in range(len(labels))]
            ax.bar(xs, speedups, width=0.38, color=colour, label=f"{'HF tokenizers' if other == 'hf' else 'tiktoken'} / fasttoken")
        ax.axhline(1.0, color="black", linewidth=0.8)
        ax.set_yscale("log")
        ax.set_ylabel("speedup (x)")
        ax.set_title(f"{name}: fasttoken speedup (higher is better)")
        ax.set_xticks(range(len(labels)))
        ax.set_xticklabels(labels, rotation=20, ha="right", fontsize=8)
        ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
