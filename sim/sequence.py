"""A request inside a simulated vLLM engine, and the limits of one engine.

Token counts follow vLLM V1's ``Request``: ``num_tokens`` = prompt + generated tokens,
``num_computed_tokens`` = tokens whose KV is computed. A running request catches its
computed tokens up with its tokens (prefill, possibly in chunks); the step that catches
up samples its next token. While *decoding* (one token a step) a sequence's counts are
kept lazily against the scheduler's step counter (``computed = base + steps``), so a run
of identical decode steps costs nothing per sequence.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from enum import Enum, auto

from policies.cluster import GenerationPool
from policies.protocols import Device
from policies.records import FinishReason, Request


class SeqStatus(Enum):
    WAITING = auto()  # queued (new, or preempted)
    PREFILLING = auto()  # running, computed tokens behind its tokens
    DECODING = auto()  # running, one token a step (counts kept lazily)
    FINISHED = auto()


@dataclass(slots=True, frozen=True)
class EngineLimits:
    """One engine's scheduler and KV-cache limits, with vLLM's names (``SchedulerConfig``,
    ``CacheConfig``)."""

    max_num_seqs: int
    max_num_batched_tokens: int
    block_size: int
    num_blocks: int
    enable_chunked_prefill: bool = True
    enable_prefix_caching: bool = True
    scheduling_policy: str = "priority"  # "priority" (what tandem's servers run) or "fcfs"

    def __post_init__(self) -> None:
        if self.max_num_batched_tokens < self.max_num_seqs:
            raise ValueError(
                f"max_num_batched_tokens ({self.max_num_batched_tokens}) must be at least "
                f"max_num_seqs ({self.max_num_seqs}), as vLLM requires"
            )
        if self.scheduling_policy not in ("priority", "fcfs"):
            raise ValueError(
                f"scheduling_policy must be priority or fcfs, not {self.scheduling_policy!r}"
            )


NULL_BLOCKS = 1  # ``BlockPool``'s null block, never allocated


def engine_limits(pool: GenerationPool, kv_capacity_tokens: int) -> EngineLimits:
    """The limits of an instance of ``pool`` whose KV cache holds ``kv_capacity_tokens``
    (vLLM keeps one block of its cache as the null block: the rest hold KV)."""
    num_blocks = pool.num_gpu_blocks_override or kv_capacity_tokens // pool.block_size
    return EngineLimits(
        max_num_seqs=pool.max_num_seqs,
        max_num_batched_tokens=pool.max_num_batched_tokens,
        block_size=pool.block_size,
        num_blocks=num_blocks - NULL_BLOCKS,
        enable_chunked_prefill=pool.enable_chunked_prefill,
        enable_prefix_caching=pool.enable_prefix_caching,
        scheduling_policy=pool.scheduling_policy,
    )


@dataclass(frozen=True, slots=True)
class EngineKvCache:
    """The KV cache the simulated engine of a pool's instance gets (:func:`engine_limits`
    from the cost model's ``kv_capacity_tokens``), in tokens (satisfies
    ``policies.stage_model.KvCache``)."""

    kv_capacity_tokens: Callable[[Device], int]  # the cost model's

    def kv_tokens(self, pool: GenerationPool) -> int:
        device = Device(pool.hardware, pool.tp)
        limits = engine_limits(pool, self.kv_capacity_tokens(device))
        return limits.num_blocks * limits.block_size


@dataclass(slots=True, eq=False)
class Seq:
    request: Request
    target_tokens: int  # output tokens it will generate (true length capped by max_tokens)
    finish_reason: FinishReason
    arrival: int  # order of arrival at this engine (vLLM's arrival_time)
    priority: float  # smaller first (vLLM's priority policy)
    prefix_key: Hashable  # (prompt id, weight version at arrival): who shares its prompt
    dispatch_ticks: int
    status: SeqStatus = SeqStatus.WAITING
    num_output: int = 0  # generated tokens (explicit while not decoding)
    num_computed: int = 0  # tokens with KV (explicit while not decoding)
    base: int = 0  # while decoding: computed = base + scheduler steps
    finish_step: int = 0  # while decoding: scheduler step after which it is done
    num_own_blocks: int = 0  # blocks it holds alone (explicit while not decoding)
    num_shared_blocks: int = 0  # blocks of its prompt prefix it shares
    shared_at_preemption: int = 0  # shared blocks when last preempted (cache lookup)
    num_preemptions: int = 0
    admit_index: int = -1  # order of its (latest) admission: the running order
    version_start: int | None = None
    gen_start_ticks: int | None = None
    waiting_key: tuple = field(default=())

    @property
    def prompt_tokens(self) -> int:
        return self.request.prompt_tokens

    @property
    def own_cache_key(self) -> Hashable:
        return ("seq", self.request.sample_id)

    def num_tokens(self) -> int:
        """Prompt + generated tokens (explicit counts; not while decoding)."""
        return self.prompt_tokens + self.num_output


class StepPlan:
    """One scheduled step: who computes how many tokens, and what that amounts to. (A
    plain class with slots: one is made every step.)"""

    __slots__ = (
        "budget", "scheduled", "all_decoders", "skipped", "extra_blocks", "admitted",
        "num_preempted", "num_decode", "decode_context_tokens", "num_prefill_tokens",
        "prefill_attention_pairs", "prefill_context_tokens",
    )  # fmt: skip

    def __init__(self, budget: int) -> None:
        self.budget = budget  # tokens left in the step's budget
        self.scheduled: dict[Seq, int] = {}  # seq -> tokens this step
        self.all_decoders = False  # every decoding sequence decodes but the skipped (unlisted)
        self.skipped: set[Seq] = set()  # decoding, sitting this step out
        self.extra_blocks: dict[Seq, int] = {}  # decoders' new blocks (if any may be preempted)
        self.admitted: list[Seq] = []
        self.num_preempted = 0
        self.num_decode = 0  # sequences decoding one token
        self.decode_context_tokens = 0  # KV tokens they attend to
        self.num_prefill_tokens = 0  # prompt (or recompute) tokens of the prefill chunks
        self.prefill_attention_pairs = 0  # Σ over chunk tokens of the positions they attend to
        self.prefill_context_tokens = 0  # KV tokens the chunks attend to (their ends)

    @property
    def empty(self) -> bool:
        return not self.scheduled and not self.num_decode

    @property
    def num_scheduled(self) -> int:
        return len(self.scheduled) + (self.num_decode if self.all_decoders else 0)
