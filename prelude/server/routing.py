"""The router: a plain ASGI app mapping (path, method) to an endpoint with one dict lookup, and
rendering what an endpoint raises. It does for Prelude's fixed set of exact paths what
Starlette's application, middleware stack and router did, without their per-request layers
(two exception-handling wrappers, a regex match per route until one fits, a send wrapper each).

Endpoints take a Starlette Request and return a Starlette Response (or anything called like
one, such as streaming.EventStream). Unknown paths answer 404 and known paths with another
method 405 with Allow, both as OpenAI-style errors; a path that exists with or without a
trailing slash redirects there (307), as Starlette's router did."""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Awaitable, Callable

from starlette.datastructures import URL
from starlette.requests import ClientDisconnect, Request as HTTPRequest
from starlette.responses import RedirectResponse, Response
from starlette.types import Receive, Scope, Send

from prelude.server import access_log
from prelude.server.errors import APIError
from prelude.tokenizer.chat import TemplateCompileError

logger = logging.getLogger(__name__)

Endpoint = Callable[[HTTPRequest], Awaitable[Any]]  # returns an ASGI response callable


@dataclass(frozen=True, slots=True)
class Route:
    path: str
    endpoint: Endpoint
    methods: tuple[str, ...]  # GET implies HEAD


class Router:
    """Serves `routes`; `startup` and `shutdown` run on the ASGI lifespan's events. `not_found`
    answers a path no route names (its own 404 for a family of paths), or gives None."""

    def __init__(self, routes: list[Route], startup: Callable[[], Awaitable[None]],
                 shutdown: Callable[[], Awaitable[None]],
                 not_found: Callable[[str], Response | None] = lambda path: None):
        self.endpoints: dict[str, dict[str, Endpoint]] = {}
        for route in routes:
            methods = {*route.methods, "HEAD"} if "GET" in route.methods else set(route.methods)
            self.endpoints.setdefault(route.path, {}).update(dict.fromkeys(methods, route.endpoint))
        self.startup = startup
        self.shutdown = shutdown
        self.not_found = not_found

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope["type"]
        if kind == "http":
            by_method = self.endpoints.get(scope["path"])
            endpoint = by_method.get(scope["method"]) if by_method is not None else None
            if endpoint is None:
                await self._unrouted(scope, by_method)(scope, receive, send)
                return
            http = HTTPRequest(scope, receive)
            try:
                response = await endpoint(http)
            except Exception as exc:  # rendered here: the response has not started
                response = _error_response(http, exc)
            await response(scope, receive, send)
        elif kind == "lifespan":
            await self._lifespan(receive, send)
        elif kind == "websocket":
            await send({"type": "websocket.close", "code": 1000})

    def _unrouted(self, scope: Scope, by_method: dict[str, Endpoint] | None) -> Response:
        if by_method is not None:
            return APIError(405, "Method Not Allowed", headers={"Allow": ", ".join(sorted(by_method))}).response()
        path: str = scope["path"]
        other = path.rstrip("/") if path.endswith("/") else path + "/"
        if path != "/" and other in self.endpoints:
            return RedirectResponse(url=str(URL(scope={**scope, "path": other})))
        return self.not_found(path) or APIError(404, "Not Found").response()

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            phase = (await receive())["type"]  # lifespan.startup, then lifespan.shutdown
            try:
                await (self.startup() if phase == "lifespan.startup" else self.shutdown())
            except BaseException as exc:
                await send({"type": f"{phase}.failed", "message": repr(exc)})
                raise
            await send({"type": f"{phase}.complete"})
            if phase == "lifespan.shutdown":
                return


def _error_response(http: HTTPRequest, exc: Exception) -> Response:
    if isinstance(exc, APIError):
        return exc.response()
    if isinstance(exc, ClientDisconnect):
        # Nobody reads this response; the request's engine work was already aborted.
        logged = access_log.entry(http)
        if logged is not None:
            logged.error = "client went away"
        else:  # --disable-log-requests: no line per request
            logger.debug("client went away: %s %s", http.method, http.url.path)
        return Response(status_code=499)
    if isinstance(exc, TemplateCompileError):  # the served checkpoint's fault, whichever endpoint rendered it
        logger.error("%s %s: %s", http.method, http.url.path, exc)
        return APIError(500, str(exc)).response()
    logger.error("unhandled error", exc_info=exc)
    return APIError(500, f"internal error: {type(exc).__name__}").response()
