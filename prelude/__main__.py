"""`python -m prelude --port 8000` (or `prelude ...`): serve a model (the embedded demo model by
default). Startup problems an operator can fix end the process with one line on stderr naming
the problem and the fix, and exit code 2; the traceback only with --log-level debug."""
from __future__ import annotations

import asyncio
import logging
import os
import sys
import time

from typing import Any, Callable, Coroutine

from prelude.cli import parse_args
from prelude.logs import configure

EXIT_STARTUP_ERROR = 2  # as argparse's for a bad flag: the command line or its inputs need fixing


def _openmp_spin() -> None:
    """How long torch's OpenMP workers, which also run the native kernels (kernels/cpu/parallel.hpp),
    spin for the next parallel piece before sleeping: read once, when torch loads, so it is set
    before. libgomp's default (300,000 spins, ~8 ms here) held a core the event loop needed after
    every step; sleeping at once (OMP_WAIT_POLICY=PASSIVE) woke a thread at every op, 32+ a step.
    5,000 spins (~0.13 ms here) cover the gap between a layer's ops, not the gap between steps
    (README "CPU threads" has the measurements). A wait policy or spin count the user set stays."""
    if "OMP_WAIT_POLICY" not in os.environ:
        os.environ.setdefault("GOMP_SPINCOUNT", "5000")


def _event_loop_runner() -> Callable[[Coroutine[Any, Any, None]], None]:
    """uvloop where it exists: its C event loop and transports take about a tenth off the
    server's CPU per request (bench.serving.cpu_cost); asyncio's own loop elsewhere (Windows)."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run
    return uvloop.run


def main(argv: list[str] | None = None) -> int:
    started = time.perf_counter()
    config = parse_args(argv)
    configure(config.log_level, config.log_format)
    _openmp_spin()
    from prelude.assembly import serve
    from prelude.preflight import StartupError

    try:
        _event_loop_runner()(serve(config, started))
    except StartupError as exc:
        if config.log_level == "debug":
            logging.getLogger("prelude").exception("startup failed")
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_STARTUP_ERROR
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
