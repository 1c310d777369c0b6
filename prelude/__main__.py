"""`python -m prelude --port 8000` (or `prelude ...`): serve a model (the embedded demo model by
default). Startup problems an operator can fix end the process with one line on stderr naming
the problem and the fix, and exit code 2; the traceback only with --log-level debug."""
from __future__ import annotations

import asyncio
import gc
import logging
import os
import sys
import time

from typing import Any, Callable, Coroutine

from prelude.app.cli import parse_args
from prelude.app.logs import configure

EXIT_STARTUP_ERROR = 2  # as argparse's for a bad flag: the command line or its inputs need fixing


def _library_environment() -> None:
    """Settings torch and numpy read once, when they load, so they are set before; a value the
    user set stays.

    - Torch's OpenMP threads sleep when an op ends instead of spinning for the next one. Spinning,
      they hold the cores that the event loop, the native kernels' thread team and the other
      compute thread need next, which widens the TTFT tail (`python -m
      bench.serving.side_by_side`).
    - numpy's OpenBLAS computes on the calling thread. The products it does here are small (a
      few label or allowed ids' rows of the LM head); on a thread per core, which then spins, a
      decode step of 16 rows allowed 1,000 ids each took 30.3 ms on checkpoint B, 18.0 on one.
    - Torch does not look for out-of-tree device backends (Ascend, HPU, ...), which Prelude does not
      serve on: the look reads every installed distribution's entry points, ~5 ms of each start
      (`torch._import_device_backends()` timed in process)."""
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    os.environ.setdefault("TORCH_DEVICE_BACKEND_AUTOLOAD", "0")


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
    # No cyclic garbage collection while the process starts: the imports, model and tokenizer
    # make about 180K long-lived objects, which the collector rescanned several times on the way
    # (about 0.1 s). It resumes, tuned for serving, when the engine is warm
    # (host_tuning.freeze_startup_objects).
    gc.disable()
    config = parse_args(argv)
    configure(config.log_level, config.log_format)
    _library_environment()
    from prelude.app.assembly import serve
    from prelude.app.preflight import StartupError

    try:
        _event_loop_runner()(serve(config, started))
    except StartupError as exc:
        if config.log_level == "debug":
            logging.getLogger("prelude").exception("startup failed")
        if config.log_format == "json":  # one JSON line like every other, for the log pipeline that reads them
            logging.getLogger("prelude").error("startup failed: %s", exc)
            logging.shutdown()
        else:
            print(f"error: {exc}", file=sys.stderr)
        return EXIT_STARTUP_ERROR
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
