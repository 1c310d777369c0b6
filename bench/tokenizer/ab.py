"""`python -m bench.tokenizer.ab OLD.so NEW.so [--tokenizers llama3] [--rows 50,500,8000] [--rounds 10]`:
two builds of prelude._fasttoken.core (e.g. a copy of the previous .so and the new one) loaded
side by side in one process and timed in alternating rounds on the single-thread encode rows
(fresh tokenizer per round, the same inputs and timer as rounds.py). On a shared, noisy host a
drift in load hits both builds alike, where separate processes can land on different bursts.
Prints per cell the min and median of each build, and new/old of the mins and the median of
the per-round ratios (below 1: the new build is faster)."""
from __future__ import annotations

import argparse
import importlib.machinery
import importlib.util
import statistics
import sys

from bench.shared_data import shared_dir
from bench.tokenizer.measure import _rotating, median_us
from bench.tokenizer.rounds import row_arguments, row_inputs
from prelude.tokenizer.fast import FastTokenizer

MODULE = "prelude._fasttoken.core"


def load(path: str):
    loader = importlib.machinery.ExtensionFileLoader(MODULE, path)
    spec = importlib.util.spec_from_file_location(MODULE, path, loader=loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("old")
    ap.add_argument("new")
    row_arguments(ap, "llama3", "50,500,8000", rounds=10)
    args = ap.parse_args()
    builds = {"old": load(args.old), "new": load(args.new)}
    names, rows, inputs = row_inputs(args)
    res: dict[tuple[str, int, str], list[float]] = {}
    for r in range(args.rounds):
        for name in names:
            path = str(shared_dir() / "tokenizers" / name / "tokenizer.json")
            for build in ("old", "new") if r % 2 == 0 else ("new", "old"):
                sys.modules[MODULE] = builds[build]  # FastTokenizer imports Core from it when loading
                ft = FastTokenizer(path)
                assert type(ft._core) is builds[build].Core
                for c in rows:
                    res.setdefault((name, c, build), []).append(
                        median_us(_rotating(ft.encode, inputs[c]), args.budget, max_reps=len(inputs[c]) - 1))
    print(f"{'tokenizer':12s} {'chars':>7s} {'old min':>9s} {'old med':>9s} {'new min':>9s} {'new med':>9s}"
          "  new/old(min) pairs(med)")
    for name in names:
        for c in rows:
            a, b = res[(name, c, "old")], res[(name, c, "new")]
            pairs = statistics.median(y / x for x, y in zip(a, b))
            print(f"{name:12s} {c:7d} {min(a):9.2f} {statistics.median(a):9.2f} {min(b):9.2f} "
                  f"{statistics.median(b):9.2f}  {min(b) / min(a):12.3f} {pairs:10.3f}")


if __name__ == "__main__":
    main()
