"""`--kv-events-config`: the JSON object vLLM's flag of the same name takes, with the same keys and
defaults, so a deployment's KV-event settings carry over from vLLM unchanged. Parsed here, at the
bottom layer, because Config holds it; the publisher that uses it lives in prelude.cache."""
from __future__ import annotations

import json
from dataclasses import dataclass, fields

# Event shapes on the wire. "map": each event a msgpack map tagged by its "type" key, which vLLM
# publishes since its switch away from positional events (vllm#42892, released in 0.2x); "array":
# each event a positional array with the tag first, what older vLLM published and older consumers
# (routers pinned to those releases) decode. The batch around them is a positional array in both.
ENCODINGS = ("map", "array")


class KVEventsConfigError(ValueError):
    """The --kv-events-config JSON is malformed or names an unknown key or value."""


@dataclass(frozen=True, slots=True)
class KVEventsConfig:
    enable_kv_cache_events: bool = False
    publisher: str | None = None  # None: "zmq" when enabled, else "null" (vLLM's rule)
    endpoint: str = "tcp://*:5557"  # a wildcard, ipc:// or inproc:// address binds; a host address connects
    replay_endpoint: str | None = None  # a ROUTER socket serving missed batches by sequence number
    buffer_steps: int = 10_000  # batches (one per engine step) kept for replay
    hwm: int = 100_000  # the PUB socket's high-water mark: beyond it ZMQ drops for slow subscribers
    max_queue_size: int = 100_000  # batches waiting for the sender thread; beyond it new ones are dropped
    topic: str = ""
    encoding: str = "map"  # Prelude's addition (vLLM has one shape per release): see ENCODINGS

    def __post_init__(self) -> None:
        if self.publisher not in (None, "null", "zmq"):
            raise KVEventsConfigError(f"--kv-events-config: publisher must be \"zmq\" or \"null\", "
                                      f"not {self.publisher!r}")
        if self.encoding not in ENCODINGS:
            raise KVEventsConfigError(f"--kv-events-config: encoding must be one of {', '.join(ENCODINGS)}")
        for name in ("buffer_steps", "hwm", "max_queue_size"):
            if getattr(self, name) < 0:
                raise KVEventsConfigError(f"--kv-events-config: {name} must be >= 0")

    @property
    def active(self) -> bool:
        """Events are recorded and sent: enabled, through a real (zmq) publisher."""
        kind = self.publisher or ("zmq" if self.enable_kv_cache_events else "null")
        return self.enable_kv_cache_events and kind == "zmq"

    @classmethod
    def from_json(cls, text: str) -> "KVEventsConfig":
        try:
            raw = json.loads(text)
        except json.JSONDecodeError as exc:
            raise KVEventsConfigError(f"--kv-events-config is not JSON: {exc}") from exc
        if not isinstance(raw, dict):
            raise KVEventsConfigError("--kv-events-config must be a JSON object")
        known = {f.name: f for f in fields(cls)}
        unknown = sorted(set(raw) - set(known))
        if unknown:
            raise KVEventsConfigError(f"--kv-events-config: unknown key(s) {', '.join(unknown)}; "
                                      f"known: {', '.join(known)}")
        expected: dict[str, type | tuple[type, ...]] = {
            "enable_kv_cache_events": bool, "publisher": (str, type(None)), "endpoint": str,
            "replay_endpoint": (str, type(None)), "buffer_steps": int, "hwm": int,
            "max_queue_size": int, "topic": str, "encoding": str}
        for key, value in raw.items():
            kind = expected[key]
            if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
                raise KVEventsConfigError(f"--kv-events-config: {key} has the wrong type ({value!r})")
        return cls(**raw)
