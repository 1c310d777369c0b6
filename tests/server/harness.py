"""A real Prelude server on a free loopback port, run in a background thread of the test process
(the configured --http-server, real HTTP; sharing the process lets tests check engine invariants
directly)."""
from __future__ import annotations

import asyncio
import threading
import time
from dataclasses import replace

import httpx

from prelude.app.assembly import build
from prelude.contract.config import Config
from prelude.server.app import create_app, serve_app
from prelude.server.listen import bind_tcp


class ServerThread:
    def __init__(self, config: Config, started_at: str = "/ready"):
        """`started_at`: the probe that must answer 200 before start() returns. /ready, by
        default: tests start once the engine is warm (a fault injected during the warm-up would
        hit the loop's first schedule before any request); /health for a test of the warm-up."""
        # Bound now and held: a port found free and bound only once the model is built could be
        # taken by then (another test's server, another process).
        self.listener = bind_tcp("127.0.0.1", 0)
        # CPU even on a GPU machine: these tests compare with fp32 references exactly.
        self.config = replace(config, host="127.0.0.1", port=self.listener.port, device="cpu")
        self.base_url = self.listener.url
        try:
            built = build(self.config)
        except BaseException:
            self.listener.close()
            raise
        self.engine, self.served = built.engine, built.served
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._thread = threading.Thread(target=self._main, daemon=True)
        self._error: BaseException | None = None
        self._started_at = started_at

    def _main(self) -> None:
        async def run():
            self._loop = asyncio.get_running_loop()
            self._stop = asyncio.Event()
            await serve_app(create_app(self.engine, self.served, self.config), self.config, self._stop.wait,
                            self.listener)

        try:
            asyncio.run(run())
        except BaseException as exc:  # surfaced by start()
            self._error = exc

    def start(self) -> "ServerThread":
        self._thread.start()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self._error is not None:
                raise RuntimeError("server failed to start") from self._error
            try:
                if httpx.get(self.base_url + self._started_at, timeout=1).status_code == 200:
                    return self
            except httpx.HTTPError:
                time.sleep(0.05)
        raise TimeoutError("server did not become healthy")

    def stop(self) -> None:
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(timeout=30)

    def __enter__(self) -> ServerThread:  # noqa: PYI034 (typing.Self needs 3.11)
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def on_loop(self, fn):
        """Runs fn() on the server's event loop (between engine steps) and returns its result."""
        async def call():
            return fn()

        return asyncio.run_coroutine_threadsafe(call(), self._loop).result(timeout=30)

    def wait_idle(self, timeout: float = 30) -> None:
        """Waits until no request is tracked and no step is in flight, then checks block accounting:
        nothing held, and free + cached == total."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.on_loop(lambda: self.engine.idle):
                break
            time.sleep(0.02)
        else:
            raise TimeoutError("engine did not go idle")

        def check():
            pool = self.engine.scheduler.pool
            pool.check_integrity()
            return pool.num_used_blocks, pool.num_free_blocks, pool.num_blocks

        used, free, total = self.on_loop(check)
        assert used == 0, f"{used} KV blocks still held after all requests ended"
        assert free == total


def with_chat_template(demo_model, folder, template: str) -> ServerThread:
    """A server of the demo model whose checkpoint's chat template is `template` (a copy in
    `folder`)."""
    from tests.checkpoints import edited_copy

    path = edited_copy(demo_model, folder, "tokenizer_config.json",
                       lambda config: config.update(chat_template=template))
    return ServerThread(Config(model=str(path), block_size=4, max_model_len=512, num_kv_blocks=256))


def rendered_chat(server: ServerThread, messages: list, **extra) -> str:
    """The prompt text the server renders for `messages` (its /tokenize ids, decoded)."""
    response = httpx.post(server.base_url + "/tokenize", json={"messages": messages, **extra})
    assert response.status_code == 200, response.text
    return httpx.post(server.base_url + "/detokenize", json={"tokens": response.json()["tokens"]}).json()["prompt"]
