"""The live actor's settings (:class:`runtime.actor.Actor`), one record per run part."""

from __future__ import annotations

from dataclasses import dataclass

from policies.records import Request


@dataclass(slots=True, frozen=True)
class ActorConfig:
    group_size: int
    step_offset: int = 0  # first global step of this (possibly resumed) run
    checkpoint_path: str | None = None
    checkpoint_every: int = 1
    checkpoint_interval_s: float = 0.0  # at least this between two (but the last step's)
    sampling_seed: int | None = 0  # per-sample seeds from (this, sample id); None: unseeded
    length_update_every: int = 32  # finished samples per update of an online length predictor
    weight_host: str = "127.0.0.1"  # where the trainer hosts the weight group (live.host)
    weight_backend: str = "gloo"
    num_steps: int | None = None  # the run's global number of steps (for step updates)
    stop_grace_s: float = 60.0  # a stop's wait for the job in progress and its checkpoint

    def seed_of(self, request: Request) -> int | None:
        """The sampling seed of one sample: the same sample draws the same random numbers
        in every run and mode (its tokens still differ where the weights do)."""
        if self.sampling_seed is None:
            return None
        return (self.sampling_seed * 1_000_003 + request.sample_id) % 2**31
