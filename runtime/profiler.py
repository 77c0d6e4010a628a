"""``tandem profile``: measure the live runtime's operators for ``tandem calibrate``.

Everything is measured through the paths a live run uses:

* **decode and prefill** — one vLLM server started and pinned like the launcher does
  (:func:`runtime.procs.start_server` on the generation cores). A burst of ``B``
  concurrent samples through the actor's own route (the batched
  ``/v1/tandem/generate`` stream, log-probs, token ids, a per-sample seed) with
  ``ignore_eos`` and a fixed ``max_tokens``: with ``max_tokens=1`` its wall time is
  ``W1`` (prefill with every per-request cost); with ``max_tokens=T`` the ``T - 1``
  decode steps take ``WT - W1``, at a mean context of ``prompt tokens + B·T/2``. The
  ``max_tokens=1`` burst of ``/v1/completions`` is kept beside it for comparison.
* **training** — :class:`runtime.trainer.Trainer` in this process, pinned to the
  training cores with the live run's torch threads: forward (token log-probs and the
  loss), backward and optimizer step timed separately, on micro-batches of task prompts
  with outputs of the tasks' lengths (so padding is what a live run sees).
* **weight sync** — :class:`runtime.trainer_proc.TrainerProcess` on the training cores,
  joined to the server's weight group, pushing its weights through
  ``/request_weight_update``; half the pushes land while a burst is generating
  (in flight). ``transfer_s`` is the push as the trainer sees it, ``pause_s`` the pause
  the server's generation saw.
* **decode under training** — bursts at ``contended_batch_sizes``, alternately with the
  trainer idle and with the trainer process training micro-batches without pause: the
  two cores of one host share caches and memory bandwidth, so the modes that overlap the
  stages decode slower (``slowdown`` = busy / idle; the sim's ``decode_slowdown``,
  applied while its trainer computes); and micro-batches trained through the trainer
  process alternately with the generation core idle and during a decode burst
  (``train_contended.csv``, the sim's ``train_slowdown``, applied to a train job that
  starts while an instance decodes).

Writes ``decode.csv``, ``prefill.csv``, ``train.csv``, ``weight_sync.csv``,
``decode_contended.csv``, ``train_contended.csv`` and ``profile.json`` (hardware, model, KV capacity, versions, date).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import secrets
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import httpx

from policies.spec import RunSpec
from runtime.hf_quiet import quiet_progress_bars
from runtime.http_pool import POOL_LIMITS
from runtime.live_run import model_dir_for, trainer_config
from runtime.model import check_model_dir, context_tokens
from runtime.procs import free_port, split_cores, start_server, stop_server, wait_healthy
from runtime.profile_bursts import (
    ACTOR_ROUTE,
    burst_s,
    median_burst,
    prefill_s,
    prompt_slice,
    warm_up,
)
from runtime.profile_files import describe, kv_capacity_from_log, write_profile
from runtime.profile_plan import SETUP_STEPS, ProfilePlan
from runtime.tasks import TaskSet, check_context, task_set
from runtime.trainer import TrainItem, token_logprobs
from runtime.trainer_proc import ServerAddr, TrainerProcess

Progress = Callable[[str], None]


@dataclass(slots=True)
class ProfileTables:
    decode: list[dict]
    prefill: list[dict]
    train: list[dict]
    weight_sync: list[dict]
    decode_contended: list[dict] = field(default_factory=list)
    train_contended: list[dict] = field(default_factory=list)


def profile_runtime(
    spec: RunSpec, out_dir: Path, plan: ProfilePlan | None = None, progress: Progress | None = None
) -> Path:
    """Profile ``spec``'s runtime (one server, one trainer); write the tables to ``out_dir``."""
    plan = plan or ProfilePlan()
    check_profile_spec(spec, plan)
    tick = progress or (lambda _: None)
    out_dir = Path(out_dir)
    model_dir = model_dir_for(spec)
    gen_cores, train_cores = split_cores(1)
    token = secrets.token_hex(8)
    live, pool = spec.live, spec.cluster.generation[0]
    server = start_server(
        0, model_dir, "127.0.0.1", free_port(), token, gen_cores, live.kv_cache_gib,
        live.max_model_len, pool.max_num_seqs, out_dir / "logs",
    )  # fmt: skip
    trainer = TrainerProcess(trainer_config(spec, model_dir), train_cores)
    try:
        wait_healthy(server, live.startup_timeout_s)
        tick(SETUP_STEPS[0])
        tasks = task_set(spec)
        tables = asyncio.run(
            _measure_server(spec, plan, tasks, server.base_url, token, trainer, tick)
        )
        tables.train, info = _measure_training(spec, plan, tasks, model_dir, train_cores, tick)
        kv_tokens = kv_capacity_from_log(server.log_text())
    finally:
        trainer.stop()
        stop_server(server)
    info |= describe(
        spec, model_dir, gen_cores, train_cores, kv_tokens, plan, _weight_bytes(spec),
        ACTOR_ROUTE,
    )  # fmt: skip
    write_profile(out_dir, asdict(tables), info)
    return out_dir


def check_profile_spec(spec: RunSpec, plan: ProfilePlan | None = None) -> None:
    """What a profile of ``spec`` by ``plan`` needs, checked before a server or trainer
    starts (a missing model directory failed ~20 s in, as a server's traceback)."""
    (plan or ProfilePlan()).check_batches(spec.cluster.generation[0].max_num_seqs)
    if spec.model.path:
        check_model_dir(spec.model.path, "model.path")
    model_tokens = context_tokens(spec.model.path or None)
    check_context(task_set(spec), spec.live.max_model_len, model_tokens=model_tokens)


# -- generation: decode and prefill -------------------------------------------------------


async def _measure_server(spec, plan, tasks, url, token, trainer, tick) -> ProfileTables:
    temperature = spec.live.temperature
    async with httpx.AsyncClient(base_url=url, timeout=600.0, limits=POOL_LIMITS) as http:
        await warm_up(http, tasks, temperature)
        tick(SETUP_STEPS[1])
        decode, prefill = await _measure_decode(http, plan, tasks, temperature, tick)
        sync = await _measure_weight_sync(http, plan, tasks, url, token, trainer, spec, tick)
        items = train_items(tasks, spec.live.micro_batch_samples, 11, _vocab_size(spec))
        contended = await _measure_contended_decode(
            http, plan, tasks, trainer, items, temperature, tick
        )
        trained = await _measure_contended_training(http, plan, tasks, trainer, spec, tick)
    return ProfileTables(decode, prefill, [], sync, contended, trained)


async def _measure_decode(http, plan, tasks, temperature, tick) -> tuple[list, list]:
    """Decode steps from fixed-length bursts through the actor's route (``ignore_eos``)
    minus the same route's ``max_tokens=1`` burst, which is also the prefill."""
    decode, prefill = [], []
    for k, batch in enumerate(plan.batch_sizes):
        prompts = prompt_slice(tasks, batch, offset=17 * k)
        prompt_tokens = sum(p.prompt_tokens for p in prompts)
        route_s, w1 = await prefill_s(http, prompts, temperature, plan.repeats + 1)
        prefill.append({"num_tokens": prompt_tokens, "num_requests": batch, "prefill_s": route_s,
                        "completions_prefill_s": w1})  # fmt: skip
        tick(f"prefill {batch} requests")
        for steps in plan.max_tokens:
            wt = await median_burst(http, prompts, steps, temperature, plan.repeats)
            decode.append(
                {
                    "batch_size": batch,
                    "context_tokens": prompt_tokens + batch * steps / 2,
                    "step_s": (wt - route_s) / (steps - 1),
                    "max_tokens": steps,
                    "burst_s": wt,
                }
            )
            tick(f"decode {batch}×{steps}")
    return decode, prefill


async def _measure_contended_decode(http, plan, tasks, trainer, items, temperature, tick) -> list:
    """The same burst with the trainer core idle and with the trainer process training
    micro-batches without pause, alternating (``repeats`` pairs, medians): on one host the
    two stages share caches and memory bandwidth, and the modes that overlap them decode
    ``slowdown`` = busy / idle times slower. A ratio of whole bursts, not a difference of
    two, so the noise of one burst is not amplified."""
    rows = []
    for k, batch in enumerate(plan.contended_batch_sizes):
        prompts = prompt_slice(tasks, batch, offset=17 * k + 5)
        for steps in plan.max_tokens:
            idle, busy = [], []
            for _ in range(plan.repeats + 1):
                idle.append(await burst_s(http, prompts, steps, temperature))
                async with _trainer_busy(trainer, items):
                    busy.append(await burst_s(http, prompts, steps, temperature))
            idle_s, busy_s = statistics.median(idle), statistics.median(busy)
            rows.append(
                {"batch_size": batch, "max_tokens": steps, "idle_burst_s": idle_s,
                 "busy_burst_s": busy_s, "slowdown": busy_s / idle_s}
            )  # fmt: skip
            tick(f"decode {batch}×{steps}, trainer idle / busy")
    return rows


async def _measure_contended_training(http, plan, tasks, trainer, spec, tick) -> list[dict]:
    """Micro-batches trained through the trainer process (as a live run calls it), with
    the generation core idle and then during a long decode burst, alternating: the
    training side of the same contention (``slowdown`` = busy / idle)."""
    vocab = _vocab_size(spec)
    prompts = prompt_slice(tasks, 20, offset=41)
    rows = []
    for k, size in enumerate(plan.contended_micro_batches):
        items = train_items(tasks, size, offset=23 * k + 1, vocab=vocab)
        idle, busy = [], []
        for _ in range(plan.train_repeats):
            idle.append(await _train_s(trainer, items))
            burst = asyncio.create_task(burst_s(http, prompts, 112, spec.live.temperature))
            await asyncio.sleep(0.2)  # the burst is decoding
            busy.append(await _train_s(trainer, items))
            await burst
        idle_s, busy_s = statistics.median(idle), statistics.median(busy)
        rows.append(
            {"num_tokens": sum(len(i.prompt_ids) + len(i.output_ids) for i in items),
             "num_samples": size, "idle_s": idle_s, "busy_s": busy_s, "slowdown": busy_s / idle_s}
        )  # fmt: skip
        tick(f"train {size} samples, generation idle / busy")
    return rows


async def _train_s(trainer: TrainerProcess, items: list[TrainItem]) -> float:
    start = time.perf_counter()
    await trainer.train(items, 0.0)
    return time.perf_counter() - start


@contextlib.asynccontextmanager
async def _trainer_busy(trainer, items: list[TrainItem]):  # noqa: ANN202 - context manager
    """The trainer process trains ``items`` over and over until the block exits."""
    stop = asyncio.Event()
    started = asyncio.Event()

    async def loop() -> None:
        while not stop.is_set():
            started.set()
            await trainer.train(items, 0.0)

    task = asyncio.create_task(loop())
    await started.wait()
    await asyncio.sleep(0.05)  # the first micro-batch is under way
    try:
        yield
    finally:
        stop.set()
        await task


def _vocab_size(spec: RunSpec) -> int:
    return int(json.loads((Path(model_dir_for(spec)) / "config.json").read_text())["vocab_size"])


# -- weight sync: real pushes, idle and in flight ------------------------------------------


async def _measure_weight_sync(http, plan, tasks, url, token, trainer, spec, tick) -> list[dict]:
    trainer.start()
    await trainer.initialise(None)
    await trainer.join_group([ServerAddr(url, token)], "127.0.0.1", free_port(), "gloo")
    num_bytes = await asyncio.to_thread(_weight_bytes, spec)
    rows = []
    for i in range(plan.num_pushes):
        in_flight = i % 2 == 1
        load = None
        if in_flight:  # a burst generating while the weights arrive
            load = asyncio.create_task(
                burst_s(http, prompt_slice(tasks, 16, 5 * i), 96, spec.live.temperature)
            )
            await asyncio.sleep(0.3)
        start = time.perf_counter()
        result = await trainer.push_weights(i + 1)
        transfer_s = time.perf_counter() - start
        if result.failures:
            raise RuntimeError(f"weight push {i + 1} failed: {result.failures[0]}")
        if load is not None:
            await load
        rows.append(
            {"num_bytes": num_bytes, "transfer_s": transfer_s, "pause_s": result.pause_s[0],
             "in_flight": in_flight}
        )  # fmt: skip
        tick(f"weight push {i + 1}{' (in flight)' if in_flight else ''}")
    return rows


def _weight_bytes(spec: RunSpec) -> int:
    from transformers import AutoModelForCausalLM

    quiet_progress_bars()
    model = AutoModelForCausalLM.from_pretrained(model_dir_for(spec))
    return sum(t.numel() * t.element_size() for t in model.state_dict().values())


# -- training: forward, backward, optimizer ------------------------------------------------


def _measure_training(spec, plan, tasks, model_dir, cores, tick) -> tuple[list[dict], dict]:
    from runtime.trainer import Trainer

    saved = os.sched_getaffinity(0)
    os.sched_setaffinity(0, cores)
    try:
        trainer = Trainer(trainer_config(spec, model_dir))
        trainer.initialise()
        vocab = trainer.model.config.vocab_size
        _time_train_step(trainer, train_items(tasks, 4, 0, vocab), step=0)  # warm-up
        rows = []
        for k, size in enumerate(plan.micro_batch_samples):
            for r in range(plan.train_repeats):
                items = train_items(tasks, size, offset=31 * k + 7 * r, vocab=vocab)
                rows.append(_time_train_step(trainer, items, step=len(rows) + 1))
                tick(f"train {size} samples")
        num_params = sum(p.numel() for p in trainer.model.parameters())
    finally:
        os.sched_setaffinity(0, saved)
    return rows, {"num_params": num_params}


def train_items(tasks: TaskSet, count: int, offset: int, vocab: int) -> list[TrainItem]:
    """Micro-batch of task prompts with outputs as long as their answers (capped)."""
    items = []
    for i, p in enumerate(prompt_slice(tasks, count, offset)):
        n = min(p.expected_output_tokens, tasks.max_output_tokens)
        ids = tuple((3 + j * 7 + i) % vocab for j in range(p.prompt_tokens + n))
        items.append(
            TrainItem(i, ids[: p.prompt_tokens], ids[p.prompt_tokens :], (-1.0,) * n,
                      advantage=0.5 - i % 2, reward=0.0, version_start=0)
        )  # fmt: skip
    return items


def _time_train_step(trainer, items: list[TrainItem], step: int) -> dict:
    """One micro-batch then the optimizer step, each phase timed as Trainer.train runs it."""
    import torch

    from runtime.loss import rl_loss

    c = trainer.config
    start = time.perf_counter()
    logp, mask = token_logprobs(trainer.model, items)
    old = torch.nn.utils.rnn.pad_sequence(
        [torch.tensor(it.logprobs_old) for it in items], batch_first=True
    )
    adv = torch.tensor([it.advantage for it in items])
    loss = rl_loss(logp, old, adv, mask, c.batch_size, c.algorithm, c.clip_epsilon).loss
    forward_s = time.perf_counter() - start
    start = time.perf_counter()
    loss.backward()
    backward_s = time.perf_counter() - start
    start = time.perf_counter()
    trainer.step(step, 0.0)
    optimizer_s = time.perf_counter() - start
    tokens = sum(len(it.prompt_ids) + len(it.output_ids) for it in items)
    return {
        "num_tokens": tokens,
        "num_samples": len(items),
        "forward_s": forward_s,
        "backward_s": backward_s,
        "optimizer_s": optimizer_s,
    }
