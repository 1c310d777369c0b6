"""`python -m bench.serving.server_profile`: where the server's own CPU goes per request.

Launches Prelude with `--executor null` (flags after a lone `--` go to it), drives it closed-loop
with `bench.serving.cpu_cost`'s request classes, and samples the server process with py-spy
(`pip install py-spy`; it attaches to the running server, so it needs ptrace rights: root, or
kernel.yama.ptrace_scope=0) only while the measured load runs: the startup's imports and the
warm-up stay out of the profile. Samples are taken of the thread holding the GIL (`--gil`):
where Python runs, not threads that are waking up or waiting for a core. Prints the samples'
shares by layer (the step thread; on the event loop the server, the engine, the HTTP server),
then `bench.serving.gil_profile`'s top functions; writes py-spy's raw collapsed stacks (which
speedscope and flamegraph.pl read) beside the JSON."""
from __future__ import annotations

import argparse
import asyncio
import collections
import random
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Sequence

from bench.serving.core import report
from bench.serving.core.client import make_client
from bench.serving.gil_profile import collapsed_stacks, summarize
from bench.serving.core.loadgen import prompt_source, split_server_args
from bench.serving.core.runner import Level, Limits, run_level
from bench.serving.core.server import ServerProcess, parse_command, prelude_env
from bench.serving.core.workloads import Fixed, Options

# Where a loop sample's stack says the loop was: the first match, in this order, names it.
LAYERS = (("prelude/server/", "server (prelude/server)"), ("starlette/", "server (prelude/server)"),
          ("prelude/engine/", "engine, on the loop"), ("prelude/cache/", "engine, on the loop"),
          ("uvicorn/", "HTTP server"), ("hypercorn/", "HTTP server"), ("h11/", "HTTP server"))


def layer_shares(raw: Path) -> list[tuple[str, float]]:
    """Percent of the GIL samples per layer: other threads' by name; the event loop's by what
    its stack holds, in LAYERS' order: a stack through an endpoint is the server's with all it
    calls (the engine's submit, the HTTP server's send), the engine's step loop is the engine's,
    the HTTP server's own callbacks (parsing) its own, the rest (the loop, asyncio) "other"."""
    shares: collections.Counter[str] = collections.Counter()
    for stack, count in collapsed_stacks(raw):
        thread, _, frames = stack.partition(";")
        if not thread.endswith("MainThread"):
            layer = f"thread {thread.rpartition(': ')[2]}"
        else:
            layer = next((name for marker, name in LAYERS if marker in frames), "event loop, other")
        shares[layer] += count
    total = sum(shares.values()) or 1
    return [(layer, 100 * n / total) for layer, n in shares.most_common()]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m bench.serving.server_profile", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="Flags after a lone -- go to the server.")
    p.add_argument("--classes", default="oneshot,decode", help="oneshot (128/1), decode (128/16), or both")
    p.add_argument("--concurrency", type=int, default=64)
    p.add_argument("--duration", type=float, default=20.0, help="seconds of load (and of sampling) per class")
    p.add_argument("--rate", type=int, default=250, help="py-spy samples per second")
    p.add_argument("--server-cmd", help="command launching the server (default: this python -m prelude)")
    p.add_argument("--top", type=int, default=25, help="frames shown per table")
    p.add_argument("--json", type=Path, help="results file (default bench-results/server_profile-<time>.json)")
    return p


async def profile_class(server: ServerProcess, name: str, output_len: int, args: argparse.Namespace,
                        raw: Path) -> dict:
    async with make_client(server.base_url, 4, 60.0) as client:
        model, _, factory = await prompt_source(client, None)
    workload = Fixed(factory, Options(model), 128, output_len)
    level = Level("concurrency", args.concurrency)
    # Warm up (connections, caches) before sampling starts.
    await run_level(server.base_url, workload, level, Limits(200, None, 32), random.Random(0), server.label,
                    server.pid, show_progress=False)
    spy = subprocess.Popen(["py-spy", "record", "--pid", str(server.pid), "--rate", str(args.rate), "--nonblocking",
                            "--gil", "--threads", "--duration", str(int(args.duration)), "--format", "raw",
                            "--output", str(raw)],
                           stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    await asyncio.sleep(1.0)  # py-spy attaches
    # More requests than the server can answer in the time: the duration ends the run.
    count = int(args.duration * 2000)
    result = await run_level(server.base_url, workload, level, Limits(count, args.duration - 2, 0),
                             random.Random(1), server.label, server.pid, show_progress=False)
    _, err = spy.communicate(timeout=60)
    if spy.returncode != 0 or not raw.exists():
        raise SystemExit(f"py-spy failed: {err.decode(errors='replace').strip()[-500:]}")
    return {"class": name, "requests": result.summary.completed, "req_s": result.summary.request_rate,
            "server_cpu_us_per_request": result.server_cpu_us_per_request, "raw": str(raw),
            "layers": layer_shares(raw)}


def main(argv: Sequence[str] | None = None) -> int:
    own, server_args = split_server_args(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(own)
    if shutil.which("py-spy") is None:
        raise SystemExit("py-spy is not installed: pip install py-spy")
    classes = {"oneshot": 1, "decode": 16}
    path = args.json or report.default_json_path("server_profile")
    path.parent.mkdir(parents=True, exist_ok=True)
    profiles = []
    with ServerProcess(["--executor", "null", *server_args], parse_command(args.server_cmd), prelude_env(),
                       label="prelude") as server:
        for name in args.classes.split(","):
            raw = path.with_name(f"{path.stem}-{name}.txt")
            profiles.append(asyncio.run(profile_class(server, name, classes[name], args, raw)))
    for p in profiles:
        print(f"\n== {p['class']} 128/{classes[p['class']]} at c={args.concurrency}: {p['requests']} requests, "
              f"{p['req_s']:.0f} req/s, server CPU {p['server_cpu_us_per_request'] or 0:.0f} us/request "
              "(py-spy attached: it slows the server)")
        print("GIL samples by layer:")
        print("\n".join(f"  {share:5.1f}%  {layer}" for layer, share in p["layers"]))
        print(summarize(Path(p["raw"]), args.top))
    report.write_json(path, {"tool": "bench.serving.server_profile", "server_args": server_args,
                             "concurrency": args.concurrency, "profiles": profiles})
    print(f"\nresults: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
