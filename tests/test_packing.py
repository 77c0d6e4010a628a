"""Packed trainer rows (runtime.packing): a group's samples sharing one copy of their
prompt get the log-probs and gradient they get each run alone."""

from __future__ import annotations

import pytest
import torch
from sharded_harness import make_model_dir
from transformers import AutoModelForCausalLM

from runtime.packing import pack, packed_logprobs


def _groups(vocab: int, seed: int) -> tuple[list[tuple[int, ...]], list[tuple[int, ...]]]:
    """Three groups of 3 samples; answers of 1 to 12 tokens (1: no answer token fed)."""
    g = torch.Generator().manual_seed(seed)
    prompts, outputs = [], []
    for length in (1, 4, 9):
        prompt = tuple(torch.randint(3, vocab, (length,), generator=g).tolist())
        for n in (1, 5, 12):
            prompts.append(prompt)
            outputs.append(tuple(torch.randint(3, vocab, (n,), generator=g).tolist()))
    order = torch.randperm(len(prompts), generator=g).tolist()  # a group's samples apart
    return [prompts[i] for i in order], [outputs[i] for i in order]


def _alone(model, prompt: tuple[int, ...], output: tuple[int, ...]) -> torch.Tensor:
    ids = torch.tensor(prompt + output)[None]
    logits = model(input_ids=ids, use_cache=False).logits[0, len(prompt) - 1 : -1]
    return torch.log_softmax(logits.float(), -1).gather(-1, torch.tensor(output)[:, None])[:, 0]


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    model_dir = make_model_dir(tmp_path_factory.mktemp("model"))
    return AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).train()


def test_shared_prompts_give_each_sample_the_log_probs_it_has_alone(model):
    prompts, outputs = _groups(model.config.vocab_size, seed=0)
    shared, mask = packed_logprobs(model, prompts, outputs, share_prompts=True)
    separate, _ = packed_logprobs(model, prompts, outputs, share_prompts=False)
    for i, (p, o) in enumerate(zip(prompts, outputs)):
        alone = _alone(model, p, o)
        assert mask[i].sum() == len(o)
        assert torch.allclose(shared[i, : len(o)], alone, atol=1e-4), i
        assert torch.allclose(separate[i, : len(o)], alone, atol=1e-4), i
    assert (shared[mask == 0] == 0).all()


def test_shared_prompts_shorten_the_row_and_keep_the_gradient(model):
    prompts, outputs = _groups(model.config.vocab_size, seed=1)
    rows = {share: len(pack(prompts, outputs, share).ids) for share in (True, False)}
    fed = sum(len(o) - 1 for o in outputs)
    assert rows == {True: 1 + 4 + 9 + fed, False: 3 * (1 + 4 + 9) + fed}
    grads = {}
    for share in (True, False):
        model.zero_grad(set_to_none=True)
        packed_logprobs(model, prompts, outputs, share)[0].sum().backward()
        grads[share] = [p.grad.clone() for p in model.parameters()]
    for k, (a, b) in enumerate(zip(grads[True], grads[False])):
        assert torch.allclose(a, b, rtol=1e-3, atol=1e-5), k


def test_an_empty_prompt_is_refused_by_its_sample():
    with pytest.raises(ValueError, match="sample 1 has an empty prompt"):
        pack([(3,), ()], [(4,), (5,)], share_prompts=True)
