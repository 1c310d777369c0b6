"""`python -m bench.serving.instructions`: the server's instructions per request, counted.

`bench.serving.cpu_cost` reads CPU seconds, which move by tens of percent within minutes on a
shared or small host; a 3% change is lost in them. This counts instead: it runs the server with
the null executor (as cpu_cost does) under valgrind's callgrind, counting nothing while the
server starts and warms up, then every instruction its threads execute while the client sends
the measured requests. The counts do not depend on the host's speed or its other load: the same
build gives the same figures within about 1%, so two builds compare in one run each. They leave
out what instructions do not show (cache misses, the kernel's side of a system call) and the
server runs some 50 times slower under valgrind, so they rank changes to Python and native code;
the seconds are still cpu_cost's. Needs valgrind (`apt install valgrind`).

The event loop is the process's first thread; "other threads" is the step thread and the rest
(the tokenizer pool, the native kernels' team)."""
from __future__ import annotations

import argparse
import asyncio
import random
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Sequence

from bench.charts import save_figure, write_chart
from bench.serving.core import report
from bench.serving.core.client import make_client
from bench.serving.core.loadgen import int_list, prompt_source, split_server_args
from bench.serving.core.runner import Level, Limits, RunResult, run_level
from bench.serving.core.server import ServerError, ServerProcess, prelude_env
from bench.serving.core.workloads import Fixed, Options


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m bench.serving.instructions", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="Flags after a lone -- go to the server.")
    p.add_argument("--model", help="model directory for the server (default: the demo model)")
    p.add_argument("--input-len", type=int, default=128, help="prompt tokens of every request")
    p.add_argument("--decode-tokens", type=int, default=16, help="output tokens of Decode requests")
    p.add_argument("--classes", type=lambda s: s.split(","), default=["OneShot", "Decode"],
                   help="request classes to count: OneShot (max_tokens=1), Decode (streamed)")
    p.add_argument("--concurrency", type=int_list, default=[1, 64])
    p.add_argument("--num-requests", type=int, default=600,
                   help="counted requests per run (its connections are opened within the count)")
    p.add_argument("--warmup", type=int, default=200, help="uncounted requests before each run")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--log-dir", type=Path, default=report.RESULTS_DIR / "logs")
    p.add_argument("--json", type=Path, help="results file (default bench-results/instructions-<time>.json); "
                                             "the chart goes beside it (.png)")
    p.add_argument("--keep", type=Path, help="keep callgrind's files in this folder (one per thread and run, "
                                             "for callgrind_annotate) instead of a temporary one")
    return p


class Counted:
    """A server process under callgrind, counting only between `counting()` calls."""

    def __init__(self, server: ServerProcess, out_dir: Path):
        self.server = server
        self.out_dir = out_dir

    def _control(self, *args: str) -> None:
        subprocess.run(["callgrind_control", *args, str(self.server.pid)], check=True, capture_output=True)

    def start_counting(self) -> None:
        self._control("--zero")
        self._control("--instr=on")

    def stop_counting(self) -> dict[int, int]:
        """Instructions per thread (callgrind's thread number: 1 is the main thread) since
        start_counting."""
        self._control("--instr=off")
        before = set(self.out_dir.glob("cg.out.*"))
        self._control("--dump")
        totals: dict[int, int] = {}
        for path in sorted(set(self.out_dir.glob("cg.out.*")) - before):
            thread, total = 0, 0
            for line in path.read_text().splitlines():
                if line.startswith("thread:"):
                    thread = int(line.split()[1])
                elif line.startswith("totals:"):
                    total = int(line.split()[1])
            totals[thread] = totals.get(thread, 0) + total
        return totals


async def measure(counted: Counted, args: argparse.Namespace) -> list[dict]:
    server = counted.server
    async with make_client(server.base_url, 4, 600.0) as client:
        model, _, factory = await prompt_source(client, None)
    options = Options(model)
    classes = {"OneShot": Fixed(factory, options, args.input_len, 1),
               "Decode": Fixed(factory, options, args.input_len, args.decode_tokens)}
    rng = random.Random(args.seed)
    rows = []
    for name in args.classes:
        for c in args.concurrency:
            level = Level("concurrency", c)
            await run_level(server.base_url, classes[name], level, Limits(args.warmup), rng, show_progress=False)
            counted.start_counting()
            result: RunResult = await run_level(server.base_url, classes[name], level,
                                                Limits(args.num_requests, None, 0), rng, show_progress=False)
            threads = counted.stop_counting()
            done = result.summary.completed
            loop = threads.get(1, 0)
            other = sum(v for k, v in threads.items() if k != 1)
            rows.append({"class": name, "workload": classes[name].label, "concurrency": c, "requests": done,
                         "errors": result.summary.errors, "loop_per_request": loop / max(done, 1),
                         "other_per_request": other / max(done, 1), "per_request": (loop + other) / max(done, 1)})
            print(f"  {name} c={c}: {rows[-1]['per_request']:,.0f} instructions per request", file=sys.stderr)
    return rows


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [f"{r['class']}\nc={r['concurrency']}" for r in rows]
    loop = [r["loop_per_request"] / 1e6 for r in rows]
    other = [r["other_per_request"] / 1e6 for r in rows]
    fig, ax = plt.subplots(figsize=(1.4 * len(rows) + 2, 4))
    ax.bar(labels, loop, label="event loop")
    bars = ax.bar(labels, other, bottom=loop, label="other threads")
    ax.bar_label(bars, labels=[f"{a + b:.2f}" for a, b in zip(loop, other)], fontsize=8)
    ax.set_ylabel("million instructions per request")
    ax.set_title("server instructions per request (null executor, callgrind)")
    ax.legend(fontsize=8)
    save_figure(fig, path)


def main(argv: Sequence[str] | None = None) -> int:
    own, server_args = split_server_args(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(own)
    if shutil.which("valgrind") is None or shutil.which("callgrind_control") is None:
        raise SystemExit("instructions runs the server under valgrind's callgrind: install valgrind "
                         "(apt install valgrind), or measure seconds with python -m bench.serving.cpu_cost")
    flags = ["--executor", "null", *(["--model", args.model] if args.model else []), *server_args]
    with tempfile.TemporaryDirectory(prefix="prelude-callgrind-") as tmp:
        out_dir = Path(tmp) if args.keep is None else args.keep
        out_dir.mkdir(parents=True, exist_ok=True)
        command = ["valgrind", "--tool=callgrind", "--separate-threads=yes", "--instr-atstart=no",
                   f"--callgrind-out-file={out_dir / 'cg.out'}", sys.executable, "-m", "prelude"]
        args.log_dir.mkdir(parents=True, exist_ok=True)
        server = ServerProcess(flags, command, prelude_env(), args.log_dir / "instructions-prelude.log", "prelude")
        print(f"starting prelude under callgrind (a minute or more): {' '.join(server.argv)}", file=sys.stderr)
        try:
            with server:
                rows = asyncio.run(measure(Counted(server, out_dir), args))
        except ServerError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
    print("\nServer instructions per request (null executor, counted by callgrind)")
    print(report.table(["class", "load", "requests", "err", "event loop", "other threads", "total"],
                       [[r["class"], f"c={r['concurrency']}", r["requests"], r["errors"],
                         f"{r['loop_per_request']:,.0f}", f"{r['other_per_request']:,.0f}",
                         f"{r['per_request']:,.0f}"] for r in rows]))
    path = report.write_json(args.json or report.default_json_path("instructions"), {
        "tool": "bench.serving.instructions", "argv": list(sys.argv if argv is None else argv),
        "server_argv": server.argv, "rows": rows})
    print(f"\nresults: {path}")
    write_chart(lambda png: plot(rows, png), path.with_suffix(".png"))
    return 0 if rows and all(r["requests"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
