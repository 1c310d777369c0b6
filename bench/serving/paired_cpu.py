"""`python -m bench.serving.paired_cpu`: two servers' CPU per request, compared on a noisy host.

`bench.serving.cpu_cost` runs one server after the other, and on a small shared VM the same
build's figure moves by 25% between consecutive runs: a 5% change is lost. Here both servers run
at once (null executor, as in cpu_cost) and take turns in short blocks, A then B, B then A, so
each block pair sees the same slow or fast period of the host; each server's CPU is read from
/proc around its own blocks. The ratio B / A is the sum of B's CPU over its requests against A's.

The client is a bare HTTP/1.1 keep-alive client (one connection per request in flight, the body
written and the answer read as bytes, nothing parsed but the framing) on uvloop, so it leaves
the server most of a core: cpu_cost's aiohttp client takes about 60% of one of the dev
machine's two cores at c=64, and what a server costs then includes the competition for it.

Typical use, a change against the commit before it (each tree with its native build):

    python -m bench.serving.paired_cpu \\
        --a-cmd "env PYTHONPATH=/tmp/before python -m prelude" --b-cmd "env PYTHONPATH=. python -m prelude"
"""
from __future__ import annotations

import argparse
import asyncio
import random
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Sequence

from bench.charts import save_figure, write_chart
from bench.serving.core import proc, report
from bench.serving.core.client import make_client
from bench.serving.core.loadgen import int_list, prompt_source, split_server_args, started
from bench.serving.core.server import ServerProcess, parse_command, prelude_env
from bench.serving.core.workloads import Fixed, Job, Options

CLASSES = {"OneShot": 1, "Decode": 16}  # max_tokens; Decode answers are streamed, as in cpu_cost


@dataclass
class Side:
    requests: int = 0
    cpu_s: float = 0.0

    @property
    def us_per_request(self) -> float | None:
        return self.cpu_s / self.requests * 1e6 if self.requests else None


@dataclass
class Cell:
    workload: str
    concurrency: int
    a: Side
    b: Side

    @property
    def ratio(self) -> float | None:
        a, b = self.a.us_per_request, self.b.us_per_request
        return b / a if a and b is not None else None


async def _exchange(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, job: Job) -> None:
    """One request on a kept-alive connection, its answer read to the end (Content-Length or
    chunked framing). Raises on anything but 200."""
    writer.write(b"POST %s HTTP/1.1\r\nhost: bench\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n"
                 % (job.path.encode(), len(job.body)) + job.body)
    head = await reader.readuntil(b"\r\n\r\n")
    if not head.startswith(b"HTTP/1.1 200"):
        status = head.split(b"\r\n", 1)[0].decode(errors="replace")
        raise RuntimeError(f"the server answered {status}")
    length = None
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    if length is not None:
        await reader.readexactly(length)
        return
    while True:  # chunked
        size = int((await reader.readuntil(b"\r\n"))[:-2].split(b";")[0], 16)
        await reader.readexactly(size + 2)
        if size == 0:
            return


Connection = tuple[asyncio.StreamReader, asyncio.StreamWriter]


async def _block(connections: list[Connection], pid: int, jobs: Sequence[Job], seconds: float, offset: int) -> Side:
    """Jobs sent back to back on each of `connections` for `seconds`; the server's CPU meanwhile.
    The connections stay open from block to block (the server keeps idle ones for 120 s), so no
    block pays for accepting them."""
    count = [0]
    cpu0 = proc.cpu_seconds(pid)
    stop_at = time.perf_counter() + seconds

    async def worker(k: int) -> None:
        reader, writer = connections[k]
        i = offset + k
        while time.perf_counter() < stop_at:
            await _exchange(reader, writer, jobs[i % len(jobs)])
            i += len(connections)
            count[0] += 1

    await asyncio.gather(*(worker(k) for k in range(len(connections))))
    cpu1 = proc.cpu_seconds(pid)
    assert cpu0 is not None and cpu1 is not None
    return Side(count[0], cpu1 - cpu0)


async def compare(a: ServerProcess, b: ServerProcess, args: argparse.Namespace) -> list[Cell]:
    async with make_client(a.base_url, 4, 60.0) as client:
        model, _, factory = await prompt_source(client, None)
    rng = random.Random(args.seed)
    cells = []
    for name in args.classes:
        workload = Fixed(factory, Options(model), args.input_len, CLASSES[name])
        jobs = workload.jobs(args.prompts, rng)
        for c in args.concurrency:
            cell = Cell(f"{name} ({workload.label})", c, Side(), Side())
            servers = []
            for server, side in ((a, cell.a), (b, cell.b)):
                connections = [await asyncio.open_connection("127.0.0.1", server.port) for _ in range(c)]
                await _block(connections, server.pid, jobs, args.block_s, 0)  # warm, uncounted
                servers.append((connections, server.pid, side))
            for k in range(args.blocks):
                for connections, pid, side in servers if k % 2 == 0 else servers[::-1]:
                    got = await _block(connections, pid, jobs, args.block_s, k * c)
                    side.requests += got.requests
                    side.cpu_s += got.cpu_s
            for connections, _, _ in servers:
                for _, writer in connections:
                    writer.close()
            print(f"{cell.workload} c={c}: A {cell.a.us_per_request:.0f} us, B {cell.b.us_per_request:.0f} us, "
                  f"B/A {cell.ratio:.3f}", file=sys.stderr)
            cells.append(cell)
    return cells


def plot(cells: Sequence[Cell], labels: tuple[str, str], servers: str, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [f"{c.workload.split(' ')[0]} c={c.concurrency}" for c in cells]
    fig, ax = plt.subplots(figsize=(1.4 * len(cells) + 2, 4))
    xs = range(len(cells))
    for offset, (label, side) in zip((-0.2, 0.2), ((labels[0], "a"), (labels[1], "b"))):
        bars = ax.bar([x + offset for x in xs], [getattr(c, side).us_per_request or 0 for c in cells], 0.4,
                      label=label)
        ax.bar_label(bars, fmt="%.0f", fontsize=7)
    ax.set_xticks(list(xs), names, fontsize=8)
    ax.set_ylabel("server CPU per request (us)")
    ax.set_title(f"paired blocks, {servers}")
    ax.legend(fontsize=8)
    save_figure(fig, path)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m bench.serving.paired_cpu", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="Flags after a lone -- go to both servers.")
    p.add_argument("--a-cmd", help="command launching server A (default: this python -m prelude)")
    p.add_argument("--b-cmd", help="command launching server B (default: this python -m prelude)")
    p.add_argument("--labels", default="A,B", help="the two servers' names in the table")
    p.add_argument("--classes", type=lambda s: s.split(","), default=list(CLASSES),
                   help=f"comma-separated, from {','.join(CLASSES)}")
    p.add_argument("--concurrency", type=int_list, default=[1, 64])
    p.add_argument("--input-len", type=int, default=128, help="prompt tokens of every request")
    p.add_argument("--prompts", type=int, default=2048, help="distinct prompts sent in turn")
    p.add_argument("--block-s", type=float, default=1.0, help="seconds each server is driven per turn")
    p.add_argument("--blocks", type=int, default=20, help="turns per server and cell")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--log-dir", type=Path, default=report.RESULTS_DIR / "logs")
    p.add_argument("--json", type=Path, help="results file (default bench-results/paired_cpu-<time>.json); "
                                             "the chart goes beside it (.png)")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    own, server_args = split_server_args(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(own)
    unknown = [c for c in args.classes if c not in CLASSES]
    if unknown:
        raise SystemExit(f"unknown class(es) {', '.join(unknown)}; choose from {', '.join(CLASSES)}")
    if not proc.available():
        raise SystemExit("paired_cpu reads /proc/<pid>/stat; this system has no /proc")
    labels = tuple(args.labels.split(","))
    if len(labels) != 2:
        raise SystemExit("--labels takes two names")
    flags = ["--executor", "null", *server_args]
    # What the servers ran, for the table and chart: flags after -- may name another executor.
    servers = "server flags " + " ".join(flags) if server_args else "null executor"
    stamp = time.strftime("%Y%m%d-%H%M%S")
    a, b = (ServerProcess(flags, parse_command(cmd), prelude_env(), args.log_dir / f"{stamp}-paired-{label}.log", label)
            for cmd, label in ((args.a_cmd, labels[0]), (args.b_cmd, labels[1])))
    import uvloop  # a dependency of the server; here it keeps the client's CPU down

    with started(a), started(b):
        cells = uvloop.run(compare(a, b, args))
    rows = [[c.workload, f"c={c.concurrency}", c.a.requests, c.a.us_per_request, c.b.requests, c.b.us_per_request,
             c.ratio] for c in cells]
    print(f"\nServer CPU per request, {labels[0]} (A) and {labels[1]} (B) in alternating {args.block_s:g} s blocks, "
          f"{args.blocks} each ({servers}; CPU from /proc/<pid>/stat)")
    print(report.table(["class", "load", "A requests", "A us/req", "B requests", "B us/req", "B / A"], rows))
    path = report.write_json(args.json or report.default_json_path("paired_cpu"), {
        "tool": "bench.serving.paired_cpu", "argv": list(sys.argv if argv is None else argv),
        "servers": {label: {"argv": s.argv, "log": str(s.log_path)} for label, s in zip(labels, (a, b))},
        "cells": [{**asdict(c), "ratio": c.ratio} for c in cells]})
    print(f"\nresults: {path}")
    write_chart(lambda png: plot(cells, labels, servers, png), path.with_suffix(".png"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
