"""A pipeline-mode controller driven by scripted events, for the controller tests.

Two instances, batches of four samples in groups of two, round-robin dispatch and a fake
predictor (``10 × (sample_id + 1)`` tokens), so every expected command can be written out.
"""

from __future__ import annotations

from helpers import FakePredictor, FakePrompts, completion, make_spec, view

from policies.build import build_controller
from policies.dispatch import RoundRobinDispatch
from policies.modes.events import (
    ContextSwitched,
    Phase,
    SampleFinished,
    Start,
    TrainStepDone,
    WeightsLoaded,
)
from policies.records import InflightHandling, StepStats

BARRIER = InflightHandling.BARRIER


class Script:
    """A controller under test plus shorthands for its events and the expected requests."""

    def __init__(
        self,
        mode: str,
        iterations: int = 2,
        micro_batch: int = 2,
        max_num_seqs: int = 256,
        scaling=None,
        **spec: object,
    ) -> None:
        self.spec = make_spec(
            {
                "pipeline.mode": mode,
                "run.iterations": iterations,
                "algorithm.batch_size": 4,
                "algorithm.group_size": 2,
                **spec,
            }
        )
        self.prompts = FakePrompts(batch_size=4, group_size=2)
        self.ctl = build_controller(
            self.spec,
            self.prompts,
            FakePredictor(),
            RoundRobinDispatch(),
            [view(0, max_num_seqs=max_num_seqs), view(1, max_num_seqs=max_num_seqs)],
            micro_batch_samples=micro_batch,
            scaling=scaling,
        )
        self.done: dict[int, object] = {}

    def r(self, sample_id: int):
        """Request ``sample_id`` as dispatched: with its prediction."""
        return self.prompts.request(sample_id, predicted=10.0 * (sample_id + 1))

    def rs(self, *ids: int) -> tuple:
        return tuple(self.r(i) for i in ids)

    def c(self, sample_id: int):
        return self.done[sample_id]

    def cs(self, *ids: int) -> tuple:
        return tuple(self.done[i] for i in ids)

    def start(self):
        return self.ctl.handle(Start(0.0))

    def finish(self, sample_id: int, instance: int, t: float, v_start: int = 0, v_end=None):
        c = completion(self.r(sample_id), instance, t, v_start, v_end)
        self.done[sample_id] = c
        return self.ctl.handle(SampleFinished(t, c))

    def step_done(self, step: int, t: float):
        stats = StepStats(step, step + 1, 4, 60, t - 1.0, t, busy_s=0.5)
        return self.ctl.handle(TrainStepDone(t, stats))

    def loaded(self, instance: int, version: int, t: float):
        return self.ctl.handle(WeightsLoaded(t, instance, version))

    def switched(self, to: Phase, t: float):
        return self.ctl.handle(ContextSwitched(t, to))
