"""Progress bars for long benchmark runs (tqdm on stderr, so stdout keeps only the tables):
redrawn in place on a terminal, a line every few seconds elsewhere (logs, CI). Every tool takes
--no-progress to turn them off."""
from __future__ import annotations

import sys
from typing import Iterable, TypeVar

from tqdm import tqdm

T = TypeVar("T")


def say(line: str) -> None:
    """A stdout line that does not tear a bar being drawn on stderr."""
    tqdm.write(line, file=sys.stdout)


def bar(total: int, desc: str, enabled: bool = True, unit: str = "it") -> tqdm:
    tty = sys.stderr.isatty()
    return tqdm(total=total, desc=desc, unit=unit, disable=not enabled, file=sys.stderr, dynamic_ncols=tty,
                mininterval=0.2 if tty else 5.0, leave=True)


def each(items: Iterable[T], desc: str, enabled: bool = True, total: int | None = None, unit: str = "it") -> tqdm:
    """`items` with a bar advancing per item."""
    tty = sys.stderr.isatty()
    return tqdm(items, total=total, desc=desc, unit=unit, disable=not enabled, file=sys.stderr, dynamic_ncols=tty,
                mininterval=0.2 if tty else 5.0, leave=True)
