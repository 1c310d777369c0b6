"""A KV-event consumer for tests: msgspec structs shaped like vLLM's (current tagged maps and
older positional arrays), and the index a KV-aware router builds from the events alone."""
from __future__ import annotations

import msgspec


class Index:
    """What a KV-aware router keeps: hash -> (parent hash, tokens), built from events alone."""

    def __init__(self, block_size: int) -> None:
        self.block_size = block_size
        self.blocks: dict[int, tuple[int | None, tuple[int, ...]]] = {}

    def apply(self, events) -> None:
        for event in events:
            kind = type(event).__name__
            if kind.endswith("Stored"):
                parent = event.parent_block_hash
                assert parent is None or parent in self.blocks, "a store under a parent never stored"
                for i, h in enumerate(event.block_hashes):
                    self.blocks[h] = (parent, tuple(event.token_ids[i * self.block_size:(i + 1) * self.block_size]))
                    parent = h
            elif kind.endswith("Removed"):
                for h in event.block_hashes:
                    assert h in self.blocks, "a removal of a block never stored"
                    del self.blocks[h]
            else:
                assert kind.endswith("Cleared"), kind
                self.blocks.clear()


class MapEvent(msgspec.Struct, tag=True, omit_defaults=True):
    pass


class MapStored(MapEvent, tag="BlockStored"):
    block_hashes: list[int]
    parent_block_hash: int | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None
    lora_name: str | None
    group_idx: int | None = None


class MapRemoved(MapEvent, tag="BlockRemoved"):
    block_hashes: list[int]
    medium: str | None


class MapCleared(MapEvent, tag="AllBlocksCleared"):
    pass


class MapBatch(msgspec.Struct, array_like=True):
    ts: float
    events: list[MapStored | MapRemoved | MapCleared]
    data_parallel_rank: int | None = None


class ArrayEvent(msgspec.Struct, tag=True, array_like=True):
    pass


class ArrayStored(ArrayEvent, tag="BlockStored"):  # the fields of vLLM's positional releases
    block_hashes: list[int]
    parent_block_hash: int | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None


class ArrayRemoved(ArrayEvent, tag="BlockRemoved"):
    block_hashes: list[int]
    medium: str | None


class ArrayCleared(ArrayEvent, tag="AllBlocksCleared"):
    pass


class ArrayBatch(msgspec.Struct, array_like=True):
    ts: float
    events: list[ArrayStored | ArrayRemoved | ArrayCleared]
