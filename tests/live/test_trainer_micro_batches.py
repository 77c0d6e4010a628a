"""The trainer splits a call into sorted micro-batches without changing the gradient."""

import json
from pathlib import Path

import pytest
import torch

from runtime.trainer import Trainer, TrainerConfig, TrainItem

pytestmark = pytest.mark.live


def _items(n: int, vocab: int) -> list[TrainItem]:
    g = torch.Generator().manual_seed(0)
    items = []
    for i in range(n):
        prompt = torch.randint(
            3, vocab, (int(torch.randint(3, 9, (1,), generator=g)),), generator=g
        )
        out = torch.randint(3, vocab, (int(torch.randint(1, 30, (1,), generator=g)),), generator=g)
        items.append(
            TrainItem(
                sample_id=i, prompt_ids=tuple(prompt.tolist()), output_ids=tuple(out.tolist()),
                logprobs_old=tuple([-2.0] * len(out)), advantage=float(i % 3 - 1), reward=0.0,
                version_start=0,
            )
        )  # fmt: skip
    return items


def _grads(model_dir: str, micro: int, calls: list[list[TrainItem]]) -> tuple[dict, float]:
    trainer = Trainer(TrainerConfig(model_dir, batch_size=16, micro_batch_samples=micro))
    trainer.initialise()
    loss = sum(trainer.train(items, 0.0) for items in calls)
    return {n: p.grad.clone() for n, p in trainer.model.named_parameters()}, loss


def test_one_call_in_micro_batches_accumulates_the_gradient_of_the_whole_batch(model_dir):
    vocab = json.loads((Path(model_dir) / "config.json").read_text())["vocab_size"]
    items = _items(16, vocab)
    whole, loss_whole = _grads(model_dir, 16, [items])
    split, loss_split = _grads(model_dir, 3, [items])
    streamed, _ = _grads(model_dir, 16, [items[:5], items[5:11], items[11:]])
    assert loss_split == pytest.approx(loss_whole, rel=1e-4)
    for name, g in whole.items():  # float32 sums in another order: ~5e-6 on the embeddings
        assert torch.allclose(split[name], g, rtol=1e-4, atol=1e-5), name
        assert torch.allclose(streamed[name], g, rtol=1e-4, atol=1e-5), name
    assert any(g.abs().sum() > 0 for g in whole.values())


def test_packed_sequences_see_only_themselves(model_dir):
    """token_logprobs packs a micro-batch into one row: each sequence's log-probs equal
    those of the sequence run alone (attention leaking across sequences would differ)."""
    from runtime.trainer import token_logprobs

    vocab = json.loads((Path(model_dir) / "config.json").read_text())["vocab_size"]
    trainer = Trainer(TrainerConfig(model_dir, batch_size=8))
    trainer.initialise()
    items = _items(8, vocab)
    with torch.no_grad():
        packed, mask = token_logprobs(trainer.model, items)
        for i, it in enumerate(items):
            ids = torch.tensor([list(it.prompt_ids) + list(it.output_ids)])
            logits = trainer.model(input_ids=ids, use_cache=False).logits[0].float()
            p, n = len(it.prompt_ids), len(it.output_ids)
            alone = torch.log_softmax(logits[p - 1 : p - 1 + n], -1)
            alone = alone.gather(-1, torch.tensor(it.output_ids)[:, None])[:, 0]
            assert torch.allclose(packed[i, :n], alone, atol=1e-5), i
            assert mask[i, :n].all() and not mask[i, n:].any() and not packed[i, n:].any()


def test_a_compiled_trainer_computes_the_eager_gradient_and_compiles_before_the_clock(model_dir):
    """``live.compile_trainer``: warm_up compiles the dynamic graph; a step's micro-batches
    of new lengths then run without compiling again, and the gradient is the eager one."""
    from torch._dynamo.utils import counters

    vocab = json.loads((Path(model_dir) / "config.json").read_text())["vocab_size"]
    items = _items(12, vocab)
    eager, loss = _grads(model_dir, 4, [items])
    trainer = Trainer(TrainerConfig(model_dir, batch_size=16, micro_batch_samples=4, compile=True))
    trainer.initialise()
    trainer.warm_up()
    frames = counters["stats"]["unique_graphs"]
    compiled_loss = trainer.train(items, 0.0)
    assert counters["stats"]["unique_graphs"] == frames  # nothing compiled inside the run
    assert frames > 0 and compiled_loss == pytest.approx(loss, rel=1e-4, abs=1e-6)
    for name, p in trainer.model.named_parameters():
        assert torch.allclose(p.grad, eager[name], rtol=1e-3, atol=1e-5), name
