"""How a waiting request would start in a simulated vLLM engine: its prefix-cache hit,
its first prefill chunk and the blocks it takes (``Scheduler.schedule``'s waiting loop,
``_get_local_prefix_cache_hit`` and ``KVCacheManager.allocate_slots`` with
``full_sequence_must_fit``).

A hit covers full blocks only and at most ``num_tokens - 1`` tokens (one token is always
computed). It is the cached blocks of the request's prompt prefix (same prompt, same
weight version), then — for a request preempted before — its own cached blocks after
them, as far as they are contiguous. The request starts only if its whole sequence fits
the free blocks (cached blocks it reuses count as free ones it takes).
"""

from __future__ import annotations

from dataclasses import dataclass

from sim.kv_cache import KVCache, blocks_for
from sim.sequence import EngineLimits, Seq


@dataclass(slots=True, frozen=True)
class Admission:
    shared: int  # prefix blocks it shares
    own_reuse: int  # its own cached blocks it takes back (a resumed request)
    num_new_tokens: int  # its first chunk
    num_new_blocks: int


def plan_admission(
    seq: Seq, kv: KVCache, limits: EngineLimits, num_free: int, budget: int
) -> Admission | None:
    """How ``seq`` would start with ``num_free`` free blocks and ``budget`` tokens left in
    the step, or None if it cannot (it then blocks the queue)."""
    B = limits.block_size
    num_tokens = seq.num_tokens()
    prefix = kv.prefix_hit_blocks(seq.prefix_key)
    hit = prefix
    if seq.num_preemptions and prefix >= seq.shared_at_preemption:  # its own blocks follow
        hit = max(prefix, seq.shared_at_preemption + kv.cached(seq.own_cache_key))
    hit = min(hit, (num_tokens - 1) // B)
    shared = min(prefix, hit)
    num_new = num_tokens - hit * B
    if not limits.enable_chunked_prefill and num_new > budget:
        return None
    num_new = min(num_new, budget)
    referenced = shared if kv.prefix_blocks(seq.prefix_key) else 0
    if blocks_for(num_tokens, B) - referenced > num_free:  # the whole sequence must fit
        return None
    return Admission(shared, hit - shared, num_new, blocks_for(hit * B + num_new, B) - hit)


def take_admission(seq: Seq, a: Admission, kv: KVCache, block_size: int) -> None:
    """Take the blocks of admission ``a``; ``seq``'s counts start from its hit."""
    kv.join_prefix(seq.prefix_key, a.shared)
    if a.own_reuse:
        kv.touch_cached(seq.own_cache_key, a.own_reuse)
    else:
        kv.drop_cached(seq.own_cache_key)
    kv.allocate(a.num_new_blocks)
    seq.num_shared_blocks = a.shared
    seq.num_own_blocks = a.own_reuse + a.num_new_blocks
    seq.num_computed = (a.shared + a.own_reuse) * block_size


def grow_prefix(seq: Seq, kv: KVCache, block_size: int, num_slotted_tokens: int) -> None:
    """Full prompt blocks ``seq`` is about to compute past its prompt's cached prefix extend
    that prefix (vLLM caches a block when it allocates it, keyed by its tokens, whoever
    computes it); they are shared from now on."""
    full = min(seq.prompt_tokens, num_slotted_tokens) // block_size
    grown = kv.grow_prefix(seq.prefix_key, full)
    seq.num_shared_blocks += grown
    seq.num_own_blocks -= grown
