"""`python -m bench.tokenizer.rounds [--tokenizers qwen3,llama3] [--rounds 3]`: the single-thread
encode rows only, fasttoken against fastokens, repeated in one process to see through a noisy
host. Each round loads both tokenizers afresh (cold piece caches, as in a bench run) and times the
rows 50 -> 500 -> 8K -> 200K chars in order with the same inputs and timer as measure.py; the two
libraries alternate which goes first. Prints per cell the min and median over rounds and
fastokens/fasttoken for both (above 1: fasttoken is faster). No equality gate: run the bench for
that."""
from __future__ import annotations

import argparse
import statistics

from bench.tokenizer import textgen
from bench.tokenizer.measure import ENCODE_INPUTS, _rotating, median_us
from bench.shared_data import shared_dir
from prelude.tokenizer.fast import FastTokenizer


def row_arguments(ap: argparse.ArgumentParser, tokenizers: str, rows: str, rounds: int) -> None:
    """The flags every alternating-rounds timer takes (this one and bench.tokenizer.ab)."""
    ap.add_argument("--tokenizers", default=tokenizers)
    ap.add_argument("--rows", default=rows)
    ap.add_argument("--rounds", type=int, default=rounds)
    ap.add_argument("--budget", type=float, default=0.3)


def row_inputs(args: argparse.Namespace) -> tuple[list[str], list[int], dict[int, list[str]]]:
    """(tokenizer names, row sizes, each row's texts): the bench's encode inputs, one more than it
    times so a rotation never repeats a text back to back."""
    names, rows = args.tokenizers.split(","), [int(r) for r in args.rows.split(",")]
    return names, rows, {c: textgen.paper_texts(ENCODE_INPUTS[c] + 1, c, seed=c) for c in rows}


def main() -> None:
    import fastokens as fk

    ap = argparse.ArgumentParser()
    row_arguments(ap, "qwen3,llama3,gpt2,deepseek-v3", "50,500,8000,200000", rounds=3)
    args = ap.parse_args()
    names, rows, inputs = row_inputs(args)
    res: dict[tuple[str, int, str], list[float]] = {}
    for r in range(args.rounds):
        for name in names:
            path = str(shared_dir() / "tokenizers" / name / "tokenizer.json")
            ft = FastTokenizer(path)
            k = fk.Tokenizer.from_file(path)
            k.no_truncation()
            k.no_padding()
            kenc = k.encode
            libs = [("ft", ft.encode), ("fk", lambda t, kenc=kenc: kenc(t).ids)]
            for lib, enc in libs[::-1] if r & 1 else libs:
                for c in rows:
                    res.setdefault((name, c, lib), []).append(
                        median_us(_rotating(enc, inputs[c]), args.budget, max_reps=len(inputs[c]) - 1))
    print(f"{'tokenizer':12s} {'chars':>7s} {'ft min':>9s} {'ft med':>9s} {'fk min':>9s} {'fk med':>9s}"
          "  fk/ft(min) fk/ft(med)")
    for name in names:
        for c in rows:
            a, b = res[(name, c, "ft")], res[(name, c, "fk")]
            ma, mb = statistics.median(a), statistics.median(b)
            print(f"{name:12s} {c:7d} {min(a):9.2f} {ma:9.2f} {min(b):9.2f} {mb:9.2f}"
                  f"  {min(b) / min(a):10.2f} {mb / ma:10.2f}")


if __name__ == "__main__":
    main()
