"""CPU time of a server process (and its descendants) from /proc: no extra dependency, and the
kernel's own accounting, which includes every thread (tokenizer pool, step worker)."""
from __future__ import annotations

import os
from pathlib import Path

_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def parse_stat(text: str) -> tuple[int, float]:
    """(parent pid, utime + stime in seconds) from a /proc/<pid>/stat line. The command name is
    parenthesised and may itself hold spaces or parentheses, so fields are counted after the
    last ')'."""
    fields = text[text.rindex(")") + 2:].split()
    # After the name: state(3) ppid(4) ... utime(14) stime(15), numbered as in proc(5).
    ppid = int(fields[1])
    return ppid, (int(fields[11]) + int(fields[12])) / _TICKS


def _read(pid: int) -> tuple[int, float] | None:
    try:
        return parse_stat(Path(f"/proc/{pid}/stat").read_text())
    except (OSError, ValueError, IndexError):
        return None  # exited meanwhile, or not Linux


def available() -> bool:
    return _read(os.getpid()) is not None


def cpu_seconds(pid: int, tree: bool = True) -> float | None:
    """User + system CPU seconds used so far by `pid` and, with `tree`, its live descendants
    (servers such as vLLM run the engine in a child process). None if pid is gone or /proc is
    missing."""
    own = _read(pid)
    if own is None:
        return None
    total = own[1]
    if not tree:
        return total
    children: dict[int, list[tuple[int, float]]] = {}
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            info = _read(int(entry.name))
            if info is not None:
                children.setdefault(info[0], []).append((int(entry.name), info[1]))
    stack = [pid]
    while stack:
        for child, seconds in children.get(stack.pop(), ()):
            total += seconds
            stack.append(child)
    return total
