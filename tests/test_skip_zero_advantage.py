"""Samples of advantage exactly 0 are left out of the trainer's forward and backward
without changing the update (runtime.trainer.Trainer.trainable)."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from sharded_harness import make_model_dir

from policies.records import Completion, FinishReason, Request
from runtime.groups import GroupBook
from runtime.trainer import Trainer, TrainerConfig, TrainItem


def _items(n: int, vocab: int, flat: set[int] | None, seed: int) -> list[TrainItem]:
    """``n`` items; those in ``flat`` (None: all) have advantage 0."""
    g = torch.Generator().manual_seed(seed)
    items = []
    for i in range(n):
        prompt = torch.randint(
            3, vocab, (int(torch.randint(3, 9, (1,), generator=g)),), generator=g
        )
        out = torch.randint(3, vocab, (int(torch.randint(1, 20, (1,), generator=g)),), generator=g)
        adv = 0.0 if flat is None or i in flat else (0.5 if i % 2 else -0.25)
        items.append(
            TrainItem(
                sample_id=i, prompt_ids=tuple(prompt.tolist()), output_ids=tuple(out.tolist()),
                logprobs_old=tuple([-2.0] * len(out)), advantage=adv, reward=float(i % 4),
                version_start=0,
            )
        )  # fmt: skip
    return items


def _trainer(model_dir: str, skip: bool) -> Trainer:
    config = TrainerConfig(
        model_dir, batch_size=12, micro_batch_samples=4, learning_rate=1e-2,
        skip_zero_advantage=skip,
    )  # fmt: skip
    trainer = Trainer(config)
    trainer.initialise()
    return trainer


def _vocab(model_dir: str) -> int:
    return json.loads((Path(model_dir) / "config.json").read_text())["vocab_size"]


def test_skipping_flat_samples_leaves_the_gradient_and_the_counts_as_they_were(tmp_path):
    model_dir = make_model_dir(tmp_path)
    items = _items(12, _vocab(model_dir), flat={0, 3, 6, 9}, seed=0)
    runs = {}
    for skip in (True, False):
        trainer = _trainer(model_dir, skip)
        trainer.train(items, 0.0)
        grads = [p.grad.clone() for p in trainer.model.parameters()]
        runs[skip] = (grads, trainer._acc.passes, trainer.step(0, 1.0))
    (g_skip, passes_skip, s), (g_all, passes_all, t) = runs[True], runs[False]
    for k, (a, b) in enumerate(zip(g_skip, g_all)):
        assert torch.allclose(a, b, rtol=1e-4, atol=1e-7), k
    assert any(g.abs().sum() > 0 for g in g_all)
    assert (passes_skip, passes_all) == (2, 3)  # 8 samples in micro-batches of 4, against 12
    assert (s.num_samples, s.num_tokens, s.mean_reward, s.mean_lag) == (
        t.num_samples, t.num_tokens, t.mean_reward, t.mean_lag,
    )  # fmt: skip
    assert (s.num_skipped, t.num_skipped) == (4, 0)


def test_a_step_of_flat_samples_only_moves_the_weights_as_training_them_would(tmp_path):
    """AdamW moves the weights on its momentum even with a zero gradient: a step whose
    samples were all skipped must take that same step."""
    model_dir = make_model_dir(tmp_path)
    vocab = _vocab(model_dir)
    first, flat = _items(12, vocab, flat=set(), seed=0), _items(12, vocab, flat=None, seed=1)
    after = {}
    for skip in (True, False):
        trainer = _trainer(model_dir, skip)
        trainer.train(first, 0.0)
        trainer.step(0, 1.0)
        before = [p.detach().clone() for p in trainer.model.parameters()]
        trainer.train(flat, 1.0)
        stats = trainer.step(1, 2.0)
        after[skip] = ([p.detach().clone() for p in trainer.model.parameters()], stats)
    (p_skip, s), (p_all, t) = after[True], after[False]
    assert any(not torch.equal(a, b) for a, b in zip(before, p_all))
    for k, (a, b) in enumerate(zip(p_skip, p_all)):
        assert torch.allclose(a, b, rtol=1e-6, atol=1e-8), k
    assert (s.num_skipped, s.num_samples, s.ess, s.clip_fraction) == (12, 12, 1.0, None)
    assert t.num_skipped == 0 and t.clip_fraction is not None


def test_nothing_is_skipped_with_a_reference_kl(tmp_path):
    items = [TrainItem(i, (3, 4), (5, 6), (-1.0, -1.0), 0.0, 1.0, 0) for i in range(4)]
    with_kl = Trainer(TrainerConfig("unused", batch_size=4, kl_coef=0.1))
    assert with_kl.trainable(items) == items and with_kl._acc.num_skipped == 0
    without = Trainer(TrainerConfig("unused", batch_size=4))
    assert without.trainable(items) == [] and without._acc.num_samples == 4


def _completion(sample_id: int, reward: float) -> Completion:
    request = Request(
        sample_id, prompt_id=0, group_id=7, iteration=0, prompt_tokens=2, max_tokens=8
    )
    return Completion(
        request, 0, 1, FinishReason.STOP, 0, 0, 0.0, 0.0, 0.0, token_ids=(5,), reward=reward
    )


def test_a_group_of_equal_rewards_has_advantage_exactly_zero():
    """0.1 three times averages to 0.10000000000000002 in floats: the advantage of a
    flat group must still be exactly 0, or its samples would be trained for nothing."""
    assert sum([0.1] * 3) / 3 != 0.1
    book = GroupBook(group_size=3)
    done = [_completion(i, 0.1) for i in range(3)]
    for c in done:
        book.finished(c, (1, 2))
    assert [it.advantage for it in book.place(0, tuple(done))] == [0.0, 0.0, 0.0]
    mixed = GroupBook(group_size=2)
    pair = [_completion(0, 1.0), _completion(1, 0.5)]
    for c in pair:
        mixed.finished(c, (1, 2))
    assert [it.advantage for it in mixed.place(0, tuple(pair))] == [0.25, -0.25]
