"""KV-cache events from the block pool: a consumer that applies every drained batch to its own
index ends up with exactly the pool's cached blocks (hash, parent hash, tokens), through random
publishes, evictions, races and resets; and the wire encodings decode with msgspec structs shaped
like vLLM's, current (tagged maps) and older (tagged positional arrays)."""
from __future__ import annotations

import random
import time

import msgspec
import pytest

from prelude.cache.block_pool import BlockPool
from prelude.cache.kv_events import AllBlocksCleared, BlockRemoved, BlockStored, KVEventBatch, KVEventLog, chain_hash
from prelude.cache.kv_publisher import batch_to_wire
from prelude.contract.kv_events import KVEventsConfig, KVEventsConfigError
from tests.kv_wire import ArrayBatch, Index, MapBatch

BS = 4


def play(pool: BlockPool, prompt: list[int]) -> list[int]:
    match = pool.match(prompt)
    pool.acquire(match.blocks)
    blocks = match.blocks + pool.allocate(pool.blocks_for(len(prompt)) - len(match.blocks))
    pool.publish(prompt, blocks, len(match.blocks), len(prompt) // BS)
    return blocks


def test_a_consumer_replaying_the_events_holds_exactly_the_pools_cache():
    rng = random.Random(7)
    pool = BlockPool(24, BS, events=KVEventLog(BS))
    index = Index(BS)
    prefixes = [[rng.randrange(50) for _ in range(4 * BS)] for _ in range(4)]
    held: list[list[int]] = []
    for step in range(400):
        action = rng.random()
        if action < 0.55 and pool.can_allocate(6):
            fresh = [rng.randrange(50) for _ in range(rng.randrange(8))]
            prompt = rng.choice(prefixes)[: BS * rng.randrange(1, 5)] + fresh
            held.append(play(pool, prompt))
        elif action < 0.95 and held:
            pool.release(held.pop(rng.randrange(len(held))))
        elif not held:
            assert pool.reset_prefix_cache()
        if step % 3 == 0:  # the engine drains once per step; several pool calls fall in one
            index.apply(pool.events.drain())
            assert index.blocks == pool.cached_by_hash()
        pool.check_integrity()
    index.apply(pool.events.drain())
    assert index.blocks == pool.cached_by_hash()


def test_publishing_a_twin_and_evicting_a_chain_report_what_changed():
    pool = BlockPool(6, BS, events=KVEventLog(BS))
    prompt = list(range(3 * BS))
    a = play(pool, prompt)
    # Chained stores merge into one event carrying every block's tokens, under the root.
    [stored] = pool.events.drain()
    assert isinstance(stored, BlockStored) and stored.parent_block_hash is None
    assert stored.token_ids == prompt and len(stored.block_hashes) == 3 and stored.block_size == BS
    assert stored.block_hashes[0] == chain_hash(None, prompt[:BS])
    assert stored.block_hashes[1] == chain_hash(stored.block_hashes[0], prompt[BS:2 * BS])
    # The same prefix computed again adds nothing: the cache did not change.
    pool.release(a)
    pool.release(play(pool, prompt))
    assert pool.events.drain() == []
    # Allocating past the free blocks evicts the idle chain, leaves first; one removal event.
    pool.allocate(6)
    [removed] = pool.events.drain()
    assert isinstance(removed, BlockRemoved) and sorted(removed.block_hashes) == sorted(stored.block_hashes)
    assert pool.cached_by_hash() == {}


def test_without_an_event_log_nothing_is_recorded():
    pool = BlockPool(8, BS)
    pool.release(play(pool, list(range(2 * BS))))
    assert pool.events is None and pool.cached_by_hash() == {}


@pytest.mark.parametrize("encoding", ["map", "array"])
def test_both_encodings_decode_as_vllm_structs(encoding):
    batch = KVEventBatch(12.5, [BlockStored([1, 2], None, list(range(8)), 4), BlockRemoved([2**64 - 1]),
                                AllBlocksCleared()])
    payload = msgspec.msgpack.encode(batch_to_wire(batch, encoding, "CPU"))
    decoded = msgspec.msgpack.decode(payload, type=MapBatch if encoding == "map" else ArrayBatch)
    stored, removed, cleared = decoded.events
    assert decoded.ts == 12.5
    assert (stored.block_hashes, stored.parent_block_hash, stored.token_ids, stored.block_size, stored.medium) == \
        ([1, 2], None, list(range(8)), 4, "CPU")
    assert removed.block_hashes == [2**64 - 1] and type(cleared).__name__.endswith("Cleared")


def test_config_takes_vllms_json_and_refuses_what_vllm_would_not_know():
    c = KVEventsConfig.from_json('{"enable_kv_cache_events": true, "topic": "kv", "replay_endpoint": "tcp://*:1"}')
    assert c.active and c.endpoint == "tcp://*:5557" and c.topic == "kv" and c.buffer_steps == 10_000
    assert not KVEventsConfig.from_json('{"enable_kv_cache_events": true, "publisher": "null"}').active
    assert not KVEventsConfig.from_json("{}").active
    for bad in ('{"enable_kv_cache_events": 1}', '{"hwm": "x"}', '{"nope": 1}', "[]", "{",
                '{"encoding": "json"}', '{"buffer_steps": -1}'):
        with pytest.raises(KVEventsConfigError):
            KVEventsConfig.from_json(bad)


def test_array_encoding_over_real_zmq_with_the_subscriber_bound():
    """The other endpoint layout: the subscriber binds and the worker connects (a host address,
    no wildcard), events in the older positional shape."""
    zmq = pytest.importorskip("zmq", reason="pyzmq is not installed (pip install 'prelude[kv-events]')")
    from prelude.cache.kv_publisher import KVEventPublisher

    ctx = zmq.Context()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt_string(zmq.SUBSCRIBE, "")
    port = sub.bind_to_random_port("tcp://127.0.0.1")
    publisher = KVEventPublisher(KVEventsConfig(enable_kv_cache_events=True, endpoint=f"tcp://127.0.0.1:{port}",
                                                encoding="array"), medium="CPU")
    try:
        pool = BlockPool(8, BS, events=KVEventLog(BS))
        pool.release(play(pool, list(range(2 * BS))))
        assert pool.reset_prefix_cache()
        batch = KVEventBatch(1.0, pool.events.drain())
        deadline = time.monotonic() + 10
        got = None
        while got is None and time.monotonic() < deadline:  # resend until the connection is up
            publisher.publish(batch)
            if sub.poll(200):
                got = sub.recv_multipart()
        assert got is not None, "nothing arrived"
        topic, seq, payload = got
        decoded = msgspec.msgpack.decode(payload, type=ArrayBatch)
        assert topic == b"" and len(seq) == 8
        assert [type(e).__name__ for e in decoded.events] == ["ArrayStored", "ArrayCleared"]
        assert decoded.events[0].token_ids == list(range(2 * BS))
    finally:
        publisher.shutdown()
        sub.close(0)
        ctx.term()
