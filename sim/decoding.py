"""The decoding sequences of one engine, kept lazily against the scheduler's step count.

A decoding sequence computes one token a step, so its computed count is ``base + steps``
and it finishes after a known step. Kept this way, a run of ``k`` identical decode steps
costs nothing per sequence: the blocks the run needs follow from how the bases fall
against block boundaries (a histogram of ``base mod block_size``), and the next finish
sits at the top of a heap.
"""

from __future__ import annotations

import heapq

from sim.kv_cache import blocks_for
from sim.sequence import Seq, SeqStatus

# a sequence's finishing step in the heap, as (step, arrival, seq); arrivals are unique,
# so seqs are never compared; an entry is stale once the sequence moved on
_FinishEntry = tuple[int, int, Seq]


class DecodingSet:
    def __init__(self, block_size: int) -> None:
        self.block_size = block_size
        # sequences by base mod block size: those of one class need a block in the same steps
        self._classes: list[dict[Seq, None]] = [{} for _ in range(block_size)]
        self._finishes: list[_FinishEntry] = []
        self.num_seqs = 0
        self._sum_base = 0

    def __len__(self) -> int:
        return self.num_seqs

    # -- membership -------------------------------------------------------------------

    def add(self, seq: Seq, steps: int) -> None:
        """Explicit counts -> lazy: ``computed = base + steps`` from now on."""
        seq.status = SeqStatus.DECODING
        seq.base = seq.num_computed - steps
        # outputs = computed - prompt + 1 reach the target after this step:
        seq.finish_step = seq.target_tokens + seq.prompt_tokens - 1 - seq.base
        self._count(seq, +1)
        heapq.heappush(self._finishes, (seq.finish_step, seq.arrival, seq))

    def remove(self, seq: Seq, steps: int) -> None:
        """Lazy -> explicit counts; the caller gives the sequence its next status."""
        seq.num_computed = seq.base + steps
        seq.num_output = seq.num_computed - seq.prompt_tokens + 1
        seq.num_own_blocks = blocks_for(seq.num_computed, self.block_size) - seq.num_shared_blocks
        self._count(seq, -1)
        seq.status = SeqStatus.PREFILLING  # not decoding any more (the finish entry goes stale)

    def skip(self, seq: Seq) -> None:
        """The sequence was not scheduled this step: it stays one token behind."""
        self._count(seq, -1)
        seq.base -= 1
        seq.finish_step += 1
        self._count(seq, +1)
        heapq.heappush(self._finishes, (seq.finish_step, seq.arrival, seq))

    def _count(self, seq: Seq, sign: int) -> None:
        members = self._classes[seq.base % self.block_size]
        if sign > 0:
            members[seq] = None
        else:
            del members[seq]
        self.num_seqs += sign
        self._sum_base += sign * seq.base

    # -- what the next steps need ---------------------------------------------------------

    def context_tokens(self, steps: int) -> int:
        """KV tokens the sequences attend to in the next step."""
        return self._sum_base + self.num_seqs * steps

    def blocks_needed(self, step: int) -> int:
        """Blocks needed by scheduler step number ``step`` (1-based): the sequences whose
        computed count before it, ``base + step - 1``, sits on a block boundary."""
        return len(self._classes[-(step - 1) % self.block_size])

    def needing_block(self, step: int) -> list[Seq]:
        """The sequences that need a new block in scheduler step number ``step``."""
        return list(self._classes[-(step - 1) % self.block_size])

    def blocks_consumed(self, steps: int, num_steps: int) -> int:
        """Blocks needed over the ``num_steps`` steps after step ``steps``: each sequence
        needs one block every ``block_size`` steps."""
        full, part = divmod(num_steps, self.block_size)
        classes, B = self._classes, self.block_size
        return full * self.num_seqs + sum(len(classes[-(steps + t) % B]) for t in range(part))

    def first_exhausted_step(self, steps: int, num_free_blocks: int) -> int:
        """The first step after ``steps`` (counted from 1) that needs more blocks than
        ``num_free_blocks``."""
        classes, B = self._classes, self.block_size
        cycles = num_free_blocks // self.num_seqs
        left = num_free_blocks - cycles * self.num_seqs  # after whole cycles; < num_seqs
        first = steps + cycles * B
        for t in range(B):  # step first + t + 1 needs the class -(first + t) mod B
            left -= len(classes[-(first + t) % B])
            if left < 0:
                return cycles * B + t + 1
        raise AssertionError("a full cycle needs one block per decoding sequence")

    # -- finishes -----------------------------------------------------------------------

    def first_finish_step(self) -> int | None:
        while self._finishes:
            step, _, seq = self._finishes[0]
            if seq.status == SeqStatus.DECODING and seq.finish_step == step:
                return step
            heapq.heappop(self._finishes)  # stale
        return None

    def pop_finished(self, steps: int) -> list[Seq]:
        """Remove and return (in finishing order) every sequence done by step ``steps``."""
        done = []
        while (step := self.first_finish_step()) is not None and step <= steps:
            seq = heapq.heappop(self._finishes)[2]
            self.remove(seq, step)
            done.append(seq)
        return done
