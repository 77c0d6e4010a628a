"""Paged KV cache of one simulated vLLM engine: blocks, prefix sharing, eviction.

Follows vLLM V1's ``KVCacheManager`` / ``BlockPool`` (``vllm/v1/core/kv_cache_manager.py``,
``block_pool.py``) at block granularity:

* The cache holds ``num_blocks`` blocks of ``block_size`` tokens; a request holds
  ``ceil(tokens / block_size)`` blocks for the tokens it has slots for.
* Prefix caching: the full blocks of a prompt are shared by every request of the same
  *prefix key* — here ``(prompt id, weight version)``, because the live servers salt every
  request with the served version (``runtime/prompt_cache.py``): GRPO siblings of one
  version share their prompt's blocks, nothing is shared across an update. A preempted
  request's own full blocks stay cached too (vLLM hashes output blocks as well), so a
  resumed request skips the part that was not evicted.
* Blocks nobody references stay cached but count as free (vLLM's free queue holds them);
  when free blocks run short, the least recently released are evicted first, and within
  one request the last blocks first (``free_blocks`` appends a request's blocks in
  reverse), so a cached prefix shrinks from its end.

Simplification (a known bias): vLLM's free queue mixes never-cached and cached blocks in
release order; here never-cached free blocks are always taken before any cached one, which
keeps cached prefixes slightly longer than vLLM would.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable
from dataclasses import dataclass


def blocks_for(num_tokens: int, block_size: int) -> int:
    """Blocks that hold ``num_tokens`` tokens (``cdiv``)."""
    return -(-num_tokens // block_size)


@dataclass(slots=True)
class PrefixGroup:
    """The cached full prompt blocks of one prefix key, and who references them."""

    num_blocks: int = 0  # computed (or being computed this step) full prompt blocks
    num_refs: int = 0  # running requests holding them


class KVCache:
    """Block accounting: ``num_used`` blocks are referenced by running requests; the rest
    are free, ``num_cached`` of them still holding reusable KV (evicted on demand)."""

    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool) -> None:
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.num_used = 0
        self.num_releases = 0  # frees so far: free blocks and cached hits grow only then
        self._groups: dict[Hashable, PrefixGroup] = {}  # referenced prompt prefixes
        self._unreferenced: OrderedDict[Hashable, int] = OrderedDict()  # key -> cached blocks
        self._num_unreferenced = 0

    @property
    def num_free(self) -> int:
        """Free blocks, cached ones included (``BlockPool.get_num_free_blocks``)."""
        return self.num_blocks - self.num_used

    @property
    def usage(self) -> float:
        return self.num_used / self.num_blocks

    # -- allocation -----------------------------------------------------------------------

    def allocate(self, num_new_blocks: int) -> None:
        """Take ``num_new_blocks`` free blocks (the caller checked they exist); evict
        cached ones as needed."""
        assert 0 <= num_new_blocks <= self.num_blocks - self.num_used
        self.num_used += num_new_blocks
        if self._num_unreferenced > self.num_blocks - self.num_used:
            self._evict_to_fit()

    def take(self, num_new_blocks: int) -> None:
        """:meth:`allocate` without evicting yet (several takes, then :meth:`settle`)."""
        self.num_used += num_new_blocks

    def settle(self) -> None:
        """Evict what the takes since the last eviction left over (oldest first, so the
        same blocks as evicting after each take)."""
        if self._num_unreferenced > self.num_blocks - self.num_used:
            self._evict_to_fit()

    def free(self, num_blocks: int) -> None:
        """Release ``num_blocks`` blocks whose KV nobody will reuse."""
        self.num_used -= num_blocks
        self.num_releases += 1
        assert self.num_used >= 0

    def _evict_to_fit(self) -> None:
        excess = self._num_unreferenced - self.num_free
        while excess > 0:  # least recently released first, each from its end
            key, count = next(iter(self._unreferenced.items()))
            evicted = min(count, excess)
            excess -= evicted
            self._num_unreferenced -= evicted
            if evicted == count:
                del self._unreferenced[key]
            else:
                self._unreferenced[key] = count - evicted

    # -- cached blocks not referenced by anyone ---------------------------------------------

    def cached(self, key: Hashable) -> int:
        """Blocks of ``key`` still cached and referenced by nobody."""
        return self._unreferenced.get(key, 0) if self.enable_prefix_caching else 0

    def release_cached(self, key: Hashable, num_blocks: int) -> None:
        """``num_blocks`` used blocks become free but stay cached under ``key``."""
        self.free(num_blocks)
        if not self.enable_prefix_caching or num_blocks <= 0:
            return
        self._unreferenced[key] = self._unreferenced.pop(key, 0) + num_blocks
        self._num_unreferenced += num_blocks
        self._evict_to_fit()

    def touch_cached(self, key: Hashable, num_blocks: int) -> None:
        """Reuse the first ``num_blocks`` cached blocks of ``key`` (a hit): free -> used;
        any cached blocks past them are not reused and stay free, uncached."""
        count = self._unreferenced.pop(key, 0)
        assert num_blocks <= count, (key, num_blocks, count)
        self._num_unreferenced -= count
        self.num_used += num_blocks
        self._evict_to_fit()

    def drop_cached(self, key: Hashable) -> None:
        """Forget the cached blocks of ``key`` (they stay free)."""
        self._num_unreferenced -= self._unreferenced.pop(key, 0)

    # -- shared prompt prefixes ---------------------------------------------------------------

    def prefix_hit_blocks(self, key: Hashable) -> int:
        """Full prompt blocks of ``key`` a new request can reuse (referenced or cached)."""
        if not self.enable_prefix_caching:
            return 0
        group = self._groups.get(key)
        return group.num_blocks if group is not None else self.cached(key)

    def join_prefix(self, key: Hashable, num_hit_blocks: int) -> None:
        """A request admitted with ``num_hit_blocks`` blocks of ``key``'s prefix."""
        group = self._groups.get(key)
        if group is None:
            self.touch_cached(key, num_hit_blocks)
            group = self._groups[key] = PrefixGroup(num_blocks=num_hit_blocks)
        group.num_refs += 1

    def grow_prefix(self, key: Hashable, num_blocks: int) -> int:
        """The group's cached prefix grows to ``num_blocks`` (its first request computes
        them); returns how many blocks moved into the shared prefix."""
        group = self._groups[key]
        grown = max(0, num_blocks - group.num_blocks)
        group.num_blocks += grown
        return grown

    def leave_prefix(self, key: Hashable) -> None:
        """A request stops referencing ``key``'s prefix; the last one leaves it cached."""
        group = self._groups[key]
        group.num_refs -= 1
        if group.num_refs == 0:
            del self._groups[key]
            self.release_cached(key, group.num_blocks)

    def prefix_blocks(self, key: Hashable) -> int:
        group = self._groups.get(key)
        return 0 if group is None else group.num_blocks
