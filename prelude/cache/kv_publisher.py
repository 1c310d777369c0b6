"""Sends KV-event batches over ZeroMQ in vLLM's wire format, so routers that follow a vLLM
worker's cache (vllm-router's kv-aware policy, llm-d's precise prefix-cache scorer, Dynamo's
KV router) follow a Prelude replica the same way.

Wire format, as vLLM publishes it:
- a PUB socket sends one three-frame message per batch: topic, an 8-byte big-endian sequence
  number (0, 1, 2, ... from startup), and the msgpack payload;
- the payload is the batch as a positional array [ts, events, data_parallel_rank];
- an event is a msgpack map tagged by "type" ("map" encoding, current vLLM) or a positional
  array with the tag first ("array", older vLLM); see prelude.contract.kv_events.ENCODINGS;
- an optional ROUTER socket (replay_endpoint) answers a request holding an 8-byte start
  sequence with every buffered (seq, payload) from there, then (-1, b"") as the end marker.

The engine hands a batch over once per step and returns at once (a bounded queue; a full queue
drops the batch and counts it, it never blocks a step). Encoding and every socket call happen
on one sender thread, the only thread that touches the sockets (ZMQ sockets are not thread-safe).
pyzmq and msgspec are imported only when events are enabled."""
from __future__ import annotations

import logging
import queue
import threading
from collections import deque
from typing import Any

from prelude.cache.kv_events import AllBlocksCleared, BlockRemoved, BlockStored, KVEvent, KVEventBatch
from prelude.contract.kv_events import KVEventsConfig

logger = logging.getLogger(__name__)

END_OF_REPLAY = (-1).to_bytes(8, "big", signed=True)
_STOP = None  # the queue's sentinel


def _binds(endpoint: str) -> bool:
    """vLLM's rule: a wildcard or local-transport address is bound, anything else connected to
    (a subscriber that binds and lets workers connect is the 'volatile workers' layout)."""
    return "*" in endpoint or "::" in endpoint or endpoint.startswith(("ipc://", "inproc://"))


def event_to_wire(event: KVEvent, encoding: str, medium: str) -> Any:
    """One event as the msgpack structure vLLM sends for it."""
    if isinstance(event, BlockStored):
        if encoding == "array":
            # Fields in vLLM's declaration order, through lora_name; positional decoders built
            # for fewer fields ignore the trailing ones.
            return ["BlockStored", event.block_hashes, event.parent_block_hash, event.token_ids,
                    event.block_size, None, medium, None]
        return {"type": "BlockStored", "block_hashes": event.block_hashes,
                "parent_block_hash": event.parent_block_hash, "token_ids": event.token_ids,
                "block_size": event.block_size, "lora_id": None, "medium": medium, "lora_name": None,
                "group_idx": 0, "kv_cache_spec_kind": "full_attention"}
    if isinstance(event, BlockRemoved):
        if encoding == "array":
            return ["BlockRemoved", event.block_hashes, medium]
        return {"type": "BlockRemoved", "block_hashes": event.block_hashes, "medium": medium, "group_idx": 0}
    assert isinstance(event, AllBlocksCleared)
    return ["AllBlocksCleared"] if encoding == "array" else {"type": "AllBlocksCleared"}


def batch_to_wire(batch: KVEventBatch, encoding: str, medium: str) -> list[Any]:
    return [batch.ts, [event_to_wire(e, encoding, medium) for e in batch.events], 0]


class KVEventPublisher:
    """Owns the PUB (and replay) sockets and the sender thread. Binding happens here, so a
    taken port fails at startup rather than silently in the thread."""

    def __init__(self, config: KVEventsConfig, medium: str):
        import msgspec
        import zmq

        self.config = config
        self.medium = medium
        self.sent = 0
        self.dropped = 0  # batches refused because the queue was full
        self._encode = msgspec.msgpack.Encoder().encode
        self._zmq = zmq
        self._ctx = zmq.Context()
        self._pub = self._ctx.socket(zmq.PUB)
        self._pub.set_hwm(config.hwm)
        self._replay = None
        try:
            (self._pub.bind if _binds(config.endpoint) else self._pub.connect)(config.endpoint)
            if config.replay_endpoint:
                self._replay = self._ctx.socket(zmq.ROUTER)
                self._replay.bind(config.replay_endpoint)
        except zmq.ZMQError:
            self._close_sockets()
            raise
        self._topic = config.topic.encode()
        self._queue: queue.Queue[KVEventBatch | None] = queue.Queue(maxsize=config.max_queue_size or 0)
        self._buffer: deque[tuple[int, bytes]] = deque(maxlen=config.buffer_steps)
        self._thread = threading.Thread(target=self._run, name="prelude-kv-events", daemon=True)
        self._thread.start()

    def publish(self, batch: KVEventBatch) -> None:
        """Hands a batch to the sender thread; never blocks."""
        try:
            self._queue.put_nowait(batch)
        except queue.Full:
            self.dropped += 1
            if self.dropped == 1 or self.dropped % 1000 == 0:
                logger.warning("KV-event queue full (%d batches): dropped %d batch(es) so far; subscribers "
                               "will see a gap in the sequence numbers", self.config.max_queue_size, self.dropped)

    def shutdown(self, timeout: float = 2.0) -> None:
        """Sends what is queued (up to `timeout`), then closes the sockets."""
        if not self._thread.is_alive():
            return
        try:
            self._queue.put(_STOP, timeout=timeout)
        except queue.Full:
            pass
        self._thread.join(timeout)
        if self._thread.is_alive():
            logger.warning("KV-event sender did not stop within %.1fs", timeout)
            return  # the daemon thread still owns the sockets; the process exit reclaims them
        self._close_sockets()

    # -- the sender thread ------------------------------------------------------------------
    def _run(self) -> None:
        seq = 0
        # With a replay socket, wake every 50 ms to serve requests; without one, sleep on the queue.
        wait = 0.05 if self._replay is not None else None
        while True:
            if self._replay is not None:
                self._serve_replays()
            try:
                batch = self._queue.get(timeout=wait)
            except queue.Empty:
                continue
            if batch is _STOP:
                return
            try:
                payload = self._encode(batch_to_wire(batch, self.config.encoding, self.medium))
                self._pub.send_multipart((self._topic, seq.to_bytes(8, "big"), payload), copy=False)
                self._buffer.append((seq, payload))
                seq += 1
                self.sent += 1
            except Exception:  # keep the thread alive: one bad batch must not end all events
                logger.exception("sending KV-event batch %d failed", seq)

    def _serve_replays(self) -> None:
        assert self._replay is not None
        while self._replay.poll(0):
            frames = self._replay.recv_multipart()
            if len(frames) != 3 or len(frames[2]) != 8:
                logger.warning("malformed KV-event replay request (%d frames)", len(frames))
                continue
            client, _, start = frames
            first = int.from_bytes(start, "big")
            for seq, payload in list(self._buffer):
                if seq >= first:
                    self._replay.send_multipart((client, b"", seq.to_bytes(8, "big"), payload))
            self._replay.send_multipart((client, b"", END_OF_REPLAY, b""))

    def _close_sockets(self) -> None:
        self._pub.close(linger=200)  # a moment for the last batches to leave
        if self._replay is not None:
            self._replay.close(linger=0)
        self._ctx.term()
