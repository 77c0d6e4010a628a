"""The trainer's side of the GPU path, checked on a CUDA machine without vLLM.

``scripts/gpu-check.sh`` needs vLLM's CUDA build, which a machine without a package
index cannot install. What the trainer contributes to a GPU run needs torch alone, and
this script checks it (CI never runs it; it exits 2 without CUDA):

1. ``cpu-vs-cuda``: three GRPO steps of the trainer on the GPU equal the same steps on
   the CPU (losses, weights after the last step), TF32 off.
2. ``compiled``: the same under ``torch.compile`` on the GPU (inductor, Triton).
3. ``sharded``: the FSDP2 trainer, one rank over NCCL, equals the plain trainer.
4. ``push-<backend>``: a weight push from the trainer (rank 0) to a receiver process on
   the same GPU (rank 1), through ``WeightReceiver``'s receive and verify with the
   engine's load replaced; the receiver's tensors equal the trainer's.
5. ``step-time``: one step of 32 samples in a Qwen2.5-0.5B-shaped model.

Usage: python scripts/gpu_trainer_check.py OUT_DIR  (writes OUT_DIR/gpu_trainer_check.json;
exit status 1 when a check failed)."""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from runtime.procs import free_port  # noqa: E402
from runtime.trainer import Trainer, TrainerConfig, TrainItem  # noqa: E402

VOCAB = 32
HOST = "127.0.0.1"
# "cpu": a dry run of the same checks on this host (no compile, NCCL or 0.5B timing)
DEVICE = os.environ.get("TANDEM_CHECK_DEVICE", "cuda")


def make_model(path: Path, hidden: int, layers: int, heads: int, mlp: int) -> str:
    from transformers import LlamaConfig, LlamaForCausalLM

    if not (path / "config.json").exists():
        torch.manual_seed(0)
        config = LlamaConfig(
            vocab_size=VOCAB, hidden_size=hidden, intermediate_size=mlp,
            num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=heads,
            max_position_embeddings=512, tie_word_embeddings=False,
        )  # fmt: skip
        LlamaForCausalLM(config).save_pretrained(path, safe_serialization=True)
    return str(path)


def batch(step: int, size: int = 8, max_out: int = 12) -> list[TrainItem]:
    g = torch.Generator().manual_seed(100 + step)
    items = []
    for i in range(size):
        n_prompt = int(torch.randint(2, 7, (1,), generator=g))
        n_out = int(torch.randint(1, max_out, (1,), generator=g))
        items.append(
            TrainItem(
                sample_id=100 * step + i,
                prompt_ids=tuple(torch.randint(3, VOCAB, (n_prompt,), generator=g).tolist()),
                output_ids=tuple(torch.randint(3, VOCAB, (n_out,), generator=g).tolist()),
                logprobs_old=tuple((-1.0 - 3.0 * torch.rand(n_out, generator=g)).tolist()),
                advantage=float(torch.randn(1, generator=g)),
                reward=float(i % 2),
                version_start=step,
            )
        )
    return items


def config(model_dir: str, device: str, compile: bool = False) -> TrainerConfig:
    return TrainerConfig(
        model_dir, batch_size=8, learning_rate=1e-2, kl_coef=0.05, micro_batch_samples=3,
        device=device, compile=compile,
    )  # fmt: skip


def run_steps(trainer: Trainer, steps: int = 3) -> dict:
    trainer.initialise()
    trainer.warm_up()
    losses = []
    for step in range(steps):
        losses.append(trainer.train(batch(step), float(step)))
        trainer.step(step, float(step))
    weights = {n: t.detach().to("cpu").clone() for n, t in trainer.named_weights()}
    return {"losses": losses, "weights": weights}


def compare(a: dict, b: dict, tol: float) -> dict:
    loss_diff = max(abs(x - y) for x, y in zip(a["losses"], b["losses"]))
    weight_diff = max(float((a["weights"][n] - b["weights"][n]).abs().max()) for n in a["weights"])
    return {
        "losses": [a["losses"], b["losses"]],
        "max_loss_diff": loss_diff,
        "max_weight_diff": weight_diff,
        "ok": loss_diff <= tol and weight_diff <= tol and set(a["weights"]) == set(b["weights"]),
    }


def sharded_one_rank(model_dir: str) -> dict:
    import torch.distributed as dist

    from runtime.sharded_trainer import ShardedTrainer, init_trainer_group

    backend = "nccl" if DEVICE == "cuda" else "gloo"
    init_trainer_group(HOST, free_port(HOST), 0, 1, backend=backend, timeout_s=60)
    try:
        return run_steps(ShardedTrainer(config(model_dir, DEVICE), 0, 1, device=DEVICE))
    finally:
        dist.destroy_process_group()


def _receiver(port: int, backend: str, wire: list, digests: list, out: str) -> None:
    import runtime.weight_sync as ws

    loaded: dict[str, torch.Tensor] = {}

    def load(_runner, named) -> bool:  # the engine's load, replaced: keep a copy
        loaded.update({n: t.to("cpu").clone() for n, t in named})
        return True

    ws.load_into = load
    receiver = ws.WeightReceiver()
    receiver.model_runner = None
    joined = receiver.tandem_join(HOST, port, 1, 2, backend, 60.0)
    assert not joined, joined["failure"]
    result = receiver.tandem_receive(wire, digests, 60.0)
    torch.save({"result": result, "loaded": loaded}, out)


def push(model_dir: str, backend: str, out_dir: Path) -> dict:
    from dataclasses import asdict

    trainer = Trainer(config(model_dir, DEVICE))
    trainer.initialise()
    trainer.train(batch(0), 0.0)
    trainer.step(0, 0.0)
    named = trainer.named_weights()
    sender = trainer.sender
    port = free_port(HOST)
    wire = [(m["name"], tuple(m["shape"]), m["dtype"]) for m in trainer.weights_meta()]
    out = str(out_dir / f"received-{backend}.pt")
    # the receiver verifies against the digests of the packed buffers: pack on the
    # sender's device (cuda for nccl, the host for gloo) before it starts
    sender.device = torch.device(DEVICE if backend == "nccl" else "cpu")
    flats = sender.pack(named)
    digests = [asdict(d) for d in sender.digests(named, flats)]
    proc = mp.get_context("spawn").Process(
        target=_receiver, args=(port, backend, wire, digests, out)
    )
    proc.start()
    try:
        sender.join(HOST, port, 2, backend, 60.0)
        start = time.perf_counter()
        sender.send(flats, 60.0)  # the buffers packed above (join keeps them)
        send_s = time.perf_counter() - start
        proc.join(120)
        if proc.exitcode != 0:
            return {"ok": False, "error": f"receiver exit code {proc.exitcode}"}
    finally:
        if proc.is_alive():
            proc.kill()
    got = torch.load(out)
    if "failure" in got["result"]:
        return {"ok": False, "error": got["result"]["failure"]}
    diff = max(float((got["loaded"][n] - t.to("cpu")).abs().max()) for n, t in named)
    return {
        "ok": diff == 0.0 and len(got["loaded"]) == len(named),
        "max_diff": diff,
        "send_s": send_s,
        "stages_ms": {k: v for k, v in got["result"].items() if k.endswith("_ms")},
    }


def step_time(out_dir: Path) -> dict:
    model_dir = make_model(out_dir / "qwen-shape", hidden=896, layers=24, heads=14, mlp=4864)
    trainer = Trainer(
        TrainerConfig(model_dir, batch_size=32, learning_rate=1e-5, micro_batch_samples=8,
                      device="cuda")
    )  # fmt: skip
    trainer.initialise()
    trainer.warm_up()
    times = []
    for step in range(4):
        torch.cuda.synchronize()
        start = time.perf_counter()
        trainer.train(batch(step, size=32, max_out=128), float(step))
        trainer.step(step, float(step))
        torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return {"ok": True, "step_s": times, "steady_step_s": sorted(times[1:])[1]}


def attempt(name: str, fn: Callable[[], dict], results: dict) -> None:
    start = time.perf_counter()
    try:
        results[name] = fn()
    except Exception as err:  # noqa: BLE001 - every check reports, the others still run
        results[name] = {"ok": False, "error": f"{type(err).__name__}: {err}",
                         "traceback": traceback.format_exc()[-3000:]}  # fmt: skip
    results[name]["seconds"] = round(time.perf_counter() - start, 2)
    print(name, json.dumps({k: v for k, v in results[name].items() if k != "traceback"}),
          flush=True)  # fmt: skip


def main() -> int:
    out_dir = Path(sys.argv[1] if len(sys.argv) > 1 else "runs/gpu-trainer-check")
    if DEVICE == "cuda" and not torch.cuda.is_available():
        print("gpu_trainer_check: no CUDA device here")
        return 2
    out_dir.mkdir(parents=True, exist_ok=True)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    model_dir = make_model(out_dir / "small", hidden=64, layers=2, heads=4, mlp=128)
    gpu = DEVICE == "cuda"
    name = torch.cuda.get_device_name(0) if gpu else "cpu (dry run)"
    results: dict = {"device": name, "torch": torch.__version__}
    cpu = run_steps(Trainer(config(model_dir, "cpu")))
    on_device = lambda compile=False: run_steps(Trainer(config(model_dir, DEVICE, compile)))  # noqa: E731
    attempt("cpu-vs-cuda", lambda: compare(cpu, on_device(), 1e-4), results)
    if gpu:
        attempt("compiled", lambda: compare(cpu, on_device(True), 1e-4), results)
    attempt("sharded", lambda: compare(cpu, sharded_one_rank(model_dir), 1e-4), results)
    for backend in ("nccl", "gloo") if gpu else ("gloo",):
        attempt(f"push-{backend}", lambda b=backend: push(model_dir, b, out_dir), results)
    if gpu:
        attempt("step-time", lambda: step_time(out_dir), results)
    (out_dir / "gpu_trainer_check.json").write_text(json.dumps(results, indent=1))
    failed = [k for k, v in results.items() if isinstance(v, dict) and not v["ok"]]
    print("gpu_trainer_check:", "all passed" if not failed else f"failed: {failed}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
