"""`python -m bench.serving.bare_app --server NAME --host H --port P`: a bare ASGI app (no
Starlette, no Prelude) served by one HTTP server, for `bench.serving.http_servers`.

The app does the least a completion endpoint must: reads the whole body, parses it with orjson,
and answers a completion-shaped JSON with its usage. What a server then costs per request is the
server's own share (parsing HTTP, the ASGI calls, writing), the floor under any app it serves."""
from __future__ import annotations

import argparse
import itertools
import sys
import time
from typing import Any, Callable, Sequence

import orjson

SERVERS = ("hypercorn", "uvicorn-h11", "uvicorn-httptools", "granian")
_ids = itertools.count()
_JSON = [(b"content-type", b"application/json")]


async def app(scope: dict, receive: Callable, send: Callable) -> None:
    if scope["type"] == "lifespan":
        while True:
            phase = (await receive())["type"]  # lifespan.startup, then lifespan.shutdown
            await send({"type": f"{phase}.complete"})
            if phase == "lifespan.shutdown":
                return
    if scope["type"] != "http":
        return
    if scope["path"] == "/health":
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"0")]})
        await send({"type": "http.response.body", "body": b""})
        return
    chunks = []
    more = True
    while more:
        message = await receive()
        if message["type"] != "http.request":
            return  # the client went away
        chunks.append(message.get("body", b""))
        more = message.get("more_body", False)
    request = orjson.loads(b"".join(chunks))
    prompt_tokens = len(request.get("prompt") or ())
    answer = orjson.dumps(_completion(request.get("model") or "bare", prompt_tokens))
    await send({"type": "http.response.start", "status": 200,
                "headers": [*_JSON, (b"content-length", str(len(answer)).encode())]})
    await send({"type": "http.response.body", "body": answer})


def _completion(model: str, prompt_tokens: int) -> dict[str, Any]:
    return {"id": f"cmpl-{next(_ids):08x}", "object": "text_completion", "created": int(time.time()),
            "model": model, "choices": [{"index": 0, "text": " yes", "logprobs": None, "finish_reason": "length",
                                         "stop_reason": None}],
            "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": 1, "total_tokens": prompt_tokens + 1}}


def serve(server: str, host: str, port: int) -> None:
    """Serves `app` until SIGINT, each server as it would serve Prelude: uvloop, no access log,
    HTTP/1.1."""
    import uvloop

    if server == "hypercorn":
        from hypercorn.asyncio import serve as hypercorn_serve
        from hypercorn.config import Config

        config = Config()
        config.bind = [f"{host}:{port}"]
        config.accesslog = None
        uvloop.run(hypercorn_serve(app, config))  # type: ignore[arg-type]
    elif server.startswith("uvicorn"):
        import uvicorn

        uvicorn.run(app, host=host, port=port, http=server.removeprefix("uvicorn-"), loop="uvloop",
                    access_log=False, log_config=None, proxy_headers=False, lifespan="on")
    elif server == "granian":
        from granian import Granian
        from granian.constants import HTTPModes, Interfaces, Loops

        Granian("bench.serving.bare_app:app", address=host, port=port, interface=Interfaces.ASGI, workers=1,
                loop=Loops.uvloop, http=HTTPModes.http1, log_access=False).serve()
    else:
        raise SystemExit(f"unknown server {server!r}; one of {', '.join(SERVERS)}")


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.serving.bare_app", description=__doc__)
    p.add_argument("--server", choices=SERVERS, required=True)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    args = p.parse_args(argv)
    try:
        serve(args.server, args.host, args.port)
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
