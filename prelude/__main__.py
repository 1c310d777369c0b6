"""`python -m prelude --port 8000`: serve a model (the embedded demo model by default)."""
from __future__ import annotations

import asyncio
import logging
import sys

from prelude.cli import parse_args


def main(argv: list[str] | None = None) -> int:
    config = parse_args(argv)
    logging.basicConfig(level=config.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from prelude.model.config import UnsupportedModel
    from prelude.assembly import serve

    try:
        import uvloop

        uvloop.run(serve(config))
    except UnsupportedModel as exc:
        logging.getLogger("prelude").error("%s", exc)
        return 2
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
