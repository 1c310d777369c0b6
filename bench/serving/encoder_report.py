"""The encoder benchmark's output: text tables on stdout, the same tables in a README.md, a JSON
file of every figure and a PNG of texts/s per cell and peer."""
from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Any, Sequence

from bench.serving.core import report
from bench.serving.encoder_runs import BUSY_CORES, CellResult, Turn


def fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        if value >= 1000:
            return f"{value:,.0f}"
        return f"{value:#.3g}" if value < 100 else f"{value:.0f}"
    return str(value)


def _results(turns: Sequence[Turn]) -> dict[tuple[str, str], CellResult]:
    return {(t.peer, r.cell.key): r for t in turns for r in t.cells}


def pivot(turns: Sequence[Turn], task: str) -> tuple[list[str], list[list[Any]]]:
    """A row per cell, a column per peer: texts/s (embed) or requests/s (rerank)."""
    peers = list(dict.fromkeys(t.peer for t in turns if t.task == task and t.cells))
    cells = list(dict.fromkeys(r.cell for t in turns if t.task == task for r in t.cells))
    cells.sort(key=lambda c: (c.kind != "short", c.batch, c.concurrency))
    results = _results(turns)
    rows = []
    for cell in cells:
        row: list[Any] = [f"{cell.kind} b={cell.batch}", f"c={cell.concurrency}"]
        for peer in peers:
            r = results.get((peer, cell.key))
            row.append(None if r is None else (r.requests_per_s if task == "rerank" else r.texts_per_s))
        rows.append(row)
    return ["cell", "load", *peers], rows


def details(turns: Sequence[Turn]) -> tuple[list[str], list[list[Any]]]:
    rows = []
    for t in turns:
        for r in t.cells:
            suspect = r.other_cores is not None and r.other_cores > BUSY_CORES
            rows.append([t.peer, r.cell.key, r.requests, r.errors, r.texts_per_s, r.requests_per_s, r.p50_ms,
                         r.p99_ms, r.cpu_ms_per_text, r.client_cores,
                         None if r.other_cores is None else f"{r.other_cores:.2f}" + ("!" if suspect else ""),
                         r.attempts])
    return (["peer", "cell", "ok", "err", "texts/s", "req/s", "P50 ms", "P99 ms", "CPU ms/text", "client cores",
             "other cores", "tries"], rows)


def turns_table(turns: Sequence[Turn]) -> tuple[list[str], list[list[Any]]]:
    rows = [[t.peer, t.task, t.mode, t.startup_s, t.rss_ready_mb, t.rss_after_mb, t.peak_rss_mb,
             " / ".join(f"{v:.2f}" for v in t.host_gemm_ms) or "-", t.failed or t.check or "-"] for t in turns]
    return ["peer", "task", "mode", "startup s", "RSS ready MB", "RSS after MB", "peak RSS MB", "host GEMM ms",
            "check"], rows


def versions_table(turns: Sequence[Turn]) -> tuple[list[str], list[list[Any]]]:
    seen: dict[str, list[Any]] = {}
    for t in turns:
        seen.setdefault(t.peer, [t.peer, t.mode, t.engine, t.version])
    return ["peer", "mode", "engine", "versions"], list(seen.values())


def text_tables(turns: Sequence[Turn]) -> str:
    parts = []
    for title, (headers, rows) in (("embeddings, texts/s", pivot(turns, "embed")),
                                   ("rerank (1 query + 32 documents), requests/s", pivot(turns, "rerank")),
                                   ("every cell", details(turns)), ("per peer and task", turns_table(turns))):
        if rows:
            parts.append(f"{title}\n{report.table(headers, [[fmt(v) for v in r] for r in rows])}")
    return "\n\n".join(parts)


def markdown(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(fmt(v).replace("|", "/") for v in row) + " |" for row in rows]
    return "\n".join(lines)


def write_readme(path: Path, turns: Sequence[Turn], command: str, meta: dict, notes: Sequence[str]) -> Path:
    sections = [
        "# Encoder embeddings and cross-encoder reranking, side by side (CPU)",
        f"`{command}`\n\n{meta['machine']}; {meta['date']}. Model: `{meta['model']}` "
        f"(sentence-transformers/all-MiniLM-L6-v2: BertModel, 6 layers, hidden 384, mean pooling, normalized). "
        "Rerank: a random-weight `BertForSequenceClassification` of cross-encoder/ms-marco-MiniLM-L-6-v2's shape "
        "(6 layers, hidden 384, 12 heads, 1 label), built by the bench with the same tokenizer. "
        f"Each cell: {meta['cell_seconds']:g} s of requests after a warmup; peers one after another, "
        + (f"{meta['rounds']} rounds (the order reversed every other round), each cell's fastest round "
           "reported." if meta["rounds"] > 1 else "one round."),
        "## Embeddings: texts/s\n\n" + markdown(*pivot(turns, "embed")),
        "## Rerank: requests/s (1 query + 32 documents of ~100 tokens)\n\n" + markdown(*pivot(turns, "rerank")),
        "## Every cell\n\nLatency is per request (in process: per `encode` call). CPU is the server's process "
        "tree (utime + stime from /proc, before and after the cell) per text; in process, the library's "
        "process. `other cores`: CPU of every other process on the machine during the cell; above "
        f"{BUSY_CORES} the cell is measured again (`tries`), up to twice, and the least shared attempt kept "
        "(`!`: it still shared the machine).\n\n" + markdown(*details(turns)),
        "## Startup, memory, answers\n\nStartup: spawn to the first `GET /health` 200 (servers), spawn to the "
        "first embedding returned (in process). RSS: the process tree's resident memory when ready and after "
        "the cells; peak: the sum of each process's own peak (VmHWM). `host GEMM ms`: a fixed float32 GEMM's "
        "P50 timed just before the turn, one per round (lower: the host was faster then). The check compares "
        "each peer's answer with sentence-transformers' vectors (embeddings) or transformers' logits "
        "(rerank).\n\n"
        + markdown(*turns_table(turns)),
        "## Peers\n\n" + markdown(*versions_table(turns)),
    ]
    if notes:
        sections.append("## Notes\n\n" + "\n".join(f"- {n}" for n in notes))
    path.write_text("\n\n".join(sections) + "\n")
    return path


def write_json(path: Path, turns: Sequence[Turn], command: str, meta: dict, notes: Sequence[str],
               rounds: Sequence[Turn]) -> Path:
    """`turns`: the reported figures (each cell's best round); `rounds`: every round as run."""
    data = {"tool": "bench.serving.encoders", "command": command, **meta, "notes": list(notes),
            "turns": [asdict(t) for t in turns], "every_round": [asdict(t) for t in rounds]}
    path.write_text(json.dumps(data, indent=1) + "\n")
    return path


def plot(turns: Sequence[Turn], path: Path) -> None:
    """One panel per request shape (embed short/passage x 1/32 texts, rerank), bars per peer
    grouped by concurrency; each panel on its own scale."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    results = [(t.peer, r) for t in turns for r in t.cells]
    shapes = list(dict.fromkeys(r.cell.shape for _, r in results))
    peers = list(dict.fromkeys(p for p, _ in results))
    inproc = {t.peer for t in turns if t.mode == "in-process"}
    if not shapes:
        return
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    fig, axes = plt.subplots(1, len(shapes), figsize=(3.6 * len(shapes) + 1, 4.2), squeeze=False)
    width = 0.8 / max(1, len(peers))
    for ax, shape in zip(axes.flat, shapes):
        levels = sorted({r.cell.concurrency for _, r in results if r.cell.shape == shape})
        rerank = shape.startswith("rerank")
        for i, peer in enumerate(peers):
            got = {r.cell.concurrency: (r.requests_per_s if rerank else r.texts_per_s)
                   for p, r in results if p == peer and r.cell.shape == shape}
            xs = [k + i * width for k in range(len(levels))]
            bars = ax.bar(xs, [got.get(c, 0.0) for c in levels], width, color=colours[i % len(colours)],
                          label=peer + (" (in process)" if peer in inproc else ""))
            ax.bar_label(bars, labels=[fmt(got[c]) if c in got else "" for c in levels], fontsize=6, rotation=90)
        ax.set_xticks([k + width * (len(peers) - 1) / 2 for k in range(len(levels))], [f"c={c}" for c in levels])
        ax.set_title(shape, fontsize=9)
        ax.set_ylabel("requests/s" if rerank else "texts/s", fontsize=8)
        ax.margins(y=0.2)
        ax.grid(True, axis="y", alpha=0.3)
    handles, labels = axes.flat[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=len(peers), fontsize=8)
    fig.tight_layout(rect=(0, 0.08, 1, 1))
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
