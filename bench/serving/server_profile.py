"""`python -m bench.serving.server_profile`: where the server's own CPU goes per request.

Launches Prelude with `--executor null` (flags after a lone `--` go to it), drives it closed-loop
with `bench.serving.cpu_cost`'s request classes, and samples the server process with py-spy
(`pip install py-spy`; it attaches to the running server, so it needs ptrace rights: root, or
kernel.yama.ptrace_scope=0) only while the measured load runs: the startup's imports and the
warm-up stay out of the profile. Prints each profile's top frames (self time), the share per
file or package, and the share of each Prelude server layer (inclusive); writes py-spy's raw
collapsed stacks, which speedscope and flamegraph.pl read, beside the JSON."""
from __future__ import annotations

import argparse
import asyncio
import collections
import random
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Sequence

from bench.serving import report
from bench.serving.client import make_client
from bench.serving.loadgen import prompt_source, split_server_args
from bench.serving.runner import Level, Limits, run_level
from bench.serving.server import ServerProcess, prelude_env
from bench.serving.workloads import Fixed, Options

_LINE = re.compile(r":\d+\)$")  # a frame's line number: frames of one function are summed


def summarize(raw: Path, top: int) -> dict[str, list[tuple[str, float]]]:
    """Shares (percent of samples) from py-spy's raw output: `frame;frame;... count` per line,
    outermost first (a thread's name first with --threads, which is not passed here)."""
    own: collections.Counter[str] = collections.Counter()
    inclusive: collections.Counter[str] = collections.Counter()
    places: collections.Counter[str] = collections.Counter()
    total = 0
    for line in raw.read_text().splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        frames = [_LINE.sub(")", f) for f in stack.split(";")]
        total += count
        own[frames[-1]] += count
        places[_place(frames[-1])] += count
        for frame in set(frames):
            inclusive[frame] += count
    if not total:
        return {"self": [], "place": [], "server_layers": [], "samples": [("samples", 0.0)]}

    def shares(counter: collections.Counter[str], n: int) -> list[tuple[str, float]]:
        return [(name, 100 * c / total) for name, c in counter.most_common(n)]

    layers = collections.Counter({f: c for f, c in inclusive.items() if "prelude/server/" in f or "starlette/" in f})
    return {"self": shares(own, top), "place": shares(places, top), "server_layers": shares(layers, top),
            "samples": [("samples", float(total))]}


def _place(frame: str) -> str:
    """The file (Prelude's) or package (third party) or stdlib module a frame runs in."""
    inside = frame[frame.find("(") + 1:-1]
    for marker, keep in (("site-packages/", 1), ("/prelude/", 2), ("/lib/python3", 3)):
        if marker in inside:
            rest = inside.split(marker, 1)[1]
            if keep == 1:
                return rest.split("/")[0]
            if keep == 2:
                return "prelude/" + rest
            return "stdlib " + rest.split("/", 1)[-1].split("/")[0]
    return inside


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m bench.serving.server_profile", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="Flags after a lone -- go to the server.")
    p.add_argument("--classes", default="oneshot,decode", help="oneshot (128/1), decode (128/16), or both")
    p.add_argument("--concurrency", type=int, default=64)
    p.add_argument("--duration", type=float, default=20.0, help="seconds of load (and of sampling) per class")
    p.add_argument("--rate", type=int, default=250, help="py-spy samples per second")
    p.add_argument("--top", type=int, default=25, help="frames shown per table")
    p.add_argument("--gil", action="store_true",
                   help="sample only the thread holding the GIL: where Python runs, without threads "
                        "that are waking or waiting")
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
    spy = subprocess.Popen(["py-spy", "record", "--pid", str(server.pid), "--rate", str(args.rate), "--nonblocking", *(["--gil"] if args.gil else []),
                            "--duration", str(int(args.duration)), "--format", "raw", "--output", str(raw)],
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
            **summarize(raw, args.top)}


def main(argv: Sequence[str] | None = None) -> int:
    own, server_args = split_server_args(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(own)
    if shutil.which("py-spy") is None:
        raise SystemExit("py-spy is not installed: pip install py-spy")
    classes = {"oneshot": 1, "decode": 16}
    path = args.json or report.default_json_path("server_profile")
    path.parent.mkdir(parents=True, exist_ok=True)
    profiles = []
    with ServerProcess(["--executor", "null", *server_args], env=prelude_env(), label="prelude") as server:
        for name in args.classes.split(","):
            raw = path.with_name(f"{path.stem}-{name}.txt")
            profiles.append(asyncio.run(profile_class(server, name, classes[name], args, raw)))
    for p in profiles:
        print(f"\n== {p['class']} 128/{classes[p['class']]} at c={args.concurrency}: {p['requests']} requests, "
              f"{p['req_s']:.0f} req/s, server CPU {p['server_cpu_us_per_request'] or 0:.0f} us/request "
              f"(py-spy attached: it slows the server), {p['samples'][0][1]:.0f} samples")
        for title, key in (("self", "self"), ("self, by file or package", "place"),
                           ("Prelude server layers and Starlette, inclusive", "server_layers")):
            print(f"-- {title}")
            print("\n".join(f"{share:5.1f}%  {frame[:140]}" for frame, share in p[key]))
    report.write_json(path, {"tool": "bench.serving.server_profile", "server_args": server_args,
                             "concurrency": args.concurrency, "profiles": profiles})
    print(f"\nresults: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
