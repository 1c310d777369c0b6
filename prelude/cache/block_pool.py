"""KV block accounting: ref-counted blocks and a block-level prefix cache with LRU eviction.

Every block is in exactly one of three states:
- free: unreferenced and holds nothing worth keeping;
- in use: ref count > 0 (held by running sequences or by a step in flight);
- cached idle: unreferenced but published in the prefix trie; reusable by a later prefix match
  until it is evicted (least recently used first) to satisfy an allocation.

The prefix trie is keyed block by block: a full block's key is (its parent's publication, its
tokens), the parent being the cached block before it (ROOT for the first) and a publication the
number a block gets each time it is published, never reused. Keys are exact token tuples, so a
hit never needs a collision check. Evicting a block unpublishes it alone: a cached descendant's
key names a publication nothing matches again, so it stays unreachable until the LRU order
evicts it too (rare: leaves usually go first). Keyed by the parent's block id, which comes back
in a new chain, every descendant had to be unpublished with it.

With a KVEventLog attached, every publish and eviction is also recorded as a KV-cache event
(prelude.cache.kv_events), each cached block carrying a content hash of its key's chain.
"""
from __future__ import annotations

from collections import OrderedDict, deque
from typing import Iterator, NamedTuple, Sequence

from prelude.cache.kv_events import KVEventLog, chain_hash

ROOT = -1
BlockKey = tuple[int, tuple[int, ...]]


class NoFreeBlocks(RuntimeError):
    """An allocation asked for more blocks than are free or evictable (callers check first)."""


class PrefixMatch(NamedTuple):
    blocks: list[int]  # cached blocks covering the longest full-block prefix, in order
    miss_key: BlockKey | None  # key of the first full block not cached (None: all cached / no full block left)


class BlockPool:
    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True,
                 events: KVEventLog | None = None):
        if num_blocks <= 0 or block_size <= 0:
            raise ValueError("num_blocks and block_size must be positive")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self._refs = [0] * num_blocks
        self._free: deque[int] = deque(range(num_blocks))
        self._key: list[BlockKey | None] = [None] * num_blocks
        self._publication = [ROOT] * num_blocks  # a published block's, as its children's keys name it
        self._published = 0  # publications so far
        self._lookup: dict[BlockKey, int] = {}
        self._idle: OrderedDict[int, None] = OrderedDict()  # cached, unreferenced; LRU first
        # Bumped whenever the set of cached blocks changes: cost estimates made from an older
        # version may be stale.
        self.version = 0
        # KV-cache events: None (the default) costs one test per published or evicted block.
        self.events = events
        self._hash: list[int] = [0] * num_blocks if events is not None else []
        self._parent_hash: list[int | None] = [None] * num_blocks if events is not None else []
        # Counters for metrics.
        self.queries_tokens = 0
        self.hit_tokens = 0

    # -- capacity ---------------------------------------------------------------------------
    @property
    def num_free_blocks(self) -> int:
        """Blocks an allocation can take now: free ones plus evictable cached ones."""
        return len(self._free) + len(self._idle)

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - self.num_free_blocks

    @property
    def num_cached_blocks(self) -> int:
        return len(self._lookup)

    @property
    def usage(self) -> float:
        return self.num_used_blocks / self.num_blocks

    def blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def can_allocate(self, n: int) -> bool:
        return n <= self.num_free_blocks

    # -- allocation -------------------------------------------------------------------------
    def allocate(self, n: int) -> list[int]:
        """n fresh blocks with ref count 1, evicting idle cached blocks (LRU) when needed."""
        free, refs = self._free, self._refs
        if n > len(free) + len(self._idle):
            raise NoFreeBlocks(f"asked for {n} blocks, {self.num_free_blocks} available")
        if n > len(free):
            self._evict_lru(n - len(free))
        out = [free.popleft() for _ in range(n)]
        for block in out:
            refs[block] = 1
        return out

    def acquire(self, blocks: Sequence[int]) -> None:
        """Adds a reference to each block (cached blocks attached after a prefix match)."""
        for block in blocks:
            if self._refs[block] == 0:
                self._idle.pop(block, None)
            self._refs[block] += 1

    def release(self, blocks: Sequence[int]) -> None:
        """Drops one reference from each block. Unreferenced cached blocks stay matchable until
        evicted; released deepest first, so the LRU order evicts leaves before their parents."""
        refs, keys, free, idle = self._refs, self._key, self._free, self._idle
        for block in reversed(blocks):
            count = refs[block] - 1
            assert count >= 0, f"block {block} released more often than acquired"
            refs[block] = count
            if count == 0:
                if keys[block] is None:
                    free.append(block)
                else:
                    idle[block] = None

    # -- prefix cache ----------------------------------------------------------------------
    def match(self, tokens: Sequence[int], max_blocks: int | None = None) -> PrefixMatch:
        """Longest cached prefix of `tokens` in whole blocks (at most max_blocks). Does not take
        references: call acquire() on the blocks you keep before anything else allocates."""
        full = len(tokens) // self.block_size
        if max_blocks is not None:
            full = min(full, max_blocks)
        if not self.enable_prefix_caching or full == 0:
            return PrefixMatch([], None)
        blocks: list[int] = []
        parent, lookup, publication = ROOT, self._lookup, self._publication
        for chunk in self._chunks(tokens, 0, full):
            key = (parent, chunk)
            block = lookup.get(key)
            if block is None:
                self._touch(blocks)
                return PrefixMatch(blocks, key)
            blocks.append(block)
            parent = publication[block]
        self._touch(blocks)
        return PrefixMatch(blocks, None)

    def cached_blocks(self, tokens: Sequence[int], max_blocks: int) -> int:
        """How many leading full blocks of `tokens` are cached now; a read-only peek (no LRU
        touch) for cost estimates."""
        if not self.enable_prefix_caching:
            return 0
        full = min(len(tokens) // self.block_size, max_blocks)
        parent, lookup, publication = ROOT, self._lookup, self._publication
        for i, chunk in enumerate(self._chunks(tokens, 0, full)):
            block = lookup.get((parent, chunk))
            if block is None:
                return i
            parent = publication[block]
        return full

    def record_query(self, num_tokens: int, num_hit_tokens: int) -> None:
        self.queries_tokens += num_tokens
        self.hit_tokens += num_hit_tokens

    def publish(self, tokens: Sequence[int], blocks: Sequence[int], first: int, last: int) -> None:
        """Publishes blocks[first:last], whose K/V now hold tokens' full blocks first..last-1.
        blocks[:first] must already be published (or be their cached twins)."""
        if not self.enable_prefix_caching or last <= first:
            return
        parent: int | None = None  # the cached block above, while publishing under it
        if first > 0:
            parent = self._canonical(tokens, blocks, first - 1)
            if parent is None:
                return  # the chain above was evicted meanwhile: nothing below is reachable
        lookup, keys, publication, events = self._lookup, self._key, self._publication, self.events
        parent_publication = ROOT if parent is None else publication[parent]
        published = self._published
        for block, chunk in zip(blocks[first:last], self._chunks(tokens, first, last)):
            key = (parent_publication, chunk)
            if keys[block] is None:
                cached = lookup.setdefault(key, block)
                if cached == block:
                    keys[block] = key
                    published += 1
                    publication[block] = parent_publication = published
                    if events is not None:
                        self._record_stored(block, parent, chunk)
                    parent = block
                    continue
                # Someone computed the same block first: theirs stays canonical.
            else:  # already published under another chain
                cached = lookup.get(key, block)
            parent, parent_publication = cached, publication[cached]
        if published != self._published:
            self._published = published
            self.version += 1

    def _record_stored(self, block: int, parent: int | None, chunk: tuple[int, ...]) -> None:
        assert self.events is not None
        parent_hash = None if parent is None else self._hash[parent]
        self._hash[block] = chain_hash(parent_hash, chunk)
        self._parent_hash[block] = parent_hash
        self.events.stored(self._hash[block], parent_hash, chunk)

    def _chunks(self, tokens: Sequence[int], first: int, last: int) -> Iterator[tuple[int, ...]]:
        """tokens' full blocks first..last-1, each as one tuple (the trie's key), cut in C: zip
        over one iterator takes block_size items at a time."""
        bs = self.block_size
        return zip(*[iter(tokens[first * bs:last * bs])] * bs)

    def _canonical(self, tokens: Sequence[int], blocks: Sequence[int], index: int) -> int | None:
        """The cached block standing for tokens' full block `index` (ours or an identical twin)."""
        if self._key[blocks[index]] is not None:
            return blocks[index]
        matched = self.match(tokens, max_blocks=index + 1).blocks
        return matched[index] if len(matched) > index else None

    def _touch(self, blocks: list[int]) -> None:
        # Deepest first, so parents end up more recently used than their children.
        for block in reversed(blocks):
            if block in self._idle:
                self._idle.move_to_end(block)

    def _evict_lru(self, count: int, report: bool = True) -> None:
        """Unpublishes the `count` least recently used idle cached blocks and frees them; each
        is a KV event unless `report` is False (a reset reports one for all)."""
        idle, keys, lookup, free = self._idle, self._key, self._lookup, self._free
        events = self.events if report else None
        for _ in range(count):
            block, _ = idle.popitem(last=False)
            key = keys[block]
            assert key is not None, f"idle block {block} is not published"
            del lookup[key]
            keys[block] = None
            free.append(block)
            if events is not None:
                events.removed(self._hash[block])
        self.version += 1

    def reset_prefix_cache(self) -> bool:
        """Drops every idle cached block (vLLM's /reset_prefix_cache). False if some are in use."""
        if any(self._refs[b] for b in self._lookup.values()):
            return False
        self._evict_lru(len(self._idle), report=False)
        if self.events is not None:
            self.events.cleared()
        return True

    def cached_by_hash(self) -> dict[int, tuple[int | None, tuple[int, ...]]]:
        """Every cached block as the events describe it: its hash -> (its parent's hash, its
        tokens). Tests compare a subscriber's replay of the events with this. Empty without an
        event log."""
        if self.events is None:
            return {}
        return {self._hash[block]: (self._parent_hash[block], tokens) for (_, tokens), block in self._lookup.items()}

    # -- checks -----------------------------------------------------------------------------
    def check_integrity(self) -> None:
        """Asserts the accounting invariants (tests call this after every scenario)."""
        free = set(self._free)
        idle = set(self._idle)
        used = {b for b in range(self.num_blocks) if self._refs[b] > 0}
        assert len(free) == len(self._free), "a block is on the free list twice"
        assert not (free & idle) and not (free & used) and not (idle & used)
        assert len(free) + len(idle) + len(used) == self.num_blocks, "a block is lost"
        assert all(self._key[b] is None for b in free), "a free block is still published"
        assert all(self._key[b] is not None for b in idle), "an idle block is not published"
        for key, block in self._lookup.items():
            assert self._key[block] == key
            assert key[0] < self._publication[block], "a block is keyed under a later publication"
