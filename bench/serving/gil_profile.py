"""Summarizes py-spy's collapsed stacks (`py-spy record --gil --format raw`, as gpu_table2
--py-spy writes them): which server thread held the GIL for what share of the samples, and the
functions that held it longest, by their own time and with their callees.

  python -m bench.serving.gil_profile OUT/pyspy-0.6B-512-1-c64.txt [--top 20]"""
from __future__ import annotations

import argparse
import re
from collections import Counter
from pathlib import Path
from typing import Iterator

LOCATION = re.compile(r" \([^()]*:\d+\)$")  # "name (file.py:12)" -> "name"
THREAD_ID = re.compile(r"\s*\(\d+\)")


def collapsed_stacks(path: Path) -> Iterator[tuple[str, int]]:
    """(stack, samples) per line of py-spy's collapsed output (`--threads`: each stack starts with
    its thread). py-spy now and then reads a frame's name mid-update, and the bytes it writes for
    it may hold a line break (a profile of the decode class had one): the torn sample's pieces,
    lines that do not start with a thread or end in a count, are skipped."""
    for line in path.read_text(errors="replace").split("\n"):
        stack, _, count = line.rpartition(" ")
        if stack.startswith("thread") and count.isdigit():
            yield stack, int(count)


def summarize(path: Path, top: int) -> str:
    threads: Counter[str] = Counter()
    own: Counter[tuple[str, str]] = Counter()
    inclusive: Counter[tuple[str, str]] = Counter()
    for stack, samples in collapsed_stacks(path):
        thread, *frames = stack.split(";")
        thread = THREAD_ID.sub("", thread).removeprefix("thread").strip(" :")
        names = [LOCATION.sub("", frame) for frame in frames]
        threads[thread] += samples
        if names:
            own[(thread, names[-1])] += samples
        for name in set(names):
            inclusive[(thread, name)] += samples
    total = sum(threads.values()) or 1
    lines = [f"{path.name}: {total} samples holding the GIL"]
    lines += [f"  {100 * n / total:5.1f}%  {thread}" for thread, n in threads.most_common()]
    for title, counts in (("own time", own), ("with callees", inclusive)):
        lines.append(f"top by {title}:")
        lines += [f"  {100 * n / total:5.1f}%  {thread[:16]:16} {name}"
                  for (thread, name), n in counts.most_common(top)]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("files", nargs="+", type=Path)
    parser.add_argument("--top", type=int, default=20)
    args = parser.parse_args()
    print("\n\n".join(summarize(path, args.top) for path in args.files))


if __name__ == "__main__":
    main()
