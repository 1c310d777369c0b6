"""The HTTP server under the ASGI app (--http-server): uvicorn with httptools by default, or
hypercorn. Either serves on the Listener bound before the model loaded, stops when the caller's
shutdown trigger fires (never on a signal of its own: the caller drains first), and leaves the
access log to Prelude (server/access_log.py).

uvicorn with httptools is the default because it costs the least CPU per request of the servers
that keep what Prelude relies on: keep-alive with --keep-alive-timeout, --backlog, --uds,
pipelined requests answered in order, a client's disconnect seen by `receive()`, and a response
sent before its request's body was read (bench.serving.http_servers measures the servers)."""
from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from typing import Any, Awaitable, Callable, Iterator

import orjson
import uvicorn
from starlette.types import ASGIApp, Message, Receive, Scope, Send
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol, RequestResponseCycle

from prelude.contract.config import Config
from prelude.server.listen import Listener
from prelude.server.protocol import scope_header

ShutdownTrigger = Callable[[], Awaitable[Any]]

# Seconds connections get to finish their responses once the trigger fired. The caller has
# already let the requests in flight end (--shutdown-timeout): what remains is writing them out.
GRACEFUL_S = 3.0


async def serve(app: ASGIApp, listener: Listener, config: Config, shutdown_trigger: ShutdownTrigger) -> None:
    """Serves `app` on `listener` with config.http_server until `shutdown_trigger()` returns, then
    closes the listener, lets open responses finish, and runs the app's lifespan shutdown."""
    if config.http_server == "hypercorn":
        await _serve_hypercorn(app, listener, config, shutdown_trigger)
    else:
        await _serve_uvicorn(app, listener, config, shutdown_trigger)


async def _serve_uvicorn(app: ASGIApp, listener: Listener, config: Config, shutdown_trigger: ShutdownTrigger) -> None:
    level = logging.getLevelName(config.log_level.upper())
    server = _UvicornServer(uvicorn.Config(
        app, http=_HttpToolsProtocol, ws="none", lifespan="on", interface="asgi3",
        log_config=None, access_log=False,  # Prelude's access log and logging setup stand
        # Its startup and shutdown lines at info would repeat the banner's news (debug shows them).
        log_level=level if level == logging.DEBUG else max(level, logging.WARNING),
        proxy_headers=False,  # no X-Forwarded-* rewriting: Prelude logs and trusts no client address
        server_header=False,  # no `server: uvicorn` on every response (two header checks and its bytes)
        backlog=config.backlog,
        timeout_keep_alive=config.keep_alive_timeout,  # type: ignore[arg-type]  # annotated int, used as seconds
        timeout_graceful_shutdown=GRACEFUL_S,  # type: ignore[arg-type]
    ))
    sock = socket.socket(fileno=listener.fd)  # family and type read from the descriptor

    async def exit_on_trigger() -> None:
        await shutdown_trigger()
        server.should_exit = True  # seen by uvicorn's main loop within its 0.1 s tick

    trigger = asyncio.create_task(exit_on_trigger())
    try:
        await server.serve(sockets=[sock])
    finally:
        trigger.cancel()


class _UvicornServer(uvicorn.Server):
    """uvicorn's Server without its signal handlers: `serve` replaces the process's SIGINT and
    SIGTERM handlers, and would stop the server at once instead of letting the caller's handler
    drain first."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


# The most bytes a request's line and headers may take: 431 past it, as hypercorn and nginx
# answer (at 16 and 32 KiB). uvicorn with httptools set no bound: a head that never ended
# was buffered whole, 100 MB a connection before the key was checked.
MAX_HEAD_BYTES = 64 * 1024
_HEAD_TOO_LARGE = orjson.dumps({"error": {
    "message": f"the request's line and headers exceed {MAX_HEAD_BYTES} bytes", "type": "invalid_request_error",
    "param": None, "code": "request_header_fields_too_large"}})


_base_data_received = HttpToolsProtocol.data_received
_base_start_asgi_task = HttpToolsProtocol._start_asgi_task


class _HttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol on a transport that sends a response's head with its body,
    with a bound on a request's head and --keep-alive-timeout for a connection whose request
    has not begun or whose head stopped arriving (uvicorn timed only idle connections between
    requests: a silent or stalled one stayed open for good)."""

    _head_scope: object = None  # the request whose head _head_bytes counts
    _head_bytes = 0
    _running: RequestResponseCycle | None = None  # the request whose app runs (pipelined ones wait)
    _refuse_after = False  # a head grew too long behind a running request: its 431 follows that answer

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(HeadWithBody(transport))  # type: ignore[arg-type]
        self._time_out_idle()

    def data_received(self, data: bytes) -> None:
        _base_data_received(self, data)  # not super(): a request pays this call once or twice
        cycle, scope = self.cycle, self.scope
        if scope is None or (cycle is not None and cycle.scope is scope) or self.transport.is_closing():
            return  # the usual case: the head came whole (its request's cycle began)
        if scope is not self._head_scope:
            # The read that began this head may have ended the request before it (its body's
            # tail, counted as head, made a pipelined request behind a 70 KB body a 431): what
            # of the head came is what the parser holds of it.
            self._head_scope = scope
            self._head_bytes = len(self.url) + sum(len(name) + len(value) + 4 for name, value in self.headers)
        else:
            self._head_bytes += len(data)
        running = self._running is not None and not self._running.response_complete
        if self._head_bytes > MAX_HEAD_BYTES:
            if running:  # its 431 follows the running request's answer, in order, as RFC 9112 has it
                self.flow.pause_reading()
                self._refuse_after = True
            else:
                self._refuse_head()
            return
        if not running:  # else the running answer's end arms it: a stalled head cut a live stream
            self._time_out_idle()

    def _refuse_head(self) -> None:
        self.transport.write(b"HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-type: application/json\r\n"
                             b"content-length: %d\r\nconnection: close\r\n\r\n%s"
                             % (len(_HEAD_TOO_LARGE), _HEAD_TOO_LARGE))
        self.transport.close()

    def _time_out_idle(self) -> None:
        """Closes the connection unless more bytes come within the keep-alive timeout (the
        next data_received cancels it, as uvicorn does after a response)."""
        self.timeout_keep_alive_task = self.loop.call_later(self.timeout_keep_alive, self.timeout_keep_alive_handler)

    def on_response_complete(self) -> None:
        self.transport.expect_head()  # type: ignore[attr-defined]  # the next response (pipelined too)
        super().on_response_complete()
        if self._refuse_after and (self._running is None or self._running.response_complete):
            self._refuse_head()  # the head that grew too long behind the answers before it

    def _start_asgi_task(self, cycle: RequestResponseCycle, app: Any) -> None:
        self._running = cycle
        _base_start_asgi_task(self, cycle, app)

    def connection_lost(self, exc: Exception | None) -> None:
        # uvicorn tells only the newest request its client left: with a request pipelined behind
        # it, the one running went on to its end (a whole generation) and then wrote to the
        # closed transport (an ERROR with a traceback).
        running = self._running
        if running is not None and running is not self.cycle and not running.response_complete:
            running.disconnected = True
            running.message_event.set()
        super().connection_lost(exc)


class HeadWithBody:
    """A connection's transport that holds a whole answer's head until its body: uvicorn writes
    the head (at http.response.start) and the body (at http.response.body) in two calls, two
    system calls and two TCP segments for every JSON answer, each some 5 us of the server's CPU
    on loopback. A head with a Content-Length is held until the next bytes written (its body,
    however late: a client can do nothing with the head alone), the response's end (a HEAD
    request's answer has no body) or a close; any other first write (a stream's head, a refusal
    written whole) goes out at once. Past a response's first bytes, `write` is the transport's
    own (a stream's events pay no Python call) until the protocol says the next response begins
    (`expect_head`). Everything else is the transport's."""

    def __init__(self, transport: asyncio.Transport):
        self._transport = transport
        self._held: bytes | None = None
        self.write: Callable[[bytes], None] = self._first
        # What a request calls, bound here (no lookup through __getattr__ per call).
        self.get_extra_info = transport.get_extra_info
        self.is_closing = transport.is_closing
        self.pause_reading = transport.pause_reading
        self.resume_reading = transport.resume_reading

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)

    def expect_head(self) -> None:
        """The next bytes written begin a response. A head still held (a HEAD request's answer,
        which has no body to write) goes out now, with its response."""
        self._flush()
        self.write = self._first

    def _first(self, data: bytes) -> None:
        """A response's first bytes: a whole answer's head is held, anything else written."""
        if data.endswith(b"\r\n\r\n") and b"\r\ncontent-length: " in data and data.startswith(b"HTTP/1.1 "):
            self._held = data
            self.write = self._after_head
        else:
            self.write = self._transport.write
            self._transport.write(data)

    def _after_head(self, data: bytes) -> None:
        head, self._held = self._held, None
        assert head is not None
        self.write = self._transport.write
        self._transport.write(head + data)

    def _flush(self) -> None:
        if self._held is not None:
            head, self._held = self._held, None
            self.write = self._transport.write
            if not self._transport.is_closing():
                self._transport.write(head)

    def close(self) -> None:
        self._flush()
        self._transport.close()


async def _serve_hypercorn(app: ASGIApp, listener: Listener, config: Config,
                           shutdown_trigger: ShutdownTrigger) -> None:
    from hypercorn.asyncio import serve as hypercorn_serve
    from hypercorn.config import Config as HypercornConfig

    hc = HypercornConfig()
    hc.bind = [f"fd://{listener.fd}"]
    hc.accesslog = None
    hc.errorlog = logging.getLogger("hypercorn.error")
    hc.loglevel = config.log_level.upper()
    hc.graceful_timeout = GRACEFUL_S
    hc.keep_alive_timeout = config.keep_alive_timeout
    hc.backlog = config.backlog
    hc.include_server_header = False  # as on uvicorn
    # hypercorn spells the ASGI callable with its own TypedDict scopes and events; Starlette's
    # ASGIApp takes plain MutableMappings. Same protocol, two incompatible spellings.
    await hypercorn_serve(ReadBeforeAnswering(app), hc, shutdown_trigger=shutdown_trigger)  # type: ignore[arg-type]


# hypercorn closes a connection whose request body had not all arrived when its answer ended, so
# an answer given without reading the body (a 503 refusal, a 401, 404 or 405) closed a client's
# kept-alive connection under it, or not, by how the client's two writes (head, then body) raced
# the answer: a pooled client's next request on it failed with a read error instead of getting
# its own answer. A body this small (by its Content-Length) is read and dropped before such an
# answer, as uvicorn does by itself, for DRAIN_S at most (a body that stopped coming held the
# answer for good); a larger or unsized one is left (hypercorn closes).
DRAIN_BYTES = 1 << 16
DRAIN_S = 1.0


class ReadBeforeAnswering:
    def __init__(self, app: ASGIApp):
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        length = scope_header(scope, b"content-length") if scope["type"] == "http" else None
        if length is None or not length.isdigit() or int(length) > DRAIN_BYTES:
            await self.app(scope, receive, send)
            return
        read = False

        async def receive_noted() -> Message:
            nonlocal read
            message = await receive()
            read = read or message["type"] != "http.request" or not message.get("more_body", False)
            return message

        async def drain() -> None:
            while not read:
                await receive_noted()

        async def send_once_read(message: Message) -> None:
            if not read and message["type"] == "http.response.start":
                with contextlib.suppress(TimeoutError):  # a body that stopped coming is not waited for
                    await asyncio.wait_for(drain(), DRAIN_S)
            await send(message)

        await self.app(scope, receive_noted, send_once_read)
