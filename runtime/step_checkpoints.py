"""Which optimizer steps of a live run checkpoint, and how one is written.

After a step the actor asks :meth:`StepCheckpoints.due` (``live.checkpoint_every`` and
``live.checkpoint_min_interval_s``: :class:`runtime.checkpoints.CheckpointCadence`); a
checkpoint appends what is new to the history journal, then has the trainer write its
state with a slim position (:mod:`runtime.history`). At a graceful stop
(:mod:`runtime.graceful_stop`) :meth:`StepCheckpoints.at_stop` writes the last completed
step the same way where the cadence had skipped it. The trainer is then between jobs and
holds what a checkpoint at that step's end holds: its weights and optimizer state (the
gradient it may have accumulated since for the next step is in no checkpoint), and the
journal takes the samples trained up to that step only, so a later step's samples,
trained in part or still generating, are generated and trained again on resume.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from runtime.checkpoints import CheckpointCadence
from runtime.history import HistoryJournal, journal_path
from runtime.recorder import DataPosition, Recorder
from runtime.trainer_client import TrainerClient

log = logging.getLogger(__name__)


class StepCheckpoints:
    def __init__(
        self, path: str | None, cadence: CheckpointCadence, first_step: int,
        trainer: TrainerClient, recorder: Recorder, now: Callable[[], float],
    ) -> None:  # fmt: skip
        """``path``: the checkpoint (None: the run checkpoints nothing); ``first_step``:
        the run's (a resumed one's checkpoint holds the step before it)."""
        self.path = path
        self.cadence = cadence
        self.last_step = first_step - 1  # the step the last checkpoint holds (-1: none)
        self.trainer = trainer
        self.recorder = recorder
        self.now = now
        self.stop_writing: int | None = None  # the step the stop's checkpoint is writing

    def due(self, step: int) -> bool:
        """Whether global ``step``, just taken, checkpoints now."""
        return self.path is not None and self.cadence.due(step, self.now())

    async def write(self, step: int) -> None:
        """Checkpoint global ``step``: the journal first, only what is new; then the state."""
        assert self.path is not None, "a run without a checkpoint path checkpoints nothing"
        delta = self.recorder.journal_delta(step, self.now())
        HistoryJournal(journal_path(self.path)).append(delta)
        slim = DataPosition(delta.next_step, delta.time_s, [], [], [], journal=True)
        await self.trainer.checkpoint(self.path, slim)
        self.last_step = step

    def last_trained_step(self) -> int:
        steps = self.recorder.steps
        return steps[-1]["step"] if steps else self.last_step

    def out_of_grace(self, grace_s: float) -> str:
        """Say (and log) that a stop ran out of ``live.stop_grace_s`` before its checkpoint,
        and which step the run resumes after."""
        step = self.last_trained_step()
        if self.path is None:
            kept = "the run checkpoints nothing: it starts over"
        elif self.last_step < 0:
            kept = "the run has no checkpoint: it starts over"
        else:
            kept = f"the run resumes after step {self.last_step}, its last checkpoint"
        lost = "not checkpointed" if step > self.last_step else "checkpointed already"
        if self.stop_writing is not None:  # the trainer may still finish it before teardown
            kept += f" (or after step {self.stop_writing} if the trainer ends that write)"
        waited = "its checkpoint" if self.stop_writing is not None else "the trainer's job"
        why = (
            f"the stop ran out of live.stop_grace_s ({grace_s:g} s) waiting for {waited}: it "
            f"did not checkpoint (the last trained step, {step}, is {lost}); {kept}"
        )
        log.warning("%s", why)
        return why

    async def at_stop(self) -> None:
        """Checkpoint the last completed step if the last checkpoint is older (call it with
        the trainer between jobs). A failure is logged: the stop goes on."""
        step = self.last_trained_step()
        if self.path is None or step <= self.last_step:
            return
        log.info("stopping: checkpointing step %d (the last was %d)", step, self.last_step)
        self.stop_writing = step
        try:
            await self.write(step)
        except Exception as err:  # noqa: BLE001 - a dead trainer: the run resumes from the last
            log.warning("the stop's checkpoint of step %d failed (%s: %s); the run resumes "
                        "after step %d", step, type(err).__name__, err, self.last_step)  # fmt: skip
