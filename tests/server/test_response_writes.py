"""uvicorn writes a response's head and its body in two calls; the server's transport sends them
as one write (one system call, one TCP segment), holding a head no longer than the loop's
current pass: a stream's head still goes out before its first event is ready."""
from __future__ import annotations

import asyncio

from prelude.server.http_server import HeadWithBody

HEAD = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n"


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


def test_a_whole_answer_is_one_write():
    async def main():
        sock = _Transport()
        transport = HeadWithBody(sock, asyncio.get_running_loop())
        transport.write(HEAD)
        transport.write(b"{}")
        await _pass()
        assert sock.sent == [HEAD + b"{}"]

    asyncio.run(main())


def test_a_streams_head_goes_out_within_the_pass_and_its_events_as_they_come():
    async def main():
        sock = _Transport()
        transport = HeadWithBody(sock, asyncio.get_running_loop())
        transport.write(HEAD.replace(b"content-length: 2", b"transfer-encoding: chunked"))
        await _pass()
        assert len(sock.sent) == 1 and sock.sent[0].startswith(b"HTTP/1.1 200")
        transport.write(b"5\r\ndata:\r\n")
        transport.write(b"0\r\n\r\n")
        assert sock.sent[1:] == [b"5\r\ndata:\r\n", b"0\r\n\r\n"]  # each written at once

    asyncio.run(main())


def test_each_response_on_a_kept_alive_connection_is_one_write():
    async def main():
        sock = _Transport()
        transport = HeadWithBody(sock, asyncio.get_running_loop())
        for body in (b"{}", b"[]"):
            transport.write(HEAD)
            transport.write(body)
            transport.expect_head()  # what the protocol says once a response is complete
        transport.write(b"HTTP/1.1 400 Bad Request\r\ncontent-length: 2\r\n\r\n{}")  # written whole
        await _pass()
        assert sock.sent == [HEAD + b"{}", HEAD + b"[]", b"HTTP/1.1 400 Bad Request\r\ncontent-length: 2\r\n\r\n{}"]

    asyncio.run(main())


def test_closing_sends_a_held_head_first():
    async def main():
        sock = _Transport()
        transport = HeadWithBody(sock, asyncio.get_running_loop())
        transport.write(HEAD.replace(b"200 OK", b"100 Continue"))
        transport.close()
        assert sock.sent == [HEAD.replace(b"200 OK", b"100 Continue")] and sock.closed
        await _pass()  # the scheduled flush finds nothing held
        assert len(sock.sent) == 1

    asyncio.run(main())
