"""What ``tandem advise`` has when Ctrl-C or SIGTERM stops it: the simulations so far.

:func:`experiments.advise.advise` raises :class:`AdviseInterrupted` (a
``KeyboardInterrupt``) carrying a :class:`PartialAdvice`; ``tandem advise`` writes it
(:func:`experiments.advise_report.write_partial`, ``status.json`` saying ``partial``) and
exits as interrupted (130; 143 for SIGTERM).
"""

from __future__ import annotations

from concurrent.futures import Future
from dataclasses import dataclass, field
from enum import StrEnum

from experiments.advise_eval import Evaluation
from experiments.advise_plan import Space
from experiments.advise_search import Evaluator
from experiments.advise_space import Candidate


class AdviceStatus(StrEnum):
    """What ``--out`` holds (``status.json``)."""

    COMPLETE = "complete"  # the search and the pricing ended: advice.md is the advice
    PARTIAL = "partial"  # stopped (Ctrl-C, SIGTERM): the simulations so far, the best so far


@dataclass(frozen=True, slots=True)
class PartialAdvice:
    space: Space
    evaluations: list[Evaluation]  # in the order they finished
    best: Candidate | None  # the best full run inside the space so far (None: no full run)
    best_value: float | None
    input_value: float | None
    objective: str
    budget_s: float
    wall_s: float
    budget_ran_out: bool = False  # False: Ctrl-C or SIGTERM stopped it


class AdviseInterrupted(KeyboardInterrupt):
    """Ctrl-C or SIGTERM stopped ``advise``; ``partial`` holds what it had."""

    def __init__(self, message: str, partial: PartialAdvice) -> None:
        super().__init__(message)
        self.partial = partial


class NoFullRun(ValueError):
    """The budget ran out before any candidate finished a full run; ``partial`` holds the
    simulations that ended (``tandem advise`` writes them before it names the error)."""

    def __init__(self, message: str, partial: PartialAdvice) -> None:
        super().__init__(message)
        self.partial = partial


@dataclass(slots=True)
class Recorded:
    """An evaluator that keeps every simulation that ends (for a stop part-way)."""

    pool: Evaluator
    evaluations: list[Evaluation] = field(default_factory=list)

    @property
    def workers(self) -> int:
        return self.pool.workers

    def submit(self, c: Candidate, iterations: int) -> Future[Evaluation]:
        future = self.pool.submit(c, iterations)
        future.add_done_callback(self._keep)
        return future

    def _keep(self, future: Future[Evaluation]) -> None:
        if not future.cancelled() and future.exception() is None:
            self.evaluations.append(future.result())
