"""Block pool and prefix cache: ref counts, matching, publishing, LRU eviction, invariants."""
from __future__ import annotations

import random

import pytest

from prelude.cache.block_pool import BlockPool, NoFreeBlocks

BS = 4


def tokens(n: int, seed: int = 0) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(1000) for _ in range(n)]


def compute(pool: BlockPool, prompt: list[int]) -> list[int]:
    """Plays a request: attach the cached prefix, allocate the rest, publish, and return blocks."""
    match = pool.match(prompt)
    pool.acquire(match.blocks)
    new = pool.allocate(pool.blocks_for(len(prompt)) - len(match.blocks))
    blocks = match.blocks + new
    pool.publish(prompt, blocks, len(match.blocks), len(prompt) // BS)
    return blocks


def test_allocate_release_roundtrip_keeps_accounting():
    pool = BlockPool(8, BS)
    a = pool.allocate(3)
    b = pool.allocate(5)
    assert pool.num_free_blocks == 0 and not pool.can_allocate(1)
    with pytest.raises(NoFreeBlocks):
        pool.allocate(1)
    pool.release(a)
    pool.release(b)
    assert pool.num_free_blocks == 8
    pool.check_integrity()


def test_second_request_attaches_the_cached_prefix_blocks():
    pool = BlockPool(16, BS)
    shared = tokens(12)
    first = compute(pool, shared + [1, 2, 3])
    pool.release(first)
    match = pool.match(shared + [7, 8, 9, 10, 11])
    assert match.blocks == first[:3]
    assert pool.num_cached_blocks == 3
    pool.check_integrity()


def test_match_is_exact_on_tokens_and_chained_on_parents():
    pool = BlockPool(16, BS)
    pool.release(compute(pool, [1, 2, 3, 4, 5, 6, 7, 8]))
    # Same second block behind a different first block is not a hit.
    assert pool.match([9, 9, 9, 9, 5, 6, 7, 8]).blocks == []
    assert len(pool.match([1, 2, 3, 4, 5, 6, 7, 0]).blocks) == 1
    assert pool.match([1, 2, 3, 4, 5, 6, 7, 0]).miss_key is not None


def test_lru_eviction_takes_idle_leaves_first():
    pool = BlockPool(4, BS)
    old = compute(pool, tokens(8, seed=1))
    pool.release(old)
    recent = compute(pool, tokens(8, seed=2))
    pool.release(recent)
    assert pool.num_cached_blocks == 4 and pool.num_free_blocks == 4
    taken = pool.allocate(1)  # evicts the least recently used leaf: the old chain's second block
    assert taken == [old[1]]
    assert len(pool.match(tokens(8, seed=1)).blocks) == 1
    assert len(pool.match(tokens(8, seed=2)).blocks) == 2
    pool.release(taken)
    pool.check_integrity()


def test_evicting_a_parent_leaves_its_descendants_unreachable():
    pool = BlockPool(4, BS)
    prompt = tokens(12, seed=3)
    chain = compute(pool, prompt)
    pool.release(chain)
    # Touch the leaf so that the root is the least recently used block, then force one eviction.
    pool._idle.move_to_end(chain[0], last=False)
    taken = pool.allocate(2)  # one free block, then the evicted root alone
    assert chain[0] in taken and chain[1] not in taken
    assert pool.match(prompt).blocks == []  # its children hang under a publication gone for good
    pool.release(taken)
    # The same prompt again: a fresh chain, which the unreachable blocks do not stand in for.
    again = compute(pool, prompt)
    assert pool.match(prompt).blocks == again
    pool.release(again)
    pool.check_integrity()
    assert pool.num_free_blocks == 4


def test_publish_race_keeps_one_canonical_chain():
    pool = BlockPool(16, BS)
    prompt = tokens(8, seed=4)
    a = pool.allocate(2)
    b = pool.allocate(2)
    pool.publish(prompt, a, 0, 2)
    pool.publish(prompt, b, 0, 2)  # computed the same blocks in the same step: stays private
    assert pool.match(prompt).blocks == a
    # b grows a third block: it is published under a's chain, so later prompts find it.
    longer = prompt + tokens(4, seed=5)
    b += pool.allocate(1)
    pool.publish(longer, b, 2, 3)
    assert pool.match(longer).blocks == a + [b[2]]
    pool.release(a)
    # Evicting a's idle chain leaves b's block, which b still holds, where nothing finds it.
    everything = pool.allocate(pool.num_free_blocks)
    assert b[2] not in everything and pool.match(longer).blocks == []
    pool.check_integrity()
    pool.release(everything)
    pool.release(b)
    assert pool.num_free_blocks == 16
    pool.check_integrity()


def test_randomized_workload_never_loses_a_block():
    rng = random.Random(0)
    pool = BlockPool(32, BS)
    prefixes = [tokens(rng.randrange(4, 24), seed=s) for s in range(5)]
    held: list[list[int]] = []
    for _ in range(400):
        if held and (rng.random() < 0.5 or pool.num_free_blocks < 8):
            pool.release(held.pop(rng.randrange(len(held))))
        else:
            prompt = rng.choice(prefixes) + tokens(rng.randrange(0, 12), seed=rng.randrange(10**6))
            if pool.blocks_for(len(prompt)) <= pool.num_free_blocks:
                held.append(compute(pool, prompt))
        pool.check_integrity()
    for blocks in held:
        pool.release(blocks)
    pool.check_integrity()
    assert pool.num_used_blocks == 0
