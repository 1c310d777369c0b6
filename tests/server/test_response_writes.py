"""uvicorn writes a response's head and its body in two calls; the server's transport sends a
whole answer's as one write (one system call, one TCP segment), holding its head until its body,
its response's end or a close. A stream's head and events go out as they are written."""
from __future__ import annotations

import asyncio
from typing import Awaitable, Callable

from prelude.server.http_server import HeadWithBody

HEAD = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n"
STREAM_HEAD = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n"


class _Transport(asyncio.Transport):
    """What a socket's transport does with writes, recorded: each write() would be a send()."""

    def __init__(self) -> None:
        super().__init__()
        self.sent: list[bytes] = []
        self.closed = False

    def write(self, data) -> None:
        assert not self.closed, "written after close"
        self.sent.append(bytes(data))

    def close(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed


async def _pass() -> None:
    """Lets the loop finish its current pass."""
    await asyncio.sleep(0)
    await asyncio.sleep(0)


def _sent(scenario: Callable[[HeadWithBody, _Transport], Awaitable[None]]) -> list[bytes]:
    """The sends made while `scenario` writes through the transport, and in the loop pass after."""
    sock = _Transport()

    async def main() -> None:
        await scenario(HeadWithBody(sock), sock)
        await _pass()

    asyncio.run(main())
    return sock.sent


def test_a_whole_answer_is_one_write():
    async def answer(transport: HeadWithBody, _: _Transport) -> None:
        transport.write(HEAD)
        transport.write(b"{}")

    assert _sent(answer) == [HEAD + b"{}"]


def test_a_streams_head_and_events_go_out_as_written():
    async def stream(transport: HeadWithBody, sock: _Transport) -> None:
        transport.write(STREAM_HEAD)
        assert sock.sent == [STREAM_HEAD]
        transport.write(b"5\r\ndata:\r\n")
        assert sock.sent[1:] == [b"5\r\ndata:\r\n"]

    assert _sent(stream) == [STREAM_HEAD, b"5\r\ndata:\r\n"]


def test_a_whole_answers_head_waits_for_a_late_body():
    async def late_body(transport: HeadWithBody, sock: _Transport) -> None:
        transport.write(HEAD)
        await _pass()
        assert sock.sent == []  # a client can do nothing with the head alone
        transport.write(b"{}")

    assert _sent(late_body) == [HEAD + b"{}"]


def test_each_response_on_a_kept_alive_connection_is_one_write():
    refusal = b"HTTP/1.1 400 Bad Request\r\ncontent-length: 2\r\n\r\n{}"

    async def answers(transport: HeadWithBody, _: _Transport) -> None:
        for body in (b"{}", b"[]"):
            transport.write(HEAD)
            transport.write(body)
            transport.expect_head()  # what the protocol says once a response is complete
        transport.write(refusal)  # written whole

    assert _sent(answers) == [HEAD + b"{}", HEAD + b"[]", refusal]


def test_a_head_requests_answer_goes_out_with_its_response_and_the_next_answer_is_one_write():
    async def head_then_get(transport: HeadWithBody, sock: _Transport) -> None:
        transport.write(HEAD)  # a HEAD request's answer: uvicorn writes no body for it
        transport.expect_head()
        assert sock.sent == [HEAD]  # at the response's end
        transport.write(HEAD)
        transport.write(b"{}")

    assert _sent(head_then_get) == [HEAD, HEAD + b"{}"]


def test_closing_sends_a_held_head_first():
    async def close(transport: HeadWithBody, sock: _Transport) -> None:
        transport.write(HEAD)
        transport.close()
        assert sock.closed

    assert _sent(close) == [HEAD]
