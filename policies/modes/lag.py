"""Lag budget of the ``pipeline`` mode: a hard bound on how stale a trained sample may be.

A sample whose rollout started with weights ``v`` must be trained by optimizer step
``v + max_lag`` (its *deadline*). With ``N(≤t)`` the untrained samples due by step t and
``C(t) = (t − s + 1)·B − filled`` the trainer slots left up to step t (s is the step being
filled), the invariant ``N(≤t) ≤ C(t)`` for every t ≥ s makes every deadline feasible:
generation may start a sample only if the invariant still holds with it (this is the
throttle PipelineRL's ``max_lag`` asks for), and the trainer places finished samples
earliest-deadline-first, taking a sample due later only while enough slots stay free
for the earlier ones still being generated.
"""

from __future__ import annotations

from collections import Counter


class LagBudget:
    def __init__(self, batch_size: int, max_lag: int) -> None:
        self.batch_size = batch_size
        self.max_lag = max_lag
        self.step = 0  # the optimizer step being filled
        self.filled = 0  # samples placed into it so far
        self._due: Counter[int] = Counter()  # deadline -> untrained samples

    def deadline(self, version: int) -> int:
        return version + self.max_lag

    def _capacity(self, t: int) -> int:
        return (t - self.step + 1) * self.batch_size - self.filled

    def _due_by(self, t: int) -> int:
        return sum(n for d, n in self._due.items() if d <= t)

    def _horizon(self, deadline: int) -> int:
        return max([deadline, *self._due])

    def can_start(self, version: int, count: int = 1) -> bool:
        """May ``count`` more samples start with weights ``version``?"""
        d = self.deadline(version)
        if d < self.step:
            return False
        return all(
            self._due_by(t) + count <= self._capacity(t) for t in range(d, self._horizon(d) + 1)
        )

    def start(self, version: int, count: int = 1) -> None:
        self._due[self.deadline(version)] += count

    def retarget(self, old_version: int, new_version: int) -> None:
        """A sample's start version became known (or it was resubmitted) as a later one."""
        assert new_version >= old_version, "a sample's version never moves back"
        self._remove(self.deadline(old_version))
        self._due[self.deadline(new_version)] += 1

    def can_place(self, version: int) -> bool:
        """May a finished sample of ``version`` go into the step being filled?"""
        d = self.deadline(version)
        assert d >= self.step, "a sample missed its lag deadline"
        return all(self._due_by(t) < self._capacity(t) for t in range(self.step, d))

    def place(self, version: int) -> bool:
        """Place the sample; True when this filled the step (the step then advances)."""
        self._remove(self.deadline(version))
        self.filled += 1
        if self.filled < self.batch_size:
            return False
        self.step += 1
        self.filled = 0
        return True

    def _remove(self, deadline: int) -> None:
        self._due[deadline] -= 1
        assert self._due[deadline] >= 0
        if not self._due[deadline]:
            del self._due[deadline]
