"""Overload refusals: the one 503 a refused request gets, and the gate that gives it before the
request's body is read.

Under overload the event loop is the scarce thing: every request that reaches an endpoint has
its body read, parsed and tokenized on it before the engine can say no, so with a thousand
clients a refusal waited seconds behind the work of requests that were refused too. While the
engine's waiting queue is at its bound it would refuse any request, whatever its size, so the
gate asks it first (Engine.refuse_unseen) and answers from the headers alone. Once the queue has
room, requests pass and the engine decides on each one's rows together (Engine.submit_all), as
before: the gate never refuses a request that could have been admitted."""
from __future__ import annotations

from typing import Collection

from starlette.types import ASGIApp, Receive, Scope, Send

from prelude.engine.engine import Engine
from prelude.engine.output import Overloaded
from prelude.server.errors import APIError


def overloaded_error(exc: Overloaded, draining: bool) -> APIError:
    """503 `overloaded` with Retry-After; while draining also Connection: close, since this
    server is going away and its clients should reconnect elsewhere."""
    headers = {"Retry-After": "1"}
    if draining:
        headers["Connection"] = "close"
    return APIError(503, str(exc), code="overloaded", headers=headers)


class RefuseWhenFull:
    """Plain ASGI, in front of the routes: a request to one of `routes` ((method, path) pairs:
    those that queue engine work) is refused without reading its body while the engine admits nothing. Placed inside
    auth, so a wrong key still gets 401, and inside the access log, so refusals are logged."""

    def __init__(self, app: ASGIApp, engine: Engine, routes: Collection[tuple[str, str]]):
        self.app = app
        self.engine = engine
        self.routes = frozenset(routes)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and (scope["method"], scope["path"]) in self.routes:
            refusal = self.engine.refuse_unseen()
            if refusal is not None:
                # The unread body is the server's to discard: hypercorn drains it before the
                # connection's next request, or closes the connection.
                await overloaded_error(refusal, self.engine.draining).response()(scope, receive, send)
                return
        await self.app(scope, receive, send)
