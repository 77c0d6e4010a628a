"""Ranks of a sharded trainer in separate processes, for ``test_sharded_trainer``.

Each rank joins a gloo group on 127.0.0.1 and runs one scenario; rank results come back
as ``torch.save`` files (a tensor handed through a queue dies with its process). Ranks
start from a ``forkserver`` that has imported torch and transformers once: a ``spawn``ed
rank spends 15-25 s importing them again on a small shared CI machine.
"""

from __future__ import annotations

import multiprocessing as mp
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

from policies.records import SampleRecord, Span, SpanKind
from runtime.recorder import DataPosition
from runtime.trainer import TrainerConfig, TrainItem

PRELOAD = ["sharded_harness", "runtime.sharded_trainer", "runtime.trainer_proc",
           "transformers.models.llama.modeling_llama"]  # fmt: skip
VOCAB = 32
MICRO_BATCH = 2
BATCH_SIZES = (5, 8, 1)  # step 0: 3 micro-batches over 2 ranks; step 2: rank 1 only idles


def make_model_dir(path: Path) -> str:
    """A small random Llama (2 layers, hidden 64) saved as Hugging Face files."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=128,
        tie_word_embeddings=False,
    )  # fmt: skip
    LlamaForCausalLM(config).save_pretrained(path, safe_serialization=True)
    return str(path)


def trainer_config(model_dir: str) -> TrainerConfig:
    return TrainerConfig(
        model_dir, batch_size=8, learning_rate=1e-2, kl_coef=0.05,
        micro_batch_samples=MICRO_BATCH, keep_checkpoints=2,
    )  # fmt: skip


def batch(step: int) -> list[TrainItem]:
    """The fixed items of ``step``: varied lengths, old log-probs and advantages."""
    g = torch.Generator().manual_seed(100 + step)
    items = []
    for i in range(BATCH_SIZES[step]):
        num_prompt = int(torch.randint(2, 7, (1,), generator=g))
        num_out = int(torch.randint(1, 12, (1,), generator=g))
        items.append(
            TrainItem(
                sample_id=100 * step + i,
                prompt_ids=tuple(torch.randint(3, VOCAB, (num_prompt,), generator=g).tolist()),
                output_ids=tuple(torch.randint(3, VOCAB, (num_out,), generator=g).tolist()),
                logprobs_old=tuple((-1.0 - 3.0 * torch.rand(num_out, generator=g)).tolist()),
                advantage=float(torch.randn(1, generator=g)),
                reward=float(i % 2),
                version_start=max(0, step - i % 2),
            )
        )
    return items


def position(next_step: int) -> DataPosition:
    sample = SampleRecord(
        sample_id=7, prompt_id=1, group_id=0, iteration=0, instance_id=0, prompt_tokens=4,
        output_tokens=3, predicted_output_tokens=None, dispatch_s=0.5, gen_start_s=0.5,
        gen_end_s=1.25, train_step=next_step - 1, version_start=0, version_end=1,
        version_trained=next_step - 1, reward=1.0,
    )  # fmt: skip
    span = Span("trainer", SpanKind.TRAIN, 1.25, 2.5, iteration=next_step - 1)
    return DataPosition(next_step, 2.5, [sample], [span], [{"step": next_step - 1}])


def _rank_main(rank: int, world: int, port: int, fn: Callable, args: tuple) -> None:
    import torch.distributed as dist

    from runtime.sharded_trainer import init_trainer_group

    init_trainer_group("127.0.0.1", port, rank, world, timeout_s=60)
    try:
        fn(rank, world, *args)
    finally:
        dist.destroy_process_group()


def run_ranks(fn: Callable, world: int, args: tuple, timeout_s: float = 150) -> None:
    """Run ``fn(rank, world, *args)`` on ``world`` spawned ranks; fail (and kill them all)
    if one fails or they are not done within ``timeout_s`` (a hang in a collective)."""
    from runtime.procs import free_port

    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(PRELOAD)  # no effect once this process's server runs
    port = free_port()
    procs = [
        ctx.Process(target=_rank_main, args=(r, world, port, fn, args), daemon=True)
        for r in range(world)
    ]
    for p in procs:
        p.start()
    deadline = time.monotonic() + timeout_s
    try:
        for p in procs:
            p.join(max(0.0, deadline - time.monotonic()))
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join()
    codes = [p.exitcode for p in procs]
    assert codes == [0] * world, f"rank exit codes {codes} (negative: killed at the timeout)"


def gradients(trainer) -> dict[str, Any]:
    """The step's full gradient (a collective with a sharded trainer) and its total norm
    as ``clip_grad_norm_`` computes it."""
    params = list(trainer.model.named_parameters())
    norm = torch.nn.utils.get_total_norm([p.grad for _, p in params])
    full = (lambda t: t.full_tensor()) if hasattr(norm, "full_tensor") else (lambda t: t)
    grads = [(n, full(p.grad).clone()) for n, p in params]
    return {"grads": grads, "grad_norm": float(full(norm))}


def _record(trainer, loss: float, grads: dict, stats) -> dict[str, Any]:
    named = trainer.named_weights()  # a collective: every rank
    return {
        "loss": loss,
        "stats": asdict(stats),
        "weights": [(n, t.clone()) for n, t in named],
        "meta": trainer.weights_meta(),
        **grads,
    }


def uninterrupted(rank: int, world: int, model_dir: str, ckpt: str, out: str) -> None:
    """Steps 0, 1, 2 of :func:`batch`; checkpoints (kept per step) after steps 0 and 1."""
    from runtime.sharded_trainer import ShardedTrainer
    from runtime.trainer_proc import TrainerWorker

    config = trainer_config(model_dir)
    worker = TrainerWorker(config, ShardedTrainer(config, rank, world))
    assert worker.initialise(ckpt) is None  # no checkpoint yet
    records = []
    for step in range(len(BATCH_SIZES)):
        loss = worker.train(batch(step), now_s=float(step))
        grads = gradients(worker.trainer)
        records.append(_record(worker.trainer, loss, grads, worker.step(step, float(step))))
        if step < 2:
            worker.checkpoint(ckpt, position(step + 1).to_dict())
    result = {"records": records, "push": push_on_rank_0(worker), "checksums": worker.checksums()}
    torch.save(result, Path(out) / f"{rank}.pt")


def push_on_rank_0(worker) -> dict[str, Any]:
    """A push as the caller of M ranks runs it: ``gather_weights`` on every rank, then
    rank 0 alone (its ``weights_meta`` included) sends them, to a group of no servers."""
    from runtime.procs import free_port

    gathered = worker.gather_weights()
    if worker.trainer.rank != 0:
        return {"gathered": gathered}
    worker.join_group([], "127.0.0.1", free_port(), "gloo")
    result = worker.push_weights(3)
    sent = torch.cat([f.flatten() for f in worker.trainer.sender._buffers.flats])
    return {"gathered": gathered, "version": result.version, "failures": result.failures,
            "sent": sent.clone()}  # fmt: skip


def resumed(rank: int, world: int, model_dir: str, ckpt: str, out: str) -> None:
    """Load ``ckpt`` (after step 1), train step 2, save again."""
    from runtime.sharded_trainer import ShardedTrainer
    from runtime.trainer_proc import TrainerWorker

    config = trainer_config(model_dir)
    worker = TrainerWorker(config, ShardedTrainer(config, rank, world))
    data = worker.initialise(ckpt)
    version = worker.trainer.version
    loss = worker.train(batch(2), now_s=2.0)
    grads = gradients(worker.trainer)
    record = _record(worker.trainer, loss, grads, worker.step(2, 2.0))
    worker.checkpoint(ckpt, position(3).to_dict())
    torch.save({"data": data, "version": version, "record": record}, Path(out) / f"{rank}.pt")
