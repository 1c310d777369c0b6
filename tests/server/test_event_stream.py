"""An SSE response at the ASGI boundary: the event that ends in [DONE] goes out as the response's
last body message (one write: the usage chunk, [DONE] and the chunked body's end), not followed
by an empty one; a stream without [DONE] still ends with an empty last body."""
from __future__ import annotations

import asyncio

from prelude.server.streaming import SSE_DONE, EventStream


def _messages(events: list[bytes]) -> tuple[list[dict], int]:
    sent: list[dict] = []
    closed = 0

    async def produce():
        for event in events:
            yield event

    async def receive() -> dict:
        await asyncio.Event().wait()  # the client stays
        return {"type": "http.disconnect"}

    async def send(message: dict) -> None:
        sent.append(message)

    def on_close() -> None:
        nonlocal closed
        closed += 1

    asyncio.run(EventStream(produce(), on_close)({"type": "http"}, receive, send))
    return sent, closed


def test_the_done_event_ends_the_response_in_its_own_body_message():
    usage_and_done = b'data: {"usage": {}}\n\n' + SSE_DONE
    sent, closed = _messages([b"data: 1\n\n", b"data: 2\n\n", usage_and_done])
    assert sent[0]["type"] == "http.response.start" and sent[0]["status"] == 200
    assert [(m["body"], m["more_body"]) for m in sent[1:]] == [
        (b"data: 1\n\n", True), (b"data: 2\n\n", True), (usage_and_done, False)]
    assert closed == 1


def test_a_stream_without_done_still_ends_with_an_empty_last_body():
    sent, closed = _messages([b"data: 1\n\n"])
    assert [(m["body"], m["more_body"]) for m in sent[1:]] == [(b"data: 1\n\n", True), (b"", False)]
    assert closed == 1


def _stalled_stream(closed: list[str]):
    """One event, then nothing more for now (the engine has no token yet)."""
    async def produce():
        try:
            yield b"data: 1\n\n"
            await asyncio.Event().wait()
            yield b"data: never\n\n"
        finally:
            closed.append("events")
    return produce()


def test_a_client_going_away_ends_the_stream_and_the_task_goes_on():
    closed: list[str] = []
    gone = asyncio.Event()

    async def receive() -> dict:
        await gone.wait()
        return {"type": "http.disconnect"}

    async def send(message: dict) -> None:
        if message.get("body") == b"data: 1\n\n":
            gone.set()

    async def respond() -> str:
        await EventStream(_stalled_stream(closed), lambda: closed.append("engine"))({"type": "http"}, receive, send)
        await asyncio.sleep(0)  # not left cancelled: the server's task goes on after the response
        return "went on"

    assert asyncio.run(respond()) == "went on"
    assert closed == ["events", "engine"]


def test_a_cancel_from_outside_still_cancels():
    closed: list[str] = []

    async def receive() -> dict:
        await asyncio.Event().wait()  # the client stays
        return {"type": "http.disconnect"}

    async def send(message: dict) -> None:
        pass

    async def respond() -> None:
        task = asyncio.create_task(
            EventStream(_stalled_stream(closed), lambda: closed.append("engine"))({"type": "http"}, receive, send))
        await asyncio.sleep(0.01)
        task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            closed.append("cancelled")

    asyncio.run(respond())
    assert closed == ["events", "engine", "cancelled"]
