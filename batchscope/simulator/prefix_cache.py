"""Automatic prefix caching as vLLM V1 does it: chained block hashes, ref counts, and an LRU queue of free blocks.

The engine core asks it for a request's cached leading blocks and for blocks to allocate. vLLM's rules, and what
is tracked here to keep a step cheap: docs/simulator.md, "Automatic prefix caching".
"""

from __future__ import annotations

import itertools
from collections import OrderedDict
from collections.abc import Sequence

ROOT_HASH = 0
_UNIQUE = -1  # tags the hash of a block only its own request can ever hit


def block_hashes(token_ids: Sequence[int], block_size: int, parent: int = ROOT_HASH) -> list[int]:
    """Chained hashes of the full blocks of ``token_ids``: equal prefixes give equal hashes."""
    hashes = []
    for start in range(0, len(token_ids) - block_size + 1, block_size):
        parent = hash((parent, tuple(token_ids[start : start + block_size])))
        hashes.append(parent)
    return hashes


def unique_hash(parent: int, request_uid: int, index: int) -> int:
    """The hash of block ``index`` of a request whose tokens there are unknown or its own (generated)."""
    return hash((parent, _UNIQUE, request_uid, index))


class PrefixCache:
    """Cached blocks (hash -> ref count) and the free-block queue they share with anonymous free blocks.

    ``free_blocks`` counts every block in the queue, cached or not, as vLLM's ``get_num_free_blocks`` does.
    """

    def __init__(self, num_free_blocks: int) -> None:
        self.refs: dict[int, int] = {}  # cached block hash -> requests using it (0: free, evictable)
        # head = next to allocate. A cached block: its hash -> 0; a run of anonymous blocks: (None, id) -> count
        self._queue: OrderedDict[int | tuple[None, int], int] = OrderedDict()
        self._run_ids = itertools.count()
        self.free_blocks = 0
        self.release_anonymous(num_free_blocks)
        self.evictions = 0

    def evictable(self, hashes: Sequence[int]) -> int:
        """How many of these cached blocks are free now (a hit on them uses up a free block)."""
        return sum(1 for block_hash in hashes if self.refs[block_hash] == 0)

    def touch(self, hashes: Sequence[int]) -> None:
        """A request now uses these cached blocks: free ones leave the queue."""
        for block_hash in hashes:
            if self.refs[block_hash] == 0:
                del self._queue[block_hash]
                self.free_blocks -= 1
            self.refs[block_hash] += 1

    def register(self, block_hash: int) -> bool:
        """A request's block (already allocated) now holds content with this hash; False if already cached."""
        if block_hash in self.refs:
            return False
        self.refs[block_hash] = 1
        return True

    def take(self, count: int) -> None:
        """Allocate ``count`` blocks from the queue's head, evicting the cached blocks taken."""
        if count > self.free_blocks:
            raise RuntimeError(f"allocating {count} blocks with {self.free_blocks} free")
        self.free_blocks -= count
        queue = self._queue
        while count:
            key, size = queue.popitem(last=False)
            if isinstance(key, int):  # a cached block: its content is evicted
                del self.refs[key]
                self.evictions += 1
                count -= 1
                continue
            if size > count:
                queue[key] = size - count
                queue.move_to_end(key, last=False)
                return
            count -= size

    def release_anonymous(self, count: int) -> None:
        """Free ``count`` blocks with no reusable content: to the queue's tail."""
        if count <= 0:
            return
        self._queue[(None, next(self._run_ids))] = count
        self.free_blocks += count

    def release(self, block_hash: int) -> None:
        """A request stops using a cached block; unused, it joins the queue's tail (evicted last)."""
        refs = self.refs[block_hash] - 1
        self.refs[block_hash] = refs
        if refs == 0:
            self._queue[block_hash] = 0
            self.free_blocks += 1


class RequestBlocks:
    """One request's view of the cache: its block hashes and the cached blocks it holds (a prefix of its blocks)."""

    __slots__ = ("uid", "chain", "known", "held", "open")

    def __init__(self, uid: int, prompt_hashes: list[int]) -> None:
        self.uid = uid
        self.chain = prompt_hashes  # hashes of its blocks so far; extended with unique ones on demand
        self.known = len(prompt_hashes)  # leading blocks hashed from prompt token ids (shareable)
        self.held: list[int] = []  # cached blocks it uses, block 0 first
        self.open = True  # still registering its prompt blocks (stops at one another request cached first)

    def hash_of(self, index: int) -> int:
        chain = self.chain
        while len(chain) <= index:
            chain.append(unique_hash(chain[-1] if chain else ROOT_HASH, self.uid, len(chain)))
        return chain[index]


def lookup(cache: PrefixCache, request: RequestBlocks, max_blocks: int) -> list[int]:
    """The hashes of the request's leading cached blocks, at most ``max_blocks`` (vLLM's longest cache hit)."""
    hits: list[int] = []
    for index in range(max_blocks):
        block_hash = request.hash_of(index)
        if block_hash not in cache.refs:
            break
        hits.append(block_hash)
    return hits


def register_prompt_blocks(cache: PrefixCache, request: RequestBlocks, full_blocks: int) -> None:
    """Cache the request's scheduled full prompt blocks (the first ``full_blocks``) it has not cached yet."""
    if not request.open:
        return
    for index in range(len(request.held), min(full_blocks, request.known)):
        block_hash = request.chain[index]
        if not cache.register(block_hash):
            request.open = False  # computed twice at once: this copy stays uncached, as do the blocks after it
            return
        request.held.append(block_hash)


def free_request(cache: PrefixCache, request: RequestBlocks, num_blocks: int, computed_blocks: int,
                 keep_own: bool) -> None:
    """Give back a request's blocks, last block first as vLLM frees them (so its tail is evicted first).

    ``keep_own`` (a preemption): its computed full blocks are cached too, so its recompute can hit them.
    """
    first_own = len(request.held)
    computed_blocks = max(min(computed_blocks, num_blocks), first_own) if keep_own else first_own
    cache.release_anonymous(num_blocks - computed_blocks)
    for index in range(computed_blocks - 1, first_own - 1, -1):
        block_hash = request.hash_of(index)
        if cache.register(block_hash):
            cache.release(block_hash)
        else:
            cache.release_anonymous(1)
    for block_hash in reversed(request.held):
        cache.release(block_hash)
    request.held = []
    request.open = True
