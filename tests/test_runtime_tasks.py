"""Tasks of the live runtime: deterministic, verifiable, long-tailed, PromptSource-shaped."""

import asyncio
from pathlib import Path

import numpy as np
import pytest

from policies.records import Completion, FinishReason, Request, SampleRecord
from policies.results import RunResult
from policies.spec import load_spec
from runtime.gen_client import GenerationClient
from runtime.tasks import (
    NO_CHAR,
    VOCAB,
    Family,
    TaskPrompt,
    TaskPromptSource,
    TaskSet,
    completion_text,
    reward,
)

EOS, PAD, UNK = (VOCAB.index(t) for t in ("<eos>", "<pad>", "<unk>"))


def _ids(text: str) -> list[int]:
    return [VOCAB.index(ch) for ch in text]


def test_same_seed_same_prompts_and_answers():
    a, b = TaskSet(3, 200, 128), TaskSet(3, 200, 128)
    assert [(p.text, p.answer) for p in a.prompts] == [(p.text, p.answer) for p in b.prompts]
    assert [p.text for p in TaskSet(4, 200, 128).prompts] != [p.text for p in a.prompts]


def test_answers_are_correct_for_each_family():
    for p in TaskSet(0, 400, 128).prompts:
        body = p.text[p.text.index(":") + 1 : -1]
        if p.family == Family.REPEAT:
            k = int(p.text[1 : p.text.index(":")])
            assert p.answer == "".join(f"{body}{i:02d}" for i in range(k, 0, -1))
        elif p.family == Family.REVERSE:
            assert p.answer == body[::-1]
        elif p.family == Family.COUNT:
            assert p.answer == str(len(body))
        else:
            counts = [int(x) for x in body[1::2]]
            assert body[1::2].isdigit() and max(counts) <= 9
            assert p.answer == "".join(c * k for c, k in zip(body[::2], counts))


def test_output_lengths_are_long_tailed_and_fit_the_cap():
    tasks = TaskSet(0, 2000, 128)
    lengths = np.array([p.expected_output_tokens for p in tasks.prompts])
    assert np.percentile(lengths, 99) >= 5 * np.median(lengths)
    assert lengths.max() <= 128


def test_prompts_fit_the_vocabulary():
    symbols = set(VOCAB)
    for p in TaskSet(1, 300, 128).prompts:
        assert set(p.text) <= symbols and set(p.answer) <= symbols
    assert len(VOCAB) <= 64


def test_reward_exact_partial_and_empty():
    p = TaskSet(0, 1, 64)[0]
    assert reward(p, p.answer) == 1.0
    assert reward(p, "") == 0.0
    assert 0.0 < reward(p, p.answer + "zz") < 1.0


def test_the_reward_text_is_every_token_but_the_final_eos_one_character_each():
    assert completion_text(_ids("gegc") + [EOS]) == "gegc"
    assert completion_text(_ids("gegc")) == "gegc"  # cut at max_tokens: no <eos> to drop
    assert completion_text([]) == completion_text([EOS]) == ""
    ids = _ids("ge") + [UNK] + _ids("c") + [PAD, EOS, 30, EOS]  # 30: past the vocabulary
    assert completion_text(ids) == "ge" + NO_CHAR + "c" + 3 * NO_CHAR


def test_a_special_token_mid_answer_makes_the_answer_wrong():
    p = TaskPrompt(0, "V:cgeg=", Family.REVERSE, "gegc")
    assert reward(p, completion_text(_ids("gegc") + [EOS])) == 1.0
    for bad in (UNK, PAD):
        assert reward(p, completion_text(_ids("ge") + [bad] + _ids("gc") + [EOS])) == 0.4
        assert reward(p, completion_text(_ids("gegc") + [bad, EOS])) == 0.8
    # a user's sample: 6 tokens, one an id no character decodes to, scored 3/4 before
    assert reward(p, completion_text([9, 7, 5, 5, 27, 1])) == 0.6


def test_the_actor_scores_the_token_ids_not_the_server_text():
    client = GenerationClient(0, "http://127.0.0.1:1", 1.0)
    request = Request(1, 0, 0, 0, 7, 16, prompt="V:cgeg=")
    ids = _ids("geg") + [UNK] + _ids("c") + [EOS]
    line = {"index": 0, "token_ids": ids, "logprobs": [-0.1] * 6, "text": "gegc",
            "prompt_token_ids": _ids("V:cgeg="), "finish_reason": "stop",
            "version_start": 0, "version_end": 0}  # fmt: skip
    out = client._streamed(line, [request], 0.0, 0.1, 0.2)
    assert out.text == "geg" + NO_CHAR + "c" and out.completion.output_tokens == 6
    asyncio.run(client.aclose())


def test_samples_parquet_keeps_what_the_reward_scored(tmp_path):
    ids = _ids("geg") + [UNK, EOS]
    request = Request(1, 0, 0, 0, 7, 16, prompt="V:cgeg=")
    c = Completion(request, 0, len(ids), FinishReason.STOP, 0, 0, 0.0, 0.0, 1.0, tuple(ids))
    c.text, c.reward = completion_text(ids), 0.75
    spec = load_spec(Path(__file__).resolve().parents[1] / "experiments/configs/live-tiny.yaml")
    RunResult(spec, {}, [SampleRecord.from_completion(c, train_step=0)], [], []).save(tmp_path)
    (row,) = RunResult.load(tmp_path).samples
    assert (row.completion_text, row.completion_token_ids) == ("geg" + NO_CHAR, tuple(ids))
    prompt = TaskPrompt(0, "V:cgeg=", Family.REVERSE, "gegc")
    assert reward(prompt, row.completion_text) == row.reward  # a reward one can recompute


def test_prompt_source_batches_groups_and_epochs():
    tasks = TaskSet(0, 16, 64)
    source = TaskPromptSource(tasks, batch_size=32, group_size=4)
    b0, b1 = source.batch(0), source.batch(1)
    assert len(b0) == 32 and len({r.sample_id for r in b0 + b1}) == 64
    assert {r.group_id for r in b0}.isdisjoint({r.group_id for r in b1})
    for g in {r.group_id for r in b0}:
        members = [r for r in b0 if r.group_id == g]
        assert len(members) == 4 and len({r.prompt_id for r in members}) == 1
    assert all(r.prompt == tasks[r.prompt_id].text and r.max_tokens == 64 for r in b0)
    epoch0 = {r.prompt_id for r in b0 + b1}
    assert epoch0 == set(range(16))  # 2 iterations x 8 prompts cover the 16 prompts
    assert source.batch(0) == b0  # deterministic


def test_bad_sizes_are_value_errors():
    with pytest.raises(ValueError, match="group_size"):
        TaskPromptSource(TaskSet(0, 4, 64), batch_size=6, group_size=4)
    with pytest.raises(ValueError, match="num_prompts"):
        TaskSet(0, 0, 64)


@pytest.mark.parametrize("cap", [4, 6, 16, 96])
def test_answers_fit_small_caps_too(cap):
    assert max(p.expected_output_tokens for p in TaskSet(2, 500, cap).prompts) <= cap


def test_a_wider_count_sigma_makes_more_long_answers():
    def long_share(sigma: float) -> float:  # share of repeats asking for 15 copies or more
        repeats = [p for p in TaskSet(0, 2000, 128, count_sigma=sigma).prompts if p.family == "R"]
        return np.mean([int(p.text[1 : p.text.index(":")]) >= 15 for p in repeats])

    assert long_share(1.6) > 1.5 * long_share(1.1)
    with pytest.raises(ValueError, match="count_sigma"):
        TaskSet(0, 4, 64, count_sigma=0)


def test_the_longtail_set_is_mostly_short_with_a_few_answers_tens_of_times_longer():
    tasks = TaskSet(0, 2000, 128, mix="longtail")
    lengths = np.array([p.expected_output_tokens for p in tasks.prompts])
    long = lengths >= 60
    assert 0.05 < long.mean() < 0.12  # a few
    assert np.median(lengths) <= 5 and lengths.max() <= 128
    ratio = lengths[long].mean() / lengths[~long].mean()
    assert 20 <= ratio <= 50, ratio  # 10-50x longer, as the issue asks
    # the long ones are repeats whose length the prompt states: R{k}:{s}= gives k copies
    for p in tasks.prompts:
        if p.family == Family.REPEAT:
            k, s = p.text[1:-1].split(":")
            assert len(p.answer) == int(k) * (len(s) + 2)
    assert set(f for f in (p.family for p in tasks.prompts)) <= {
        Family.REPEAT, Family.REVERSE, Family.COUNT,
    }  # fmt: skip


def test_the_task_set_comes_from_the_spec_and_an_unknown_one_is_named():
    from experiments.specs import config_path
    from policies.spec import load_spec
    from runtime.tasks import task_set

    spec = load_spec(config_path("live-tiny"), ["workload.tasks=longtail"])
    assert task_set(spec).mix == "longtail"
    assert [p.text for p in task_set(load_spec(config_path("live-tiny"))).prompts] == [
        p.text for p in TaskSet(0, 256, 128).prompts
    ]  # the default set is the one every earlier run used
    with pytest.raises(ValueError, match="workload.tasks: unknown task set 'spiky'"):
        TaskSet(0, 8, 128, mix="spiky")
