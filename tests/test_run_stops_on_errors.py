"""A run stops, saying why, on what would otherwise corrupt or hang it: a non-finite
gradient is never applied (runtime.trainer), and an error in any task the actor spawned
(a weight push, a fault watcher) ends the run instead of being dropped."""

from __future__ import annotations

import asyncio
import math

import pytest
import torch
from sharded_harness import make_model_dir
from test_skip_zero_advantage import _items, _vocab

from runtime.actor import Actor, ActorConfig
from runtime.errors import NonFiniteGradient
from runtime.trainer import Trainer, TrainerConfig


def test_a_non_finite_gradient_is_refused_and_the_weights_stay_as_they_were(tmp_path):
    model_dir = make_model_dir(tmp_path)
    trainer = Trainer(TrainerConfig(model_dir, batch_size=4, micro_batch_samples=4))
    trainer.initialise()
    trainer.train(_items(4, _vocab(model_dir), flat=set(), seed=0), 0.0)
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    next(iter(trainer.model.parameters())).grad[0].fill_(math.nan)  # as a blown-up loss leaves
    with pytest.raises(NonFiniteGradient, match=r"step 3: the gradient norm is nan; .*version 0"):
        trainer.step(3, 1.0)
    assert trainer.version == 0
    for name, p in trainer.model.named_parameters():
        assert torch.equal(p, before[name]), name  # not one weight moved


class _Waiting:
    """A controller that waits for events forever (the run ends only by an error)."""

    finished = False

    def handle(self, event):
        return []


def test_an_error_in_a_spawned_task_stops_the_run_instead_of_hanging_it():
    """Before: a failed weight push was a 'Task exception was never retrieved' and the
    run waited for its WeightsLoaded forever."""

    async def scenario() -> None:
        actor = Actor(ActorConfig(group_size=1), _Waiting(), {}, None, None, lambda r: 0.0, None)

        async def push() -> None:
            await asyncio.sleep(0.05)
            raise RuntimeError("weight push of version 2 failed")

        actor.spawn(push())
        await asyncio.wait_for(actor.run(), timeout=10)

    with pytest.raises(RuntimeError, match="weight push of version 2 failed"):
        asyncio.run(scenario())
