"""KV-cache events: what the prefix cache published (stored) and evicted (removed), recorded by
the block pool as it happens and drained once per engine step into one batch.

The pool keys a cached block on (parent block, its tokens), which is the whole token prefix up
to and including that block. Block ids are reused after eviction and mean nothing to another
process, so each cached block also gets a 64-bit content hash of that same chain: the parent's
hash and the block's tokens. Two replicas that cache the same prefix report the same hashes, and
a router can key its index on them across the fleet (vLLM's hashes are seeded per process unless
PYTHONHASHSEED is set; ours are fixed, which is the more useful choice for a router)."""
from __future__ import annotations

import hashlib
from array import array
from dataclasses import dataclass, field
from typing import Protocol, Sequence, Union

# Stands in for the missing parent of a first block, so the root of every chain hashes alike.
_ROOT_SEED = b"prelude-kv-root\x00"


def chain_hash(parent: int | None, tokens: Sequence[int]) -> int:
    """The block's content hash: unsigned 64-bit, from the parent's hash and this block's tokens."""
    head = _ROOT_SEED if parent is None else parent.to_bytes(8, "little") + b"\x01" * 8
    digest = hashlib.blake2b(head + array("q", tokens).tobytes(), digest_size=8).digest()
    return int.from_bytes(digest, "little")


@dataclass(slots=True)
class BlockStored:
    """A chain of newly cached blocks: block_hashes[i] holds token_ids[i*bs:(i+1)*bs], and the
    first one hangs under parent_block_hash (None: at the root)."""

    block_hashes: list[int]
    parent_block_hash: int | None
    token_ids: list[int]
    block_size: int


@dataclass(slots=True)
class BlockRemoved:
    block_hashes: list[int]


@dataclass(slots=True)
class AllBlocksCleared:
    pass


KVEvent = Union[BlockStored, BlockRemoved, AllBlocksCleared]


@dataclass(slots=True)
class KVEventBatch:
    """The events of one engine step, in the order they happened; ts is wall-clock seconds."""

    ts: float
    events: list[KVEvent] = field(default_factory=list)


class KVEventLog:
    """Collects the pool's events between drains. Consecutive stores that extend the same chain
    merge into one BlockStored (as vLLM sends one per request and step), consecutive removals
    into one BlockRemoved: fewer, larger messages for the same information."""

    def __init__(self, block_size: int):
        self.block_size = block_size
        self._events: list[KVEvent] = []

    def stored(self, block_hash: int, parent: int | None, tokens: Sequence[int]) -> None:
        last = self._events[-1] if self._events else None
        if isinstance(last, BlockStored) and parent is not None and last.block_hashes[-1] == parent:
            last.block_hashes.append(block_hash)
            last.token_ids.extend(tokens)
        else:
            self._events.append(BlockStored([block_hash], parent, list(tokens), self.block_size))

    def removed(self, block_hash: int) -> None:
        last = self._events[-1] if self._events else None
        if isinstance(last, BlockRemoved):
            last.block_hashes.append(block_hash)
        else:
            self._events.append(BlockRemoved([block_hash]))

    def cleared(self) -> None:
        self._events.append(AllBlocksCleared())

    def drain(self) -> list[KVEvent]:
        events, self._events = self._events, []
        return events

    def __len__(self) -> int:
        return len(self._events)


class KVEventSink(Protocol):
    """Where the engine hands each step's batch (prelude.cache.kv_publisher); publish must not
    block."""

    def publish(self, batch: KVEventBatch) -> None: ...

    def shutdown(self) -> None: ...
