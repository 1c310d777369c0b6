"""`python -m bench.tokenizer`: equality gate first, then fasttoken vs HF tokenizers, tiktoken,
fastokens and kitoken (the last two when installed).

See bench/tokenizer/README.md for what each row measures.
"""
from __future__ import annotations

import argparse
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

from bench import progress
from bench.charts import write_chart
from bench.tokenizer import gate, libraries, report, textgen
from bench.tokenizer.measure import ROWS, load_ms, run_rows
from bench.shared_data import shared_dir

DEFAULT_TOKENIZERS = "qwen3,llama3,gpt2"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.tokenizer", description=__doc__)
    parser.add_argument("--tokenizers", default=DEFAULT_TOKENIZERS,
                        help=f"comma-separated names under shared/tokenizers (default {DEFAULT_TOKENIZERS})")
    parser.add_argument("--json", type=Path, default=Path("bench-results/tokenizer.json"),
                        help="where to write the results (default bench-results/tokenizer.json)")
    parser.add_argument("--plot", type=Path, default=None,
                        help="speedup chart (default: beside the JSON, .png)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bars on stderr")
    parser.add_argument("--budget", type=float, default=0.4, help="seconds of timing per cell (default 0.4)")
    parser.add_argument("--random", type=int, default=300, help="random strings per tokenizer in the gate")
    args = parser.parse_args(argv)

    names = [n.strip() for n in args.tokenizers.split(",") if n.strip()]
    paths = {n: str(shared_dir() / "tokenizers" / n / "tokenizer.json") for n in names}
    missing = [n for n, p in paths.items() if not os.path.isfile(p)]
    if missing:
        print(f"tokenizer files not found for {missing} under {shared_dir() / 'tokenizers'}", file=sys.stderr)
        return 2

    print("== equality gate (fasttoken vs HF tokenizers) ==", flush=True)
    failed = False
    for name, path in progress.each(paths.items(), "equality gate", not args.no_progress, total=len(paths),
                                    unit="tokenizer"):
        start = time.perf_counter()
        checked, problems = gate.equality_problems(path, args.random)
        status = "ok" if not problems else f"{len(problems)} DIFFERENCES"
        progress.say(f"{name:<16} {checked} texts: {status} ({time.perf_counter() - start:.1f}s)")
        for line in problems[:10]:
            progress.say(f"    {line}")
        failed = failed or bool(problems)
    if failed:
        print("equality gate failed: refusing to report speed", file=sys.stderr)
        return 1
    notes = {name: gate.tiktoken_agreement(path) for name, path in paths.items()}
    for name, note in notes.items():
        print(f"{name:<16} {note}")
    for extra in ("fastokens", "kitoken"):
        if getattr(libraries, extra)(paths[names[0]]) is None:
            print(f"{extra}: not installed (pip install {extra}); left out")

    print("\n== timing (median µs; lower is better; * marks the fastest) ==", flush=True)
    results: dict[str, dict[str, dict[str, float]]] = {}
    agreement: dict[str, dict[str, str]] = {}
    timing = progress.bar(len(paths), "timing", not args.no_progress, unit="tokenizer")
    for name, path in paths.items():
        libs = [libraries.fasttoken(path), libraries.hf(path)]
        for make in (libraries.tiktoken, libraries.fastokens, libraries.kitoken):
            lib = make(path)
            if lib is not None:
                libs.append(lib)
        # Each contender's equality with HF comes before its speed.
        agreement[name] = {}
        for lib in libs[2:]:
            equal, total = gate.contender_agreement(path, lib.encode)
            agreement[name][lib.name] = f"{equal}/{total}"
            print(f"  {name}: {lib.name} ids == HF ids on {equal}/{total} texts", flush=True)
        decode_ids = libs[1].encode(textgen.text(20_000, seed=99))[:1245]
        rows: dict[str, dict[str, float]] = {row: {} for row, _ in ROWS}
        for lib in libs:
            timing.set_postfix_str(f"{name} {lib.name}")
            for row, value in run_rows(lib, decode_ids, args.budget).items():
                rows[row][lib.name] = value
        for lib_name, load in libraries.loaders().items():
            if lib_name == "fasttoken":
                with tempfile.TemporaryDirectory() as tmp:
                    cold = []
                    for k in range(3):  # an empty cache directory each time: a first-ever load
                        os.environ["PRELUDE_CACHE"] = os.path.join(tmp, str(k))
                        cold.append(load_ms(load, path, reps=1))
                    rows["load cold"][lib_name] = sorted(cold)[1]
                    rows["load warm"][lib_name] = load_ms(load, path)
                    os.environ.pop("PRELUDE_CACHE", None)
            else:  # no cache of their own: every load is the same
                rows["load cold"][lib_name] = rows["load warm"][lib_name] = load_ms(load, path)
        results[name] = rows
        timing.update(1)
    timing.close()

    print()
    print(report.table(results))
    won, total = report.wins(results)
    print(f"\nfasttoken fastest on {won} of {total} rows")

    payload = {
        "machine": {"python": platform.python_version(), "platform": platform.platform(),
                    "cpus": os.cpu_count()},
        "unit": {row: unit for row, unit in ROWS},
        "tiktoken_agreement": notes,
        "hf_agreement": agreement,
        "results": results,
    }
    report.write_json(args.json, payload)
    print(f"JSON: {args.json}")
    write_chart(lambda png: report.plot(png, results), args.plot or args.json.with_suffix(".png"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
