"""CPU time of a server process (and its descendants) from the kernel's own accounting, which
includes every thread (tokenizer pool, step worker): no extra dependency.

A process's CPU seconds are read from its POSIX CPU clock, which Linux lets any process name by
the pid (`clock_gettime` of `(~pid << 3) | 2`: CPUCLOCK_SCHED of the whole thread group, exited
threads included): the scheduler's runtime in nanoseconds. `/proc/<pid>/stat`'s utime + stime is
the same runtime truncated to 10 ms ticks, up to 5% of a 0.2 s measurement (600 one-token requests
at c=64), and is read only where the clock is refused."""
from __future__ import annotations

import os
import time
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


def process_clock_seconds(pid: int) -> float | None:
    """CPU seconds of `pid`'s thread group from its process CPU clock; None where the clock is
    refused (the pid is gone, another OS)."""
    try:
        return time.clock_gettime((~pid << 3) | 2)  # CPUCLOCK_PROCESS | CPUCLOCK_SCHED
    except (OSError, AttributeError, OverflowError):
        return None


def _seconds(pid: int, from_stat: float) -> float:
    exact = process_clock_seconds(pid)
    return from_stat if exact is None else exact


def available() -> bool:
    return _read(os.getpid()) is not None


def cpu_seconds(pid: int, tree: bool = True) -> float | None:
    """User + system CPU seconds used so far by `pid` and, with `tree`, its live descendants
    (servers such as vLLM run the engine in a child process). None if pid is gone or /proc is
    missing."""
    own = _read(pid)
    if own is None:
        return None
    total = _seconds(pid, own[1])
    if not tree:
        return total
    return total + sum(_seconds(child, seconds) for child, seconds in _descendants(pid))


def _descendants(pid: int) -> list[tuple[int, float]]:
    """(pid, CPU seconds) of every live descendant of `pid`, from one scan of /proc."""
    children: dict[int, list[tuple[int, float]]] = {}
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            info = _read(int(entry.name))
            if info is not None:
                children.setdefault(info[0], []).append((int(entry.name), info[1]))
    found: list[tuple[int, float]] = []
    stack = [pid]
    while stack:
        for child in children.get(stack.pop(), ()):
            found.append(child)
            stack.append(child[0])
    return found


def rss_bytes(pid: int, tree: bool = True) -> int | None:
    """Resident memory of `pid` (and, with `tree`, its live descendants: vLLM's engine core is a
    child process) from VmRSS in /proc/<pid>/status. Pages shared between the processes count
    once per process, as `ps` shows them. None if pid is gone or /proc is missing."""
    own = _vm_rss(pid)
    if own is None:
        return None
    if not tree:
        return own
    return own + sum(_vm_rss(child) or 0 for child, _ in _descendants(pid))


def peak_rss_bytes(pid: int) -> int | None:
    """The sum over `pid` and its live descendants of each one's own peak resident memory
    (VmHWM): an upper bound of the tree's peak, as the processes need not peak at once; a child
    that has already exited is not counted. None if pid is gone or /proc is missing."""
    own = _vm_rss(pid, "VmHWM:")
    if own is None:
        return None
    return own + sum(_vm_rss(child, "VmHWM:") or 0 for child, _ in _descendants(pid))


def _vm_rss(pid: int, field: str = "VmRSS:") -> int | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(field):
                return int(line.split()[1]) * 1024  # reported in kB
    except (OSError, ValueError, IndexError):
        pass
    return None


def machine_busy_seconds() -> float | None:
    """CPU seconds every core has spent busy (not idle or waiting on I/O) since boot, from the
    first line of /proc/stat; with a server's and the client's own CPU it tells how much other
    work shared the machine during a run. None without /proc."""
    try:
        fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()
    except OSError:
        return None
    # cpu user nice system idle iowait irq softirq steal ...: everything but idle and iowait.
    ticks = [int(v) for v in fields[1:9]]
    return (sum(ticks) - ticks[3] - ticks[4]) / _TICKS
