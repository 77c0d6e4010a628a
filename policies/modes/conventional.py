"""``conventional`` mode: the RL loop PipelineRL compares against.

Generate ``G·B`` samples with one set of weights (G batches of B), then take G optimizer
steps, one per batch, and only then push the new weights (``G`` is
``pipeline.steps_per_generation``). The j-th step's samples are j versions stale, so the
staleness bound is ``G − 1``; with ``G = 1`` this is ``disagg-sync``.
"""

from __future__ import annotations

from policies.modes.base import register_mode
from policies.modes.events import Command, Finish, InflightHandling, PushWeights, TrainStepDone
from policies.modes.wave import WaveController
from policies.records import Completion


@register_mode("conventional", conventional=True)
class ConventionalController(WaveController):
    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)
        self._k = self.config.steps_per_wave
        if self.config.num_steps % self._k:
            raise ValueError(
                f"run.iterations ({self.config.num_steps}) must be a multiple of "
                f"pipeline.steps_per_generation ({self._k})"
            )
        self._by_step: dict[int, list[Completion]] = {}

    def _wave_of(self, c: Completion) -> int:
        return c.request.iteration // self._k

    def _on_sample(self, event) -> list[Command]:  # noqa: ANN001 - SampleFinished
        c = self._note_finished(event)
        wave = self._wave_of(c)
        self._remaining[wave] -= 1
        self._by_step.setdefault(c.request.iteration, []).append(c)
        if self._remaining[wave] > 0:
            return []
        self.wave_gen_time_s[wave] = event.time_s - self._wave_start_s[wave]
        out: list[Command] = []
        for step in range(wave * self._k, (wave + 1) * self._k):
            for done in self._by_step.pop(step, []):
                out += self._train(step, done)
            out += self._close_step(step)
        return out

    def _on_step_done(self, event: TrainStepDone) -> list[Command]:
        step = event.stats.step
        self.latest_version = step + 1
        if step + 1 >= self.config.num_steps:
            self.finished = True
            return [Finish()]
        if (step + 1) % self._k:
            return []
        push = PushWeights(self.latest_version, InflightHandling.BARRIER)
        return [push, *self._maybe_start_wave(event.time_s)]

    def _ready_for(self, wave: int) -> bool:
        if wave * self._k >= self.config.num_steps or self.finished:
            return False
        if wave > 0 and self._remaining.get(wave - 1, 0) > 0:
            return False
        return all(v.version >= wave * self._k for v in self.views.values())

    def _maybe_start_wave(self, time_s: float) -> list[Command]:
        wave = self._next_wave
        if not self._ready_for(wave):
            return []
        self._next_wave += 1
        batches = [self._prompts.batch(wave * self._k + j) for j in range(self._k)]
        requests = self._predict([r for batch in batches for r in batch])
        self._remaining[wave] = len(requests)
        self._wave_start_s[wave] = time_s
        return self._dispatch_to(requests, list(self.views.values()))
