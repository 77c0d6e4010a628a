"""A token budget that cannot prefill the longest sequence in one step, with chunked prefill
off, is refused before the run, naming the pool's keys, as vLLM refuses a
``max_num_batched_tokens`` below ``max_model_len`` without chunked prefill (a request
preempted late recomputes its prompt and its output so far in one step).

Seen: ``--set cluster.generation.0.enable_chunked_prefill=false --set
cluster.generation.0.max_num_batched_tokens=256`` made runs/<name>/ and then failed mid-run
("sample 251 cannot be scheduled"), and a sweep over the budget passed its up-front check
of every point, so ``--skip-invalid`` could not leave the bad one out."""

from __future__ import annotations

import pytest
from helpers import small_spec

from experiments.cli import main
from experiments.sweep_point import check_point_specs
from policies.rng import RngStreams
from policies.spec import SpecError
from sim.cluster import check_sim_run
from sim.workload import Workload

OFF = {"cluster__generation__0__enable_chunked_prefill": False}
TWO_POOLS = [{"hardware": "H800", "num_gpus": 2}, {"hardware": "H800", "num_gpus": 2}]


def _longest(spec) -> int:
    return Workload(spec, RngStreams(spec.run.seed)).longest_sequence_tokens


def test_a_budget_below_the_longest_sequence_without_chunked_prefill_names_both_keys():
    spec = small_spec(**OFF, cluster__generation__0__max_num_batched_tokens=256)
    with pytest.raises(
        ValueError,
        match=r"^cluster\.generation\.0\.max_num_batched_tokens: 256 .*"
        r"cluster\.generation\.0\.enable_chunked_prefill",
    ):
        check_sim_run(spec)


def test_the_budget_must_hold_the_prompt_and_its_output_not_only_the_prompt():
    longest = _longest(small_spec())
    short = small_spec(**OFF, cluster__generation__0__max_num_batched_tokens=longest - 1)
    with pytest.raises(ValueError, match=rf"\({longest} tokens\)"):
        check_sim_run(short)
    check_sim_run(small_spec(**OFF, cluster__generation__0__max_num_batched_tokens=longest))
    # with chunked prefill on, any budget prefills a prompt in chunks
    check_sim_run(small_spec(cluster__generation__0__max_num_batched_tokens=256))


def test_the_second_pool_is_named_by_its_index():
    spec = small_spec(
        cluster__generation=TWO_POOLS,
        cluster__generation__1__enable_chunked_prefill=False,
        cluster__generation__1__max_num_batched_tokens=256,
    )
    with pytest.raises(ValueError, match=r"^cluster\.generation\.1\.max_num_batched_tokens"):
        check_sim_run(spec)


def test_a_sweep_checks_the_budget_of_every_point_up_front():
    base = small_spec(**OFF)
    key = "cluster.generation.0.max_num_batched_tokens"
    points = [{key: 16384}, {key: 300}, {key: 8192}]
    with pytest.raises(SpecError, match=rf"grid point {key}=300: .*max_num_batched_tokens"):
        check_point_specs(base, points)
    invalid = check_point_specs(base, points, skip_invalid=True)
    assert list(invalid) == [1]


def test_tandem_run_refuses_before_making_the_run_directory(tmp_path, capsys):
    out = tmp_path / "run"
    sets = ["cluster.generation.0.enable_chunked_prefill=false",
            "cluster.generation.0.max_num_batched_tokens=256"]  # fmt: skip
    assert main(["run", *(a for s in sets for a in ("--set", s)), "--out", str(out)]) == 2
    assert "cluster.generation.0.max_num_batched_tokens" in capsys.readouterr().out
    assert not out.exists()
