"""Overload refusals: the one 503 a refused request gets, and the gate that gives it before the
request's body is read.

Under overload the event loop is the scarce thing: every request that reaches an endpoint has
its body read, parsed and tokenized on it before the engine can say no, so with a thousand
clients a refusal waited seconds behind the work of requests that were refused too. While the
engine's waiting queue is at its bound it would refuse any request, whatever its size, so the
gate asks it first (Engine.refuse_unseen) and answers from the headers alone. Once the queue has
room, requests pass and the engine decides on each one's rows together (Engine.submit_all), as
before: the gate never refuses a request that could have been admitted.

The gate is also the one place a shutdown's drain refuses: a request it let in before the drain
began is still admitted, and the drain waits for it (Engine.enter and leave).

The refusal is answered without reading the body (http_server.ReadBeforeAnswering reads a
small one first where hypercorn needs it).
"""
from __future__ import annotations

import asyncio
import contextlib
from typing import Awaitable, Collection

from starlette.types import ASGIApp, Receive, Scope, Send

from prelude.engine.engine import Engine
from prelude.engine.output import Overloaded, ShutDown
from prelude.server.errors import APIError
from prelude.server.streaming import engine_error


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

    def __call__(self, scope: Scope, receive: Receive, send: Send) -> Awaitable[None]:
        # Only picks what runs: returns its awaitable (why: app.BearerAuth).
        if scope["type"] == "http" and (scope["method"], scope["path"]) in self.routes:
            refusal = self.engine.refuse_unseen()
            if refusal is not None:
                return self._refuse(refusal, scope, receive, send)
            return self._let_in(scope, receive, send)
        return self.app(scope, receive, send)

    async def _let_in(self, scope: Scope, receive: Receive, send: Send) -> None:
        # Counted in until answered: a SIGTERM that comes while its body is read or tokenized
        # lets it finish (the drain waits for it) instead of refusing work it had taken in.
        handler = asyncio.current_task()
        assert handler is not None
        self.engine.enter(handler)
        try:
            await self.app(scope, receive, send)
        except asyncio.CancelledError:
            if not self.engine.closed:
                raise
            # The shutdown timeout passed before it reached the engine (its body still arriving):
            # end_all ended it, with the 503 the engine's requests get. Left to the HTTP server's
            # own shutdown it was a 500 and a logged traceback.
            refusal = engine_error(ShutDown("the server shut down before this request's body arrived"))
            with contextlib.suppress(Exception):
                await refusal.response()(scope, receive, send)
        finally:
            self.engine.leave(handler)

    def _refuse(self, refusal: Overloaded, scope: Scope, receive: Receive, send: Send) -> Awaitable[None]:
        return overloaded_error(refusal, self.engine.draining).response()(scope, receive, send)

