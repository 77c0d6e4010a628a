"""The scheduler of one simulated vLLM engine: vLLM V1's ``Scheduler.schedule`` step by
step, plus exact runs of identical decode steps. Pure Python, no SimPy, no time.

Each rule follows the vLLM function named beside it (``vllm/v1/core/sched/scheduler.py``):

* A step has a token budget, ``max_num_batched_tokens`` (``schedule``). Running requests
  are scheduled first, in the order they were admitted, each for the tokens its computed
  count lags: one for a decoding sequence, a chunk for a prefill (decode before prefill).
* A running request that cannot get the blocks it needs preempts the lowest-priority
  running request (``priority``: the largest (priority, arrival); ``fcfs``: the last
  admitted), possibly itself, until it fits; having preempted itself, it ends the running
  pass (``schedule``, the ``allocate_slots`` loop). Preemption is by recompute: its
  blocks are freed but stay cached, and it waits again (``_preempt_request``).
* Waiting requests are admitted only in a step that preempted nothing, while the budget
  lasts and fewer than ``max_num_seqs`` run, in queue order (``priority``: (priority,
  arrival); ``fcfs``: the last preempted first, then arrival), stopping at the first
  that does not fit (``schedule``, the waiting loop). Prefix-cache hits are not computed
  again (``_get_local_prefix_cache_hit``; at most ``num_tokens - 1`` tokens), the rest is
  prefilled in chunks within the budget (chunked prefill), and a request is admitted only
  if its whole sequence fits the free blocks (``KVCacheManager.allocate_slots`` with
  ``full_sequence_must_fit``).
* The step whose tokens catch a request's computed count up with its tokens samples its
  next token (``update_from_output``): the first output token comes with the prefill.

Between events every running sequence decodes one token a step; :meth:`Scheduler.decode_run`
says how many such identical steps are safe (up to the next finish, before the KV cache
runs out, and none while a waiting request could be admitted) and
:meth:`Scheduler.advance_decode` takes them at once, exactly as step by step would.
"""

from __future__ import annotations

import itertools

from policies.records import FinishReason, Request
from sim.admission import Admission, grow_prefix, plan_admission, take_admission
from sim.decoding import DecodingSet
from sim.kv_cache import KVCache, blocks_for
from sim.queues import Victims, WaitingQueue
from sim.sequence import EngineLimits, Seq, SeqStatus, StepPlan


class SequenceTooLong(ValueError):
    """One sequence needs more blocks than the whole KV cache holds."""


class Scheduler:
    def __init__(self, limits: EngineLimits) -> None:
        self.limits = limits
        self.kv = KVCache(limits.num_blocks, limits.block_size, limits.enable_prefix_caching)
        self.decoding = DecodingSet(limits.block_size)
        self.steps = 0  # steps taken (decoding sequences' counts are kept against it)
        self.num_preemptions = 0
        self.num_recomputed_tokens = 0  # tokens prefilled again after a preemption
        self.running: dict[Seq, None] = {}  # in admission order
        self._prefilling: dict[Seq, None] = {}  # running, computing their prompt (in order)
        self._waiting = WaitingQueue(limits.scheduling_policy)
        self._victims = Victims(limits.scheduling_policy, self.running)
        self._admissions = itertools.count()
        self._refused: tuple[tuple, int] | None = None  # the last head that could not start
        self._arrivals = itertools.count()

    # -- queue --------------------------------------------------------------------------

    def add(
        self, request: Request, target_tokens: int, finish_reason: FinishReason,
        priority: float, version: int, dispatch_ticks: int,
    ) -> Seq:  # fmt: skip
        """Queue a request; its prompt is shared with others of the same prompt and version."""
        seq = Seq(
            request, target_tokens, finish_reason, next(self._arrivals), priority,
            (request.prompt_id, version), dispatch_ticks,
        )  # fmt: skip
        largest = blocks_for(seq.prompt_tokens + target_tokens - 1, self.limits.block_size)
        if largest > self.limits.num_blocks:
            raise SequenceTooLong(
                f"sample {request.sample_id}: one sequence does not fit the KV cache "
                f"({self.limits.num_blocks} blocks of {self.limits.block_size} tokens)"
            )
        self._waiting.push(seq)
        return seq

    @property
    def num_waiting(self) -> int:
        return len(self._waiting)

    @property
    def num_running(self) -> int:
        return len(self.running)

    @property
    def idle(self) -> bool:
        return not self.running and not self._waiting

    def computed(self, seq: Seq) -> int:
        return seq.base + self.steps if seq.status == SeqStatus.DECODING else seq.num_computed

    # -- one step -------------------------------------------------------------------------

    def schedule(self, admit: bool = True) -> StepPlan:
        """Plan the next step (``admit``: waiting requests may start)."""
        plan = StepPlan(budget=self.limits.max_num_batched_tokens)
        self._schedule_running(plan)
        if admit and not plan.num_preempted:
            self._schedule_waiting(plan)
        self._account(plan)
        if plan.empty and not plan.num_preempted and self._waiting and not self.running and admit:
            head = self._waiting.head()
            raise ValueError(  # a backstop: sim.cluster.check_prefill_budget refuses it first
                f"sample {head.request.sample_id} cannot be scheduled: its {head.num_tokens()} "
                "tokens (its prompt, and its output so far if it was preempted) exceed "
                f"max_num_batched_tokens ({self.limits.max_num_batched_tokens}) with chunked "
                "prefill off (cluster.generation.*.enable_chunked_prefill)"
            )
        return plan

    def _schedule_running(self, plan: StepPlan) -> None:
        self._running_pass(plan)
        self.kv.settle()

    def _running_pass(self, plan: StepPlan) -> None:
        """The running pass. Only the decoding sequences on a block boundary and the
        prefills take blocks, so only they are visited (in running order); every other
        decoding sequence decodes. If the budget could run out inside the pass, every
        request is visited one by one instead."""
        prefilling = list(self._prefilling)
        chunks = sum(s.num_tokens() - s.num_computed for s in prefilling)
        if len(self.decoding) + chunks > plan.budget:
            self._one_by_one(plan)
            return
        plan.all_decoders = True
        if self._schedule_running_at_once(prefilling, plan):
            return
        kv = self.kv
        needing = self.decoding.needing_block(self.steps + 1)
        for seq in sorted(needing + prefilling, key=lambda s: s.admit_index):
            status = seq.status
            if status == SeqStatus.WAITING:  # preempted earlier in this pass
                continue
            if status == SeqStatus.DECODING and kv.num_used < kv.num_blocks:
                kv.num_used += 1  # its next block (kv.take(1))
                plan.extra_blocks[seq] = 1
                continue
            computed = self.computed(seq)
            tokens = computed + 1 if status == SeqStatus.DECODING else seq.num_tokens()
            if not self._take_blocks(seq, computed, tokens, plan):
                self._sit_out_after(seq.admit_index, plan)
                break
            if status == SeqStatus.PREFILLING:
                plan.scheduled[seq] = tokens - computed
                plan.budget -= tokens - computed
        plan.budget -= len(self.decoding) - len(plan.skipped)

    def _schedule_running_at_once(self, prefilling: list[Seq], plan: StepPlan) -> bool:
        """The pass when the free blocks cover every need (nothing preempts): all blocks
        taken together. False (nothing done) otherwise."""
        B = self.limits.block_size
        needs = [
            blocks_for(s.num_tokens(), B) - s.num_own_blocks - s.num_shared_blocks
            for s in prefilling
        ]
        decode_blocks = self.decoding.blocks_needed(self.steps + 1)
        if decode_blocks + sum(needs) > self.kv.num_free:
            return False
        self.kv.allocate(decode_blocks + sum(needs))
        for seq, need in zip(prefilling, needs):
            seq.num_own_blocks += need
            self._grow_prefix(seq, seq.num_tokens())
            chunk = seq.num_tokens() - seq.num_computed
            plan.scheduled[seq] = chunk
            plan.budget -= chunk
        plan.budget -= len(self.decoding)
        return True

    def _take_blocks(self, seq: Seq, computed: int, tokens: int, plan: StepPlan) -> bool:
        """Blocks for ``seq`` to hold ``tokens``, preempting lower-priority requests as
        needed; False if it had to preempt itself."""
        decoding = seq.status == SeqStatus.DECODING
        held = blocks_for(computed, self.limits.block_size) if decoding else (
            seq.num_own_blocks + seq.num_shared_blocks
        )  # fmt: skip
        need = blocks_for(tokens, self.limits.block_size) - held
        while need > self.kv.num_free:
            victim = self._victims.next()
            self._preempt(victim, plan)
            if victim is seq:
                return False
        self.kv.take(need)
        if decoding:
            plan.extra_blocks[seq] = need
        else:
            seq.num_own_blocks += need
            self._grow_prefix(seq, tokens)
        return True

    def _sit_out_after(self, admit_index: int, plan: StepPlan) -> None:
        """``if new_blocks is None: break``: the running requests after the one that
        preempted itself are not scheduled in this step."""
        for seq in reversed(self.running):
            if seq.admit_index < admit_index:
                break
            if seq.status == SeqStatus.DECODING:
                plan.skipped.add(seq)

    def _one_by_one(self, plan: StepPlan) -> None:
        """The running pass visiting every request in order (the budget may run out)."""
        for seq in list(self.running):
            if plan.budget <= 0:
                break
            if seq not in self.running:  # preempted earlier in this pass
                continue
            computed = self.computed(seq)
            decoding = seq.status == SeqStatus.DECODING
            num_new = 1 if decoding else min(seq.num_tokens() - computed, plan.budget)
            if not self._take_blocks(seq, computed, computed + num_new, plan):
                return
            plan.scheduled[seq] = num_new
            plan.budget -= num_new

    def _schedule_waiting(self, plan: StepPlan) -> None:
        while plan.budget > 0 and self._waiting and self.num_running < self.limits.max_num_seqs:
            seq = self._waiting.head()
            admission = plan_admission(seq, self.kv, self.limits, self.kv.num_free, plan.budget)
            if admission is None:
                break
            self._waiting.pop()
            self._admit(seq, admission)
            plan.admitted.append(seq)
            plan.scheduled[seq] = admission.num_new_tokens
            plan.budget -= admission.num_new_tokens

    def _admit(self, seq: Seq, admission: Admission) -> None:
        take_admission(seq, admission, self.kv, self.limits.block_size)
        seq.status = SeqStatus.PREFILLING
        seq.admit_index = next(self._admissions)
        self.running[seq] = None
        self._prefilling[seq] = None
        self._victims.admitted(seq)
        self._grow_prefix(seq, seq.num_computed + admission.num_new_tokens)

    def _grow_prefix(self, seq: Seq, num_slotted_tokens: int) -> None:
        grow_prefix(seq, self.kv, self.limits.block_size, num_slotted_tokens)

    def _preempt(self, seq: Seq, plan: StepPlan) -> None:
        """Preempt by recompute: free (and keep cached) its blocks, queue it again."""
        del self.running[seq]
        extra = plan.extra_blocks.pop(seq, 0)
        if seq in plan.scheduled:
            plan.budget += plan.scheduled.pop(seq)
        if seq.status == SeqStatus.DECODING:
            self.decoding.remove(seq, self.steps)
        else:
            del self._prefilling[seq]
        own = seq.num_own_blocks + extra
        cached = min(
            own, max(0, seq.num_computed // self.limits.block_size - seq.num_shared_blocks)
        )
        self.kv.release_cached(seq.own_cache_key, cached)
        self.kv.free(own - cached)
        self.kv.leave_prefix(seq.prefix_key)
        seq.shared_at_preemption = seq.num_shared_blocks
        seq.num_shared_blocks = seq.num_own_blocks = seq.num_computed = 0
        seq.num_preemptions += 1
        self.num_preemptions += 1
        plan.num_preempted += 1
        self._waiting.push(seq)

    def _account(self, plan: StepPlan) -> None:
        if plan.all_decoders:
            skipped = sum(self.computed(seq) for seq in plan.skipped)
            plan.num_decode = len(self.decoding) - len(plan.skipped)
            plan.decode_context_tokens = self.decoding.context_tokens(self.steps) - skipped
        for seq, num_new in plan.scheduled.items():
            computed = self.computed(seq)
            if seq.status == SeqStatus.DECODING:
                plan.num_decode += 1
                plan.decode_context_tokens += computed
                continue
            plan.num_prefill_tokens += num_new
            plan.prefill_attention_pairs += num_new * computed + num_new * (num_new + 1) // 2
            plan.prefill_context_tokens += computed + num_new
            if seq.num_preemptions:
                self.num_recomputed_tokens += num_new

    def finish_step(self, plan: StepPlan) -> list[Seq]:
        """The planned step ran: advance every scheduled request; returns the finished.
        An empty step (it only preempted) computes nothing and counts as no step."""
        if plan.empty:
            return []
        self.steps += 1
        num_decoding = len(self.decoding)
        finished = []
        for seq, num_new in plan.scheduled.items():
            if seq.status == SeqStatus.DECODING:
                continue  # advanced with the step count
            seq.num_computed += num_new
            if seq.num_computed < seq.num_tokens():
                continue  # a prefill chunk: no token yet
            seq.num_output += 1
            del self._prefilling[seq]
            if seq.num_output >= seq.target_tokens:
                self._finish(seq)
                finished.append(seq)
            else:
                self.decoding.add(seq, self.steps)
        if plan.all_decoders:
            for seq in plan.skipped:
                self.decoding.skip(seq)
        elif plan.num_decode < num_decoding:  # some decoders sat this step out
            for seq in self.running:
                if seq.status == SeqStatus.DECODING and seq not in plan.scheduled:
                    self.decoding.skip(seq)
        return finished + self._pop_finished()

    # -- runs of identical decode steps ---------------------------------------------------

    def decode_run(self, admit: bool = True) -> int:
        """How many next steps are identical decode-only steps (0: take one step with
        :meth:`schedule`): every running sequence decodes, none finishes before the last
        of them, the KV cache holds, and no waiting request could start."""
        if not len(self.decoding) or self._prefilling:
            return 0
        if admit and self._waiting and self._could_admit_next_step():
            return 0
        finish = self.decoding.first_finish_step()
        assert finish is not None
        exhausted = self.decoding.first_exhausted_step(self.steps, self.kv.num_free)
        return min(finish - self.steps, exhausted - 1)

    def _could_admit_next_step(self) -> bool:
        if self.num_running >= self.limits.max_num_seqs:
            return False
        budget = self.limits.max_num_batched_tokens - len(self.decoding)
        free = self.kv.num_free - self.decoding.blocks_needed(self.steps + 1)
        head = self._waiting.head()
        # refused before with as many free blocks or more, nothing freed since: refused
        key = (head, self.num_running, self.kv.num_releases)
        if self._refused is not None and self._refused[0] == key and free <= self._refused[1]:
            return False
        if budget > 0 and plan_admission(head, self.kv, self.limits, free, budget) is not None:
            return True
        self._refused = (key, free)
        return False

    def advance_decode(self, num_steps: int) -> list[Seq]:
        """Take ``num_steps`` decode-only steps (at most :meth:`decode_run`); returns the
        sequences that finished in the last of them."""
        self.kv.allocate(self.decoding.blocks_consumed(self.steps, num_steps))
        self.steps += num_steps
        return self._pop_finished()

    def _pop_finished(self) -> list[Seq]:
        done = self.decoding.pop_finished(self.steps)
        for seq in done:
            self._finish(seq)
        return done

    def _finish(self, seq: Seq) -> None:
        self.kv.free(seq.num_own_blocks)
        self.kv.leave_prefix(seq.prefix_key)
        seq.num_own_blocks = seq.num_shared_blocks = 0
        seq.status = SeqStatus.FINISHED
        del self.running[seq]

    def abort_running(self) -> list[Seq]:
        """Abort every running request (in admission order); their blocks are freed."""
        aborted = list(self.running)
        for seq in aborted:
            if seq.status == SeqStatus.DECODING:
                self.decoding.remove(seq, self.steps)
            else:
                del self._prefilling[seq]
            self._finish(seq)
        return aborted
