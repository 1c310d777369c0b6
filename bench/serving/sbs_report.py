"""The side-by-side bench's output: its headline rows (one metric per row, each server's figure
and the ratio Prelude / peer), the JSON of each side, and a PNG with one bar panel per row."""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Sequence

from bench.serving.core import report
from bench.serving import host_noise
from bench.serving.core.runner import RunResult


@dataclass(frozen=True, slots=True)
class Spec:
    """One workload of the comparison at one concurrency."""

    key: str  # stable name in the JSON and the table
    kind: str  # "complete" | "embed"
    input_len: int
    output_len: int
    concurrency: int
    requests: int


@dataclass(slots=True)
class SideResult:
    label: str
    startup_s: float | None = None  # launched servers only: spawn to first /health 200
    rss_bytes: int | None = None  # after load, before the first measured request
    runs: dict[str, RunResult] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)  # spec key -> why
    # Cores' worth of CPU used by processes other than the server and this client during each
    # run: on a shared machine, a run with much of it is suspect.
    foreign_cores: dict[str, float] = field(default_factory=dict)
    # The machine's steadiness during this side's turn, measured just before its c=1 run.
    host_noise: host_noise.HostNoise | None = None
    servers: list[dict] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class Row:
    metric: str
    unit: str
    better: str  # "lower" | "higher": which way the ratio should go for Prelude
    values: tuple[float | None, ...]  # one per side, Prelude first

    @property
    def ratio(self) -> float | None:
        """Prelude / peer; None without both figures."""
        if len(self.values) < 2 or self.values[0] is None or not self.values[1]:
            return None
        return self.values[0] / self.values[1]

    def to_json(self) -> dict:
        return {**asdict(self), "ratio": self.ratio}


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else seconds * 1000


def _run_metric(key: str, get: Callable[[RunResult], float | None]) -> Callable[[SideResult], float | None]:
    def value(side: SideResult) -> float | None:
        run = side.runs.get(key)
        return None if run is None or not run.summary.completed else get(run)
    return value


def _p99_over_p50(run: RunResult) -> float | None:
    p50, p99 = run.summary.ttft.p50, run.summary.ttft.p99
    return p99 / p50 if p50 and p99 is not None else None


def _cpu_ms(run: RunResult) -> float | None:
    us = run.server_cpu_us_per_request
    return None if us is None else us / 1000


def _failed(side: SideResult) -> float | None:
    """Requests answered with an error or not at all, over every measured run (a workload whose
    probe failed is not run: the notes name it)."""
    return sum(run.summary.errors for run in side.runs.values()) if side.runs else None


def metrics(spec_keys: Sequence[str]) -> list[tuple[str, str, str, Callable[[SideResult], float | None]]]:
    """(metric, unit, better, value of a side), in the issue's order."""
    c1, c16, gen, emb = spec_keys
    return [
        ("startup to /health", "s", "lower", lambda s: s.startup_s),
        ("RSS after load (process tree)", "MiB", "lower",
         lambda s: None if s.rss_bytes is None else s.rss_bytes / 2**20),
        (f"{c1}: TTFT P50", "ms", "lower", _run_metric(c1, lambda r: _ms(r.summary.ttft.p50))),
        (f"{c1}: TTFT P99", "ms", "lower", _run_metric(c1, lambda r: _ms(r.summary.ttft.p99))),
        (f"{c1}: TTFT P99 / P50", "x", "lower", _run_metric(c1, _p99_over_p50)),
        ("host noise: fixed compute loop P99 / P50", "x", "lower",
         lambda s: None if s.host_noise is None else s.host_noise.p99_over_p50),
        (f"{c16}: throughput", "req/s", "higher", _run_metric(c16, lambda r: r.summary.request_rate)),
        (f"{gen}: TPOT median", "ms", "lower", _run_metric(gen, lambda r: _ms(r.summary.tpot.p50))),
        (f"{gen}: TTFT median", "ms", "lower", _run_metric(gen, lambda r: _ms(r.summary.ttft.p50))),
        (f"{gen}: output tokens", "tok/s", "higher", _run_metric(gen, lambda r: r.summary.output_tok_per_s)),
        (f"{emb}: throughput", "req/s", "higher", _run_metric(emb, lambda r: r.summary.request_rate)),
        (f"server CPU per request, {c1}", "ms", "lower", _run_metric(c1, _cpu_ms)),
        (f"server CPU per request, {c16}", "ms", "lower", _run_metric(c16, _cpu_ms)),
        (f"server CPU per request, {gen}", "ms", "lower", _run_metric(gen, _cpu_ms)),
        (f"server CPU per request, {emb}", "ms", "lower", _run_metric(emb, _cpu_ms)),
        ("failed requests, all workloads", "requests", "lower", _failed),
    ]


def headline(sides: Sequence[SideResult], specs: Sequence[Spec]) -> list[Row]:
    return [Row(name, unit, better, tuple(value(s) for s in sides))
            for name, unit, better, value in metrics([s.key for s in specs])]


def render(rows: Sequence[Row], labels: Sequence[str], peer: str | None) -> str:
    """The one table: a row per metric, a column per server, then the ratio Prelude / peer."""
    headers = ["metric", "unit", *labels]
    if peer is not None:
        headers.append(f"{labels[0]} / {peer}")
    body = []
    for row in rows:
        cells: list[object] = [row.metric, row.unit, *row.values]
        if peer is not None:
            ratio = row.ratio
            cells.append(None if ratio is None else f"{ratio:.2f}")
        body.append(cells)
    note = "ratio < 1 is better for lower-is-better rows (latency, CPU, memory, startup); > 1 for req/s, tok/s"
    return report.table(headers, body) + ("\n" + note if peer is not None else "")


def side_json(side: SideResult) -> dict:
    return {"label": side.label, "startup_s": side.startup_s, "rss_bytes": side.rss_bytes,
            "servers": side.servers, "skipped": side.skipped, "foreign_cores": side.foreign_cores,
            "host_noise": None if side.host_noise is None else asdict(side.host_noise),
            "runs": {key: report.result_json(run) for key, run in side.runs.items()}}


def plot(rows: Sequence[Row], labels: Sequence[str], path: Path) -> Path:
    """One small bar panel per metric (its own scale), one bar per server, the ratio in the title."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shown = [r for r in rows if any(v is not None for v in r.values)]
    cols = 4
    nrows = max(1, math.ceil(len(shown) / cols))
    fig, axes = plt.subplots(nrows, cols, figsize=(4.2 * cols, 3.0 * nrows), squeeze=False)
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for ax, row in zip(axes.flat, shown):
        heights = [0.0 if v is None else v for v in row.values]
        bars = ax.bar(range(len(labels)), heights, color=colours[:len(labels)])
        for bar, v in zip(bars, row.values):
            ax.annotate("n/a" if v is None else report._cell(float(v)), (bar.get_x() + bar.get_width() / 2,
                        bar.get_height()), ha="center", va="bottom", fontsize=8)
        ax.set_xticks(range(len(labels)), labels, fontsize=8)
        ratio = row.ratio
        title = row.metric + ("" if ratio is None else f"\n{labels[0]}/{labels[1]} = {ratio:.2f}x")
        ax.set_title(title, fontsize=8)
        ax.set_ylabel(f"{row.unit} ({row.better} is better)", fontsize=7)
        ax.tick_params(axis="y", labelsize=7)
        ax.grid(True, axis="y", alpha=0.3)
    for ax in list(axes.flat)[len(shown):]:
        ax.set_visible(False)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
