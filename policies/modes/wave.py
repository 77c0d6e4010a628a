"""Iteration ("wave") modes: each iteration generates one batch, then one optimizer step.

One controller covers five published designs through its config:

* ``colocated-sync`` (verl-style): all GPUs generate, switch context, train, switch back.
* ``disagg-sync``: separate GPUs; train after the whole batch is generated; weights are
  pushed and loaded before the next batch starts (transfer on the critical path).
* ``stream-sync`` (StreamRL-Sync): as above, but each finished sample streams to the
  trainer, which runs micro-batches while generation continues.
* ``one-step-async``: batch i+1 is generated with weights i−1 while step i trains, so
  weight transfer leaves the critical path; staleness ≤ 1.
* ``stream-async`` (StreamRL-Async): streaming plus one-step asynchrony.

Batch ``w`` may start once batch ``w−1`` is fully generated and every instance holds
weights ``≥ w − max_lag``; step ``w`` trains exactly batch ``w``.

With ``overlap_waves`` (the one-step async modes, ``pipeline.overlap_waves``) batch ``w``
need not wait for batch ``w−1``'s last answers: it starts once every instance holds
weights ``w − max_lag``, which arrive in flight (``pipeline.inflight``: the tail of
batch ``w−1`` keeps decoding on the newer weights). Staleness stays within ``max_lag``
(a sample counts from the version it started on), and since weights ``w`` need step
``w−1``, at most ``max_lag + 1`` batches are in flight. Steps still run in order: samples
of a batch whose predecessor's step is open are held until that step closes.
"""

from __future__ import annotations

from policies.modes.base import Controller, register_mode
from policies.modes.events import (
    Command,
    ContextSwitched,
    Finish,
    InstanceAdded,
    InstanceLost,
    InstanceRetired,
    Phase,
    PushWeights,
    SampleFinished,
    ScaleOut,
    ScaleOutFailed,
    Start,
    SwitchContext,
    TrainSamples,
    TrainStepDone,
    WeightsLoaded,
)
from policies.records import Completion


@register_mode("colocated-sync", colocated=True, max_lag=0)
@register_mode("disagg-sync", max_lag=0)
@register_mode("stream-sync", streaming=True, max_lag=0)
@register_mode("one-step-async", max_lag=1)
@register_mode("stream-async", streaming=True, max_lag=1)
class WaveController(Controller):
    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self._next_wave = 0
        self._remaining: dict[int, int] = {}  # wave -> samples not yet finished
        self._wave_start_s: dict[int, float] = {}
        self.wave_gen_time_s: dict[int, float] = {}
        self._wave_done: list[Completion] = []  # finished samples of the current wave
        self._open_step = 0  # the lowest wave whose optimizer step is not yet closed
        self._held: dict[int, list[Completion]] = {}  # wave -> finished before its turn
        self._scale_pending = False
        self._handlers = {
            Start: self._on_start,
            SampleFinished: self._on_sample,
            TrainStepDone: self._on_step_done,
            WeightsLoaded: self._on_loaded,
            ContextSwitched: self._on_switched,
            InstanceAdded: self._on_added,
            InstanceLost: self._on_lost,
            InstanceRetired: self._on_retired,
            ScaleOutFailed: self._on_scale_out_failed,
        }

    # -- handlers ----------------------------------------------------------------------

    def _on_start(self, event: Start) -> list[Command]:
        return self._maybe_start_wave(event.time_s)

    def _on_sample(self, event: SampleFinished) -> list[Command]:
        c = self._note_finished(event)
        wave = c.request.iteration
        self._remaining[wave] -= 1
        out: list[Command] = []
        if self.config.colocated:
            self._wave_done.append(c)
        elif wave == self._open_step:
            out += self._train(wave, c)
        else:  # an overlapping batch: its step opens when its predecessor's closes
            self._held.setdefault(wave, []).append(c)
        if self._remaining[wave] == 0:
            self.wave_gen_time_s[wave] = event.time_s - self._wave_start_s[wave]
            if self.config.colocated:
                out.append(SwitchContext(Phase.TRAIN))
            elif wave == self._open_step:
                out += self._close_open_steps()
        return out + self._maybe_start_wave(event.time_s)

    def _close_open_steps(self) -> list[Command]:
        """Close the open step (its batch is generated), then open the next: send the
        samples it holds, and close it too if its batch is generated as well."""
        out = self._close_step(self._open_step)
        self._open_step += 1
        wave = self._open_step
        for c in self._held.pop(wave, []):
            out += self._train(wave, c)
        if self._remaining.get(wave) == 0:
            out += self._close_open_steps()
        return out

    def _on_step_done(self, event: TrainStepDone) -> list[Command]:
        step = event.stats.step
        self.latest_version = step + 1
        if step + 1 >= self.config.num_steps:
            self.finished = True
            return [Finish()]
        out: list[Command] = self._maybe_scale(step, event)
        if self.config.colocated:
            return [*out, SwitchContext(Phase.GENERATE)]
        out.append(PushWeights(self.latest_version, self.config.inflight))
        return out + self._maybe_start_wave(event.time_s)

    def _on_loaded(self, event: WeightsLoaded) -> list[Command]:
        self._on_weights_loaded(event)
        return self._maybe_start_wave(event.time_s)

    def _on_switched(self, event: ContextSwitched) -> list[Command]:
        if event.to == Phase.TRAIN:
            wave = self._next_wave - 1
            batch, self._wave_done = tuple(self._wave_done), []
            for c in batch:
                self.train_step_of[c.sample_id] = wave
            return [TrainSamples(wave, batch), *self._close_step(wave)]
        for view in self.views.values():  # colocated weights are local
            view.version = self.latest_version
        return self._maybe_start_wave(event.time_s)

    def _on_added(self, event: InstanceAdded) -> list[Command]:
        """A new instance serves (or a lost one, restarted: it answers no pending scale-out)."""
        self._on_instance_added(event)
        if event.from_scale_out:
            self._scale_pending = False
        return self._maybe_start_wave(event.time_s)

    def _on_scale_out_failed(self, event: ScaleOutFailed) -> list[Command]:
        """No instance came of the pending scale-out: the next step may decide again."""
        self._scale_pending = False
        return []

    def _on_retired(self, event: InstanceRetired) -> list[Command]:
        """A scale-in is done when the last instance it retires has finished (one retiring
        several ends once, not at its first)."""
        self._on_instance_retired(event)
        if not self.retiring:
            self._scale_pending = False
        return self._maybe_start_wave(event.time_s)

    def _on_lost(self, event: InstanceLost) -> list[Command]:
        """Its requests go to the others and still count for their wave; the next wave no
        longer waits for the lost instance's weights. A retiring one lost counts as retired
        for its scale-in (no ``InstanceRetired`` will come for it)."""
        was_retiring = event.instance_id in self.retiring
        commands = self._on_instance_lost(event)
        if was_retiring and not self.retiring:
            self._scale_pending = False
        return commands + self._maybe_start_wave(event.time_s)

    # -- steps -------------------------------------------------------------------------

    def _ready_for(self, wave: int) -> bool:
        if wave >= self.config.num_steps or self.finished:
            return False
        if wave > 0 and self._remaining.get(wave - 1, 0) > 0 and not self.config.overlap_waves:
            return False
        if self.config.colocated and wave > 0 and self.latest_version < wave:
            return False
        need = wave - self.config.max_lag
        return all(v.version >= need for v in self.views.values())

    def _maybe_start_wave(self, time_s: float) -> list[Command]:
        """Start every batch that may start now (more than one only with overlap)."""
        out: list[Command] = []
        while self._ready_for(wave := self._next_wave):
            self._next_wave += 1
            requests = self._predict(self._prompts.batch(wave))
            self._remaining[wave] = len(requests)
            self._wave_start_s[wave] = time_s
            self._wave_done = []
            out += self._dispatch_to(requests, list(self.views.values()))
        return out

    def _maybe_scale(self, step: int, event: TrainStepDone) -> list[Command]:
        if self._scaling is None or self._scale_pending or step not in self.wave_gen_time_s:
            return []
        stats = event.stats
        train_s = stats.busy_s if stats.busy_s is not None else stats.end_s - stats.start_s
        gen_s, n, now_s = self.wave_gen_time_s[step], len(self.views), event.time_s
        add = self._scaling.instances_to_add(gen_s, train_s, n, time_s=now_s)
        out: list[Command] = [ScaleOut(add)] if add > 0 else []
        if not out:
            out = self._retire(self._scaling.instances_to_retire(gen_s, train_s, n, time_s=now_s))
        self._scale_pending = bool(out)
        return out
