"""`python -m bench.kernels.suffix_step`: one CPU step of a one-token request whose prompt is a
short suffix over a long prefix already in the KV cache (an LLM judge with its rubric cached),
without the server (ModelRunner.run: flattening, attention plan, forward, LM head, sampling at
T=1). The prefix is computed once into the cache, then the suffix step is timed in rounds;
reports the best and the median of the rounds."""
from __future__ import annotations

import argparse
import statistics
import sys
from typing import Sequence

import torch

from bench.serving.core import report
from bench.kernels.decode_step import BLOCK, add_step_flags, cpu_runner, mean_ms, start_steps
from prelude.contract.batch import OutputSpec, PrefillRow
from prelude.contract.sampling import SamplingParams
from prelude.model.config import ModelConfig


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.kernels.suffix_step", description=__doc__)
    p.add_argument("--prefix", type=int, default=2048, help="cached tokens")
    p.add_argument("--suffix", type=int, default=32, help="new tokens of the request")
    add_step_flags(p, "suffix_step.json", steps=20)
    args = p.parse_args(argv)
    start_steps(args)
    total = args.prefix + args.suffix
    blocks = -(-total // BLOCK)
    runner = cpu_runner(args.model, total + 1, blocks)
    vocab = ModelConfig.from_dir(args.model).vocab_size
    ids = torch.randint(0, vocab, (total,), generator=torch.Generator().manual_seed(0)).tolist()
    # The prefix's blocks in reverse order: a prefix-cache hit's blocks are wherever the pool had them.
    table = list(reversed(range(blocks)))
    runner.run([PrefillRow(0, ids[:args.prefix], 0, table, None)], ())
    request = [PrefillRow(1, ids[args.prefix:], args.prefix, table, OutputSpec(sample=SamplingParams()))]
    times = [mean_ms(lambda: runner.run(request, ()), args.steps) for _ in range(args.rounds)]
    print(f"{args.model}: {args.suffix} new tokens over {args.prefix} cached, {torch.get_num_threads()} threads")
    print(report.table(["best ms", "median ms"], [[min(times), statistics.median(times)]]))
    path = report.write_json(args.json, {"tool": "bench.kernels.suffix_step", "model": args.model,
                                         "prefix": args.prefix, "suffix": args.suffix,
                                         "threads": torch.get_num_threads(), "rounds_ms": times})
    print(f"results: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
