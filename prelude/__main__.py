"""`python -m prelude --port 8000`: serve a model (the embedded demo model by default)."""
from __future__ import annotations

import asyncio
import logging
import sys

from typing import Any, Callable, Coroutine

from prelude.cli import parse_args


def _event_loop_runner() -> Callable[[Coroutine[Any, Any, None]], None]:
    """uvloop where it exists: its C event loop and transports take about a tenth off the
    server's CPU per request (bench.serving.cpu_cost); asyncio's own loop elsewhere (Windows)."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run
    return uvloop.run


def main(argv: list[str] | None = None) -> int:
    config = parse_args(argv)
    logging.basicConfig(level=config.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from prelude.model.config import UnsupportedModel
    from prelude.assembly import serve

    try:
        _event_loop_runner()(serve(config))
    except UnsupportedModel as exc:
        logging.getLogger("prelude").error("%s", exc)
        return 2
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
