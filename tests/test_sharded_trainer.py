"""The FSDP2 trainer on 2 CPU ranks (gloo) gives the single-process trainer's steps, and
its sharded checkpoints resume, reshard and export.

One 2-rank run trains steps 0 (5 items: 3 micro-batches for 2 ranks), 1 (8 items: 2
each) and 2 (1 item: rank 1 only idles), checkpointing after steps 0 and 1; a fresh pair
of ranks resumes after step 1; one :class:`Trainer` trains the same batches.
"""

from __future__ import annotations

import shutil
from dataclasses import asdict
from pathlib import Path

import pytest
import torch
from sharded_harness import (
    BATCH_SIZES,
    batch,
    gradients,
    make_model_dir,
    position,
    resumed,
    run_ranks,
    trainer_config,
    uninterrupted,
)

from runtime.checkpoints import kept_steps
from runtime.recorder import DataPosition
from runtime.trainer import Trainer
from runtime.weight_sync import tensor_checksum

STATS_EXACT = ("step", "version", "num_samples", "num_tokens")
STATS_CLOSE = ("loss", "mean_reward", "mean_lag", "ess", "clip_fraction", "kl")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> str:
    return make_model_dir(tmp_path_factory.mktemp("model"))


@pytest.fixture(scope="module")
def single(model_dir) -> list[dict]:
    """The single-process trainer's loss, stats and weights after each step."""
    trainer = Trainer(trainer_config(model_dir))
    trainer.initialise()
    records = []
    for step in range(len(BATCH_SIZES)):
        loss = trainer.train(batch(step), now_s=float(step))
        grads = gradients(trainer)
        stats = asdict(trainer.step(step, float(step)))
        weights = [(n, t.clone()) for n, t in trainer.named_weights()]
        records.append({"loss": loss, "stats": stats, "weights": weights,
                        "meta": trainer.weights_meta(), **grads})  # fmt: skip
    return records


@pytest.fixture(scope="module")
def run(model_dir, tmp_path_factory) -> tuple[Path, list[dict]]:
    """The run directory of the uninterrupted 2-rank run and each rank's results."""
    run_dir = tmp_path_factory.mktemp("run")
    ckpt = run_dir / "checkpoints" / "last.dcp"
    run_ranks(uninterrupted, 2, (model_dir, str(ckpt), str(run_dir)))
    return run_dir, [torch.load(run_dir / f"{r}.pt", weights_only=False) for r in range(2)]


def _assert_same_weights(actual, expected, atol: float) -> None:
    assert [n for n, _ in actual] == [n for n, _ in expected]
    for (name, a), (_, e) in zip(actual, expected):
        assert a.shape == e.shape, name
        assert torch.allclose(a, e, rtol=0, atol=atol), (name, float((a - e).abs().max()))


def _assert_same_stats(actual: dict, expected: dict) -> None:
    for key in STATS_EXACT:
        assert actual[key] == expected[key], key
    for key in STATS_CLOSE:
        assert actual[key] == pytest.approx(expected[key], rel=1e-5, abs=1e-6), key


@pytest.mark.parametrize("step", [0, 1, 2], ids=["uneven-5", "even-8", "one-item"])
def test_two_ranks_step_as_one_trainer(run, single, step):
    _, ranks = run
    expected = single[step]
    for rank in ranks:  # every rank reports the same statistics
        record = rank["records"][step]
        _assert_same_stats(record["stats"], expected["stats"])
        assert record["loss"] == pytest.approx(expected["loss"], rel=1e-5, abs=1e-6)
        # summed over ranks, not averaged; clipped by the norm of the whole gradient
        _assert_same_weights(record["grads"], expected["grads"], 1e-6)
        assert record["grad_norm"] == pytest.approx(expected["grad_norm"], rel=1e-5)
    _assert_same_weights(ranks[0]["records"][step]["weights"], expected["weights"], 1e-5)
    before = single[step - 1]["weights"] if step else None
    if before:  # the step changed the weights: the comparison is not vacuous
        assert any(not torch.equal(a, b) for (_, a), (_, b) in zip(before, single[step]["weights"]))


def test_named_weights_are_full_on_rank_0_only(run, single):
    _, (rank0, rank1) = run
    names = [n for n, _ in single[0]["weights"]]
    assert [n for n, _ in rank0["records"][0]["weights"]] == names
    assert rank1["records"][0]["weights"] == []
    assert rank0["records"][0]["meta"] == rank1["records"][0]["meta"] == single[0]["meta"]


def test_rank_0_pushes_the_weights_all_ranks_gathered(run):
    _, (rank0, rank1) = run
    final = rank0["records"][-1]["weights"]
    assert rank0["push"]["gathered"] == len(final) and rank1["push"] == {"gathered": 0}
    assert (rank0["push"]["version"], rank0["push"]["failures"]) == (3, {})
    assert torch.equal(rank0["push"]["sent"], torch.cat([t.flatten() for _, t in final]))
    assert rank0["checksums"] == {n: tensor_checksum(t) for n, t in final}
    assert rank1["checksums"] == {}


def test_resume_after_step_1_trains_step_2_as_the_uninterrupted_run(run, model_dir, tmp_path):
    run_dir, ranks = run
    ckpt = tmp_path / "checkpoints" / "last.dcp"
    shutil.copytree(run_dir / "checkpoints" / "last.dcp", ckpt)
    stray = ckpt.with_name(".last.dcp.tmp")  # a save that crashed half-way
    stray.mkdir()
    (stray / "__0_0.distcp").write_bytes(b"half a shard")
    run_ranks(resumed, 2, (model_dir, str(ckpt), str(tmp_path)))
    out = [torch.load(tmp_path / f"{r}.pt", weights_only=False) for r in range(2)]
    for rank in out:
        assert rank["version"] == 2
        assert DataPosition.from_dict(rank["data"]) == position(2)
        _assert_same_stats(rank["record"]["stats"], ranks[0]["records"][2]["stats"])
    _assert_same_weights(out[0]["record"]["weights"], ranks[0]["records"][2]["weights"], 1e-6)
    assert not stray.exists()  # the next save went through it
    assert kept_steps(ckpt.parent) == [2]


def test_a_checkpoint_of_2_ranks_loads_on_1(run, model_dir):
    import torch.distributed as dist

    from runtime.procs import free_port
    from runtime.sharded_trainer import ShardedTrainer, init_trainer_group

    run_dir, ranks = run
    init_trainer_group("127.0.0.1", free_port(), 0, 1, timeout_s=30)
    try:
        trainer = ShardedTrainer(trainer_config(model_dir), 0, 1)
        trainer.initialise()
        data = trainer.load_checkpoint(run_dir / "checkpoints" / "last.dcp")
        _assert_same_weights(trainer.named_weights(), ranks[0]["records"][1]["weights"], 0.0)
        trainer.train(batch(2), now_s=2.0)
        trainer.step(2, 2.0)  # the optimizer state was resharded too
        _assert_same_weights(trainer.named_weights(), ranks[0]["records"][2]["weights"], 1e-5)
    finally:
        dist.destroy_process_group()
    assert DataPosition.from_dict(data) == position(2)


def test_export_of_a_sharded_checkpoint_is_the_trainers_weights(run, model_dir, tmp_path):
    from safetensors.torch import load_file

    from runtime.export import export_policy
    from runtime.sharded_checkpoint import full_state_dict_from_dcp

    run_dir, ranks = run
    assert kept_steps(run_dir / "checkpoints") == [0, 1]
    full = full_state_dict_from_dcp(run_dir / "checkpoints" / "last.dcp")
    _assert_same_weights(list(full.items()), ranks[0]["records"][1]["weights"], 0.0)
    (run_dir / "spec.yaml").write_text(f"run: {{name: x}}\nmodel: {{path: {model_dir}}}\n")
    for step in (None, 0):
        out = tmp_path / f"export-{step}"
        info = export_policy(run_dir, out, step=step)
        assert (info.step, info.version) == ((1, 2) if step is None else (0, 1))
        exported = load_file(out / "model.safetensors")
        expected = ranks[0]["records"][info.step]["weights"]
        assert sorted(exported) == sorted(n for n, _ in expected)
        for name, tensor in expected:
            assert torch.equal(exported[name], tensor), name


def test_the_warm_up_pass_changes_nothing_a_step_computes(model_dir, single):
    """Weights, gradient, optimizer and RNG as they were: the first step after a warm-up
    is bit for bit the step without one."""
    trainer = Trainer(trainer_config(model_dir))
    trainer.initialise()
    rng = torch.get_rng_state()
    trainer.warm_up()
    assert torch.equal(torch.get_rng_state(), rng)
    assert all(p.grad is None for p in trainer.model.parameters())
    assert not trainer.optimizer.state
    loss = trainer.train(batch(0), now_s=0.0)
    trainer.step(0, 0.0)
    assert loss == single[0]["loss"]
    _assert_same_weights(trainer.named_weights(), single[0]["weights"], atol=0.0)
