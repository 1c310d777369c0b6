"""Presenting results: plain-text tables on stdout, a JSON file, and PNG plots."""
from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any, Iterable, Sequence

from bench.serving.core.runner import RunResult
from bench.serving.core.stats import Distribution

RESULTS_DIR = Path("bench-results")


def table(headers: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    """Left-aligned text columns, right-aligned numbers, one space-padded line per row."""
    cells = [[_cell(v) for v in row] for row in rows]
    widths = [max([len(h)] + [len(r[i]) for r in cells]) for i, h in enumerate(headers)]
    numeric = [all(_is_number(r[i]) for r in cells) and bool(cells) for i in range(len(headers))]

    def line(values: Sequence[str]) -> str:
        return "  ".join(v.rjust(w) if num else v.ljust(w) for v, w, num in zip(values, widths, numeric)).rstrip()

    return "\n".join([line(headers), line(["-" * w for w in widths]), *(line(r) for r in cells)])


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        if value >= 1000:
            return f"{value:,.0f}"
        return f"{value:#.3g}" if value < 10 else f"{value:.1f}"
    return str(value)


def _is_number(text: str) -> bool:
    return text == "-" or text.rstrip("*").replace(",", "").replace(".", "", 1).lstrip("-").isdigit()


def _ms(d: Distribution) -> list[float | None]:
    return [None if v is None else v * 1000 for v in (d.mean, d.p50, d.p95, d.p99)]


def throughput_table(results: Sequence[RunResult]) -> str:
    rows = []
    for r in results:
        s = r.summary
        client_util = None if r.client_cpu_share is None else r.client_cpu_share * 100
        rows.append([r.server, r.workload, r.level.label, s.completed, s.errors, s.request_rate, r.rows_per_s,
                     s.input_tok_per_s, s.output_tok_per_s, s.rpm, r.server_cpu_us_per_request, client_util])
    return table(["server", "workload", "load", "ok", "err", "req/s", "rows/s", "in tok/s", "out tok/s", "RPM",
                  "srv CPU us/req", "client CPU%"], rows)


def latency_table(results: Sequence[RunResult]) -> str:
    rows = []
    for r in results:
        s = r.summary
        ttft: list[float | str | None] = list(_ms(s.ttft))
        if not s.streamed:  # the footnote's marker: TTFT is the end of an unstreamed answer
            ttft = [None if v is None else f"{_cell(v)}*" for v in ttft]
        rows.append([r.server, r.workload, r.level.label, *ttft, *_ms(s.tpot), *_ms(s.e2e)])
    headers = ["server", "workload", "load"]
    for metric in ("TTFT", "TPOT", "E2E"):
        headers += [f"{metric} mean", "p50", "p95", "p99"]
    return table(headers, rows)


def ratio_table(results: Sequence[RunResult], numerator: str, denominator: str) -> str:
    """numerator / denominator per (workload, load) both servers ran: above 1 means the
    numerator served more requests per second (or, for latencies, was slower)."""
    by_key = {(r.server, r.workload, r.level): r for r in results}
    rows = []
    for (server, workload, level), a in by_key.items():
        b = by_key.get((denominator, workload, level))
        if server != numerator or b is None:
            continue
        rows.append([workload, level.label, _ratio(a.summary.request_rate, b.summary.request_rate),
                     _ratio(a.summary.ttft.p50, b.summary.ttft.p50),
                     _ratio(a.summary.e2e.mean, b.summary.e2e.mean),
                     _ratio(a.summary.e2e.p50, b.summary.e2e.p50), _ratio(a.summary.e2e.p99, b.summary.e2e.p99),
                     _ratio(a.server_cpu_us_per_request, b.server_cpu_us_per_request)])
    return table(["workload", "load", "req/s x", "TTFT p50 x", "E2E mean x", "E2E p50 x", "E2E p99 x",
                  "CPU/req x"], rows)


def _ratio(a: float | None, b: float | None) -> str | None:
    return f"{a / b:.2f}" if a is not None and b else None


def print_report(results: Sequence[RunResult], comparison: tuple[str, str] | None = None) -> None:
    print("\nThroughput")
    print(throughput_table(results))
    print("\nLatency (ms)")
    print(latency_table(results))
    if any(not r.summary.streamed for r in results):
        print("* 1-token and decision requests are sent without streaming: their TTFT equals E2E.")
    for r in results:
        s = r.summary
        if s.error_samples:
            print(f"errors in {r.server} {r.workload} {r.level.label}: {'; '.join(s.error_samples)}")
        if s.output_len_mismatches:
            print(f"note: {s.output_len_mismatches} requests in {r.server} {r.workload} {r.level.label} "
                  "returned a different number of tokens than asked (does the server honor ignore_eos?)")
        if r.client_cpu_share is not None and r.client_cpu_share > 0.8:
            print(f"note: the client used {r.client_cpu_share:.0%} of a core in {r.server} {r.workload} "
                  f"{r.level.label}: that level may be client-bound (run the client on other cores)")
        if r.max_send_lag_s > 0.05:
            print(f"note: in {r.server} {r.workload} {r.level.label} the client sent up to "
                  f"{r.max_send_lag_s * 1000:.0f} ms behind the Poisson schedule (client CPU-bound?)")
    if comparison is not None:
        print(f"\nComparison: {comparison[0]} / {comparison[1]}")
        print(ratio_table(results, *comparison))


def default_json_path(tool: str) -> Path:
    return RESULTS_DIR / f"{tool}-{time.strftime('%Y%m%d-%H%M%S')}.json"


def result_json(r: RunResult) -> dict:
    out = {"server": r.server, "workload": r.workload, "mode": r.level.mode, "level": r.level.value,
           **r.summary.to_json(), "client_cpu_s": r.client_cpu_s, "server_cpu_s": r.server_cpu_s,
           "server_cpu_us_per_request": r.server_cpu_us_per_request, "max_send_lag_s": r.max_send_lag_s,
           "machine_busy_s": r.machine_busy_s}
    if r.records:
        # Each request in send order, seconds from the run's first send: the shape of a tail (one
        # slow phase or spread-out spikes) shows only here, not in the percentiles.
        ordered = sorted(r.records, key=lambda q: q.start)
        t0 = ordered[0].start
        out["requests"] = [{"start": round(q.start - t0, 6), "ttft": round(q.ttft, 6), "e2e": round(q.e2e, 6),
                            "prompt_tokens": q.prompt_tokens, "output_tokens": q.output_tokens, "ok": q.ok,
                            "error": q.error} for q in ordered]
    return out


def write_json(path: Path, payload: dict) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(payload, indent=2) + "\n")
    return path


def plot(results: Sequence[RunResult], path: Path) -> Path:
    """Latency against throughput, one panel per workload and one curve per server: each point
    is a load level (labelled), E2E P50 solid, E2E P99 dashed, TTFT P50 dotted where streamed.
    A curve bending up marks the throughput a server sustains before latency gives way."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    workloads = list(dict.fromkeys(r.workload for r in results))
    servers = list(dict.fromkeys(r.server for r in results))
    fig, axes = plt.subplots(1, len(workloads), figsize=(5.5 * len(workloads), 4.2), squeeze=False)
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for ax, workload in zip(axes[0], workloads):
        for i, server in enumerate(servers):
            runs = sorted((r for r in results if r.workload == workload and r.server == server),
                          key=lambda r: r.level.value)
            if not runs:
                continue
            xs = [r.summary.request_rate for r in runs]
            colour = colours[i % len(colours)]
            curves = [("E2E p50", "-", lambda r: r.summary.e2e.p50), ("E2E p99", "--", lambda r: r.summary.e2e.p99)]
            if any(r.summary.streamed for r in runs):
                curves.append(("TTFT p50", ":", lambda r: r.summary.ttft.p50))
            for name, style, value in curves:
                ys = [_scaled(value(r)) for r in runs]
                ax.plot(xs, [math.nan if y is None else y for y in ys], style, marker="o", color=colour,
                        label=f"{server} {name}")
            for r, x in zip(runs, xs):
                y = _scaled(r.summary.e2e.p50)
                if y is not None:
                    ax.annotate(r.level.label, (x, y), textcoords="offset points", xytext=(3, 3), fontsize=7)
        ax.set_xlabel("throughput (requests / s)")
        ax.set_ylabel("latency (ms)")
        ax.set_ylim(bottom=0)
        ax.set_title(workload)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def _scaled(seconds: float | None) -> float | None:
    return None if seconds is None else seconds * 1000
