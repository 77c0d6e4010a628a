"""LagBudget: exact unit cases, and random interleavings that never break a deadline or deadlock."""

from __future__ import annotations

from dataclasses import dataclass, field

from hypothesis import given, settings
from hypothesis import strategies as st

from policies.modes.lag import LagBudget


def test_deadline_is_version_plus_max_lag():
    assert LagBudget(4, 2).deadline(3) == 5


def test_sync_budget_admits_exactly_one_batch():
    b = LagBudget(batch_size=2, max_lag=0)
    assert b.can_start(0, 2)
    assert not b.can_start(0, 3)
    b.start(0, 2)
    assert not b.can_start(0, 1)  # step 0's two slots are spoken for
    assert b.can_place(0)
    assert b.place(0) is False
    assert b.place(0) is True  # the step filled: step 1 is being filled now
    assert (b.step, b.filled) == (1, 0)
    assert not b.can_start(0, 1)  # deadline 0 has passed
    assert b.can_start(1, 2)
    assert not b.can_start(1, 3)


def test_lag_one_admits_two_batches_of_old_weights():
    b = LagBudget(batch_size=2, max_lag=1)
    assert b.can_start(0, 4)
    assert not b.can_start(0, 5)
    b.start(0, 4)
    assert not b.can_start(0, 1)
    assert b.can_start(1, 2)  # deadline 2 has its own two slots
    assert not b.can_start(1, 3)


def test_a_later_sample_waits_while_earlier_ones_need_the_slots():
    b = LagBudget(batch_size=2, max_lag=0)
    b.start(0, 2)  # two samples due at step 0, still generating
    b.start(1, 1)  # one due at step 1 finished first
    assert not b.can_place(1)  # taking it would leave step 0 one slot short
    b.place(0)
    assert not b.can_place(1)
    assert b.place(0) is True
    assert b.can_place(1)  # step 1 is being filled now


def test_retarget_moves_a_sample_to_its_later_deadline():
    b = LagBudget(batch_size=1, max_lag=0)
    b.start(0, 1)
    assert not b.can_start(0, 1)
    b.retarget(0, 1)  # it really started with version 1: step 0 has a free slot again
    assert b.can_start(0, 1)


# -- random interleavings ------------------------------------------------------------------


@dataclass
class World:
    """A toy pipeline around a LagBudget: the policy, with time and weights abstracted."""

    budget: LagBudget
    total: int
    loaded: int = 0  # weight version the generators hold (≤ budget.step)
    started: int = 0
    running: list[tuple[int, int]] = field(default_factory=list)  # (counted, actual) version
    ready: list[int] = field(default_factory=list)  # versions of finished samples
    placed: list[tuple[int, int]] = field(default_factory=list)  # (version, step)

    def start(self, count: int) -> bool:
        count = min(count, self.total - self.started)
        if count <= 0 or not self.budget.can_start(self.loaded, count):
            return False
        self.budget.start(self.loaded, count)
        self.running += [(self.loaded, self.loaded)] * count
        self.started += count
        return True

    def load(self) -> bool:
        """The generators receive the trainer's latest weights."""
        changed = self.loaded != self.budget.step
        self.loaded = self.budget.step
        # a still-queued sample may start with the newer weights than those it was counted at
        self.running = [(c, max(a, self.loaded)) for c, a in self.running]
        return changed

    def finish(self, index: int, late_start: bool) -> bool:
        if not self.running:
            return False
        counted, actual = self.running.pop(index % len(self.running))
        version = actual if late_start else counted
        self.budget.retarget(counted, version)
        self.ready.append(version)
        return True

    def place(self) -> bool:
        moved = False
        self.ready.sort()
        while self.ready and self.budget.can_place(self.ready[0]):
            version = self.ready.pop(0)
            step = self.budget.step
            assert step <= self.budget.deadline(version), "placed after its deadline"
            self.placed.append((version, step))
            self.budget.place(version)
            moved = True
        return moved


ops = st.lists(
    st.tuples(st.sampled_from(["start", "finish", "place", "load"]), st.integers(0, 50)),
    max_size=120,
)


@settings(max_examples=150)
@given(
    batch_size=st.integers(1, 6),
    max_lag=st.integers(0, 3),
    num_steps=st.integers(1, 5),
    script=ops,
    late_start=st.booleans(),
)
def test_random_interleavings_keep_deadlines_and_never_deadlock(
    batch_size, max_lag, num_steps, script, late_start
):
    w = World(LagBudget(batch_size, max_lag), total=batch_size * num_steps)
    for op, arg in script:
        if op == "start":
            w.start(1 + arg % (batch_size + 1))
        elif op == "finish":
            w.finish(arg, late_start)
        elif op == "place":
            w.place()
        else:
            w.load()
    # Then run to the end as a pipeline does: after each finish, place what may be placed,
    # load the newest weights and start what the budget allows. Samples finish newest
    # first, the order that tempts a trainer to take late-deadline samples early.
    for _ in range(10 * w.total + 10):
        progressed = w.place()
        progressed |= w.load()
        while w.start(1):
            progressed = True
        progressed |= w.finish(-1, late_start)
        if len(w.placed) == w.total:
            break
        assert progressed, (
            f"deadlock: {len(w.placed)}/{w.total} placed, ready={w.ready}, "
            f"step={w.budget.step}, loaded={w.loaded}, started={w.started}"
        )
    assert len(w.placed) == w.total
    assert all(step - version <= max_lag for version, step in w.placed)
    steps = [step for _, step in w.placed]
    assert all(steps.count(s) == batch_size for s in range(num_steps))
    assert w.budget.step == num_steps
