"""`python -m bench.tokenizer`: equality gate first, then fasttoken vs HF tokenizers vs tiktoken.

See bench/tokenizer/README.md for what each row measures.
"""
from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from pathlib import Path

from bench import progress
from bench.charts import write_chart
from bench.tokenizer import gate, libraries, report, textgen
from bench.tokenizer.measure import ENCODE_ROWS, ROWS, run_rows
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

    print("\n== timing (median µs; lower is better) ==", flush=True)
    results: dict[str, dict[str, dict[str, float]]] = {}
    timing = progress.bar(len(paths) * 3, "timing", not args.no_progress, unit="library")
    for name, path in paths.items():
        libs = [libraries.fasttoken(path), libraries.hf(path)]
        tiktoken_lib = libraries.tiktoken(path)
        if tiktoken_lib is not None:
            libs.append(tiktoken_lib)
        else:
            timing.total -= 1
        decode_ids = libs[1].encode(textgen.text(20_000, seed=99))[:1245]
        rows: dict[str, dict[str, float]] = {row: {} for row, _ in ROWS}
        for lib in libs:
            timing.set_postfix_str(f"{name} {lib.name}")
            for row, value in run_rows(lib, decode_ids, args.budget).items():
                rows[row][lib.name] = value
            timing.update(1)
        results[name] = rows
    timing.close()

    print()
    print(report.table(results))
    losses = [f"{name} {row} vs {other}" for name, rows in results.items() for row, cells in rows.items()
              for other in ("hf", "tiktoken")
              if other in cells and (other == "hf" or row in ENCODE_ROWS) and cells[other] <= cells["fasttoken"]]
    print("\nfasttoken is faster than HF on every row and than tiktoken on every encode row"
          if not losses else "\nNOT faster: " + "; ".join(losses))

    payload = {
        "machine": {"python": platform.python_version(), "platform": platform.platform(),
                    "cpus": os.cpu_count()},
        "unit": {row: unit for row, unit in ROWS},
        "tiktoken_agreement": notes,
        "results": results,
    }
    report.write_json(args.json, payload)
    print(f"JSON: {args.json}")
    write_chart(lambda png: report.plot(png, results), args.plot or args.json.with_suffix(".png"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
