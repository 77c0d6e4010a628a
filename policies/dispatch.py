"""Dispatch: which generation instance serves each request.

``skewness-aware`` implements StreamRL's Algorithm 2: sort requests by predicted
length, mark the top ``long_tail_fraction`` as long-tail, split the N instances into
N_long + N_regular by enumerating every split with the instance-latency model
``PTL(BS) × L × ceil(M / BS)`` (long-tail L = P90 of predicted lengths, regular
L = P50), minimising the sum (as printed in the paper) or the max (makespan) of the two
groups' latencies. The groups decode at once, so a batch's generation time is the max; the
sum also charges the regular group's latency, which runs under the long group's, and stops
adding long-tail instances while the regular ones would idle most of the batch (streamrl-72b
at 20K: 11 long-tail instances, 8 regular ones idle 65 %). Neither prices when samples
reach a streaming trainer: ``max`` packs the regular 80 % onto fewer instances, so they
finish later, which costs more than the shorter makespan gains where the next batch waits
on training (stream-sync at 5K). Inside each group a request goes to the instance with
the least predicted work assigned, so long-tail instances end up running small batches.
Across heterogeneous pools the long-tail group is taken from the instances that decode
one sequence fastest (their order in the spec does not matter), and a group is priced
by its slowest instance.

``least-loaded`` sends each request to the instance with the least expected time of
predicted work outstanding (tokens over the instance's full-batch decode rate; on one kind
of instance, simply the least tokens).
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from policies.protocols import CostModel, Device
from policies.records import InstanceView, Request
from policies.registry import Factories, Registry


class DispatchPolicy(Protocol):
    def assign(self, requests: Sequence[Request], instances: Sequence[InstanceView]) -> list[int]:
        """The instance id for each request, in order."""
        ...


DISPATCH: Factories[DispatchPolicy] = Registry("dispatch")
# dispatches that rank requests by predicted length: with ``length_predictor: none`` every
# prediction is 0, so the first requests count as long-tail and every split prices alike
NEEDS_LENGTHS = frozenset({"skewness-aware"})
# dispatches whose choice reads predicted lengths at all (a request's ``predicted_tokens``,
# the views' ``assigned_tokens``); under any other the length predictor changes nothing
# here. tests/test_length_readers.py checks each registered dispatch against this.
READS_LENGTHS = NEEDS_LENGTHS | {"least-loaded"}


def _require(instances: Sequence[InstanceView]) -> None:
    if not instances:
        raise ValueError("dispatch needs at least one generation instance")


# the policies that may give an instance a second request while another idles (the stage
# model dispatches a batch over every instance for them: ``BatchShares.spreads``)
STACKING_DISPATCH = frozenset({"random"})


@DISPATCH.register("random")
class RandomDispatch:
    def __init__(self, rng: np.random.Generator | None = None) -> None:
        self._rng = rng if rng is not None else np.random.default_rng(0)

    def assign(self, requests: Sequence[Request], instances: Sequence[InstanceView]) -> list[int]:
        _require(instances)
        picks = self._rng.integers(0, len(instances), size=len(requests))
        return [instances[int(i)].instance_id for i in picks]


@DISPATCH.register("round-robin")
class RoundRobinDispatch:
    def __init__(self) -> None:
        self._cursor = 0

    def assign(self, requests: Sequence[Request], instances: Sequence[InstanceView]) -> list[int]:
        _require(instances)
        out = []
        for _ in requests:
            out.append(instances[self._cursor % len(instances)].instance_id)
            self._cursor += 1
        return out


@dataclass(frozen=True, order=True, slots=True)
class _Entry:
    """A heap entry: an instance's load when pushed and its position in its group (the
    tie-break); ``version`` tells a stale entry (the instance took work since)."""

    tokens: float
    count: float
    position: int
    instance_id: int = field(compare=False)
    version: int = field(compare=False)


@dataclass(slots=True)
class _Group:
    """Instances a pick is made among, with their positions (first listed wins a tie)."""

    ids: list[int]
    positions: dict[int, int]
    heap: list[_Entry]


class _Loads:
    """Predicted work per instance while a batch is being assigned; with ``weights`` (an
    instance's seconds a token relative to the fastest's) the work is priced in time.
    Each group of instances asked about keeps a heap, so a pick is O(log n), not O(n)."""

    def __init__(
        self, instances: Sequence[InstanceView], weights: dict[int, float] | None = None
    ) -> None:
        self.tokens = {v.instance_id: v.assigned_tokens for v in instances}
        self.count = {v.instance_id: v.num_assigned for v in instances}
        self._weights = weights
        self._version = dict.fromkeys(self.tokens, 0)
        self._groups: list[_Group] = []

    def lightest(self, ids: list[int]) -> int:
        """The least loaded of ``ids`` (by load, then by count); ties go to the one listed
        first. ``ids`` is a group: the same list object, unchanged, on every call."""
        heap = self._group_of(ids).heap
        while heap[0].version != self._version[heap[0].instance_id]:
            heapq.heappop(heap)  # pushed before the instance took more work
        return heap[0].instance_id

    def _group_of(self, ids: list[int]) -> _Group:
        for group in self._groups:
            if group.ids is ids:
                return group
        heap = [self._entry(i, k) for k, i in enumerate(ids)]
        heapq.heapify(heap)
        group = _Group(ids, {i: k for k, i in enumerate(ids)}, heap)
        self._groups.append(group)
        return group

    def _entry(self, instance_id: int, position: int) -> _Entry:
        tokens, count = self.tokens[instance_id], self.count[instance_id]
        if self._weights is not None:
            weight = self._weights[instance_id]
            tokens, count = tokens * weight, count * weight
        return _Entry(tokens, count, position, instance_id, self._version[instance_id])

    def add(self, instance_id: int, request: Request) -> None:
        self.tokens[instance_id] += request.predicted_tokens or 0.0
        self.count[instance_id] += 1
        self._version[instance_id] += 1
        for group in self._groups:  # every group holding it (there are one or two)
            position = group.positions.get(instance_id)
            if position is not None:
                heapq.heappush(group.heap, self._entry(instance_id, position))


@DISPATCH.register("least-loaded")
class LeastLoadedDispatch:
    """Least expected time outstanding: predicted tokens (requests when nothing is predicted)
    times the instance's seconds a token at its full batch, so across pools of different
    hardware an instance that decodes twice as fast takes twice the work. Instances of one
    shape (hardware, tp, ``max_num_seqs``, KV cache) are not priced at all: there it is the
    least predicted tokens outstanding, ties to the lowest id. The live runtime's servers are
    all of the first pool, so live dispatch balances tokens."""

    def __init__(self, cost_model: CostModel | None = None) -> None:
        self._cost = cost_model

    def assign(self, requests: Sequence[Request], instances: Sequence[InstanceView]) -> list[int]:
        _require(instances)
        loads = _Loads(instances, self._weights(requests, instances))
        ids = sorted(v.instance_id for v in instances)
        out = []
        for r in requests:
            target = loads.lightest(ids)
            loads.add(target, r)
            out.append(target)
        return out

    def _weights(
        self, requests: Sequence[Request], instances: Sequence[InstanceView]
    ) -> dict[int, float] | None:
        """Each instance's seconds a token over the fastest's; None on one shape."""
        shapes = {_shape(v): v for v in instances}
        if self._cost is None or len(shapes) < 2 or not requests:
            return None
        prompt = float(np.mean([r.prompt_tokens for r in requests]))
        length = float(np.mean([r.predicted_tokens or 0.0 for r in requests]))
        context = max(1, int(prompt + length / 2))
        per_token = {s: token_time_s(self._cost, v, context) for s, v in shapes.items()}
        fastest = min(per_token.values())
        return {v.instance_id: per_token[_shape(v)] / fastest for v in instances}


def _shape(view: InstanceView) -> tuple[str, int, int, int]:
    return view.hardware, view.tp, view.max_num_seqs, view.kv_capacity_tokens


def token_time_s(cost: CostModel, view: InstanceView, context_tokens: int) -> float:
    """Seconds a token on ``view`` decoding a full batch of sequences of ``context_tokens``
    each: ``max_num_seqs`` of them, or fewer when the KV cache is the limit."""
    batch = max(1, min(view.max_num_seqs, view.kv_capacity_tokens // context_tokens))
    step_s = cost.decode_step_s(Device(view.hardware, view.tp), batch, batch * context_tokens)
    return step_s / batch


def instance_latency_s(
    cost: CostModel,
    view: InstanceView,
    num_requests: int,
    length_tokens: float,
    prompt_tokens: float,
) -> float:
    """StreamRL's instance latency PTL(BS) × L × ceil(M / BS) for M requests on one instance."""
    if num_requests <= 0:
        return 0.0
    batch = min(num_requests, view.max_num_seqs)
    context = int(batch * (prompt_tokens + length_tokens / 2))
    ptl = cost.decode_step_s(Device(view.hardware, view.tp), batch, context)
    return ptl * length_tokens * math.ceil(num_requests / batch)


def group_latency_s(
    cost: CostModel,
    group: Sequence[InstanceView],
    num_requests: int,
    length_tokens: float,
    prompt_tokens: float,
) -> float:
    """A group's latency with its requests spread evenly: its slowest instance's."""
    each = math.ceil(num_requests / len(group))
    shapes = {(v.hardware, v.tp, v.max_num_seqs): v for v in group}
    return max(
        instance_latency_s(cost, v, each, length_tokens, prompt_tokens) for v in shapes.values()
    )


@DISPATCH.register("skewness-aware")
class SkewnessAwareDispatch:
    HISTORY = 4096  # recent predictions the length quantiles are taken over

    def __init__(
        self,
        cost_model: CostModel | None = None,
        objective: str = "sum",
        long_tail_fraction: float = 0.2,
    ) -> None:
        if cost_model is None:
            raise ValueError("skewness-aware dispatch needs a cost model")
        if objective not in ("sum", "max"):
            raise ValueError(f"dispatch_objective must be 'sum' or 'max', not {objective!r}")
        self._cost = cost_model
        self._objective = objective
        self._fraction = long_tail_fraction
        self._history: deque[float] = deque(maxlen=self.HISTORY)
        self._refresh_every = max(1, self.HISTORY // 64)
        self._since_refresh = 0
        self._quantiles = (0.0, 0.0, 0.0)  # p50, p90 and the long-tail threshold
        self.last_num_long: int | None = None  # the split chosen by the last call

    def assign(self, requests: Sequence[Request], instances: Sequence[InstanceView]) -> list[int]:
        _require(instances)
        preds = [r.predicted_tokens or 0.0 for r in requests]
        self._observe(preds)
        is_long = self._mark_long_tail(preds)
        p50, p90, _ = self._quantiles
        prompt = float(np.mean([r.prompt_tokens for r in requests])) if requests else 0.0
        ordered = self._fastest_first(instances, p90, prompt)
        if self.last_num_long is None or self._since_refresh == 0:
            self.last_num_long = self._split(ordered, requests, is_long, p50, p90, prompt)
        num_long = min(self.last_num_long, len(instances) - 1) if len(instances) > 1 else 0
        long_ids = [v.instance_id for v in ordered[:num_long]] or [v.instance_id for v in ordered]
        regular_ids = [v.instance_id for v in ordered[num_long:]] or long_ids
        return self._place(requests, instances, is_long, long_ids, regular_ids)

    def _fastest_first(
        self, instances: Sequence[InstanceView], length: float, prompt: float
    ) -> list[InstanceView]:
        """Instances by their time a token for one sequence (ties by id): the long tail runs
        small batches, so it goes to the hardware that decodes one sequence fastest."""
        context = int(prompt + length / 2)
        speed: dict[tuple[str, int], float] = {}
        for v in instances:
            key = (v.hardware, v.tp)
            if key not in speed:
                speed[key] = self._cost.decode_step_s(Device(*key), 1, context)
        return sorted(instances, key=lambda v: (speed[(v.hardware, v.tp)], v.instance_id))

    def _observe(self, preds: list[float]) -> None:
        """Track recent predictions; refresh quantiles (and the split) every so often."""
        self._history.extend(preds)
        self._since_refresh += len(preds)
        big_batch = len(preds) * self._fraction >= 5
        # while the history is short (a continuous mode sends a group at a time) each
        # call moves the quantiles: refresh every call until it holds a few refreshes' worth
        young = len(self._history) < 2 * self._refresh_every
        if big_batch or young or self._since_refresh >= self._refresh_every:
            qs = np.quantile(np.asarray(self._history), [0.5, 0.9, 1 - self._fraction])
            self._quantiles = (float(qs[0]), float(qs[1]), float(qs[2]))
            self._since_refresh = 0

    def _mark_long_tail(self, preds: list[float]) -> list[bool]:
        n = len(preds)
        if n * self._fraction >= 5:  # a whole batch: the top fraction by rank
            k = max(1, round(self._fraction * n))
            top = set(sorted(range(n), key=lambda i: -preds[i])[:k])
            return [i in top for i in range(n)]
        p50, _, threshold = self._quantiles
        # above the median too: where most predictions tie (a few groups seen, or a tail
        # thinner than the fraction) the quantile lands on the common length
        return [p > 0 and p >= threshold and p > p50 for p in preds]

    def _split(
        self,
        instances: Sequence[InstanceView],  # fastest first: the long group is a prefix
        requests: Sequence[Request],
        is_long: list[bool],
        p50: float,
        p90: float,
        prompt: float,
    ) -> int:
        n = len(instances)
        outstanding = sum(v.num_assigned for v in instances)
        total = len(requests) + outstanding
        m_long = max(sum(is_long), round(self._fraction * total))
        m_regular = total - m_long
        if n < 2 or m_long == 0 or m_regular == 0:
            return 0
        best, best_cost = 1, math.inf
        for n_long in range(1, n):
            lat_long = group_latency_s(self._cost, instances[:n_long], m_long, p90, prompt)
            lat_reg = group_latency_s(self._cost, instances[n_long:], m_regular, p50, prompt)
            cost = lat_long + lat_reg if self._objective == "sum" else max(lat_long, lat_reg)
            if cost < best_cost:
                best, best_cost = n_long, cost
        return best

    @staticmethod
    def _place(
        requests: Sequence[Request],
        instances: Sequence[InstanceView],
        is_long: list[bool],
        long_ids: list[int],
        regular_ids: list[int],
    ) -> list[int]:
        loads = _Loads(instances)
        out = [0] * len(requests)
        order = sorted(range(len(requests)), key=lambda i: -(requests[i].predicted_tokens or 0.0))
        for i in order:
            target = loads.lightest(long_ids if is_long[i] else regular_ids)
            loads.add(target, requests[i])
            out[i] = target
        return out
