"""The torch trainer, implementing PipelineRL's trainer contract as a Python API.

``initialise`` (load the Hugging Face weights, AdamW, optional frozen reference model) →
``train`` (forward: token log-probs; backward: the RL objective of :mod:`runtime.loss`,
accumulated) → ``step`` (optimizer step, returns :class:`StepStats`) → ``push_weights``
(broadcast every tensor, in checkpoint layout, to every server through
``/request_weight_update``). Checkpoints hold weights, optimizer, step and the caller's
data position, and are written atomically (temporary file + ``os.replace``).
"""

from __future__ import annotations

import copy
import io
import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from policies.records import StepStats
from policies.results import write_atomic
from runtime.errors import NonFiniteGradient
from runtime.hf_quiet import quiet_progress_bars
from runtime.loss import clip_fraction, effective_sample_size, rl_loss
from runtime.packing import packed_logprobs
from runtime.weight_sync import WeightSender, params_meta


@dataclass(slots=True, frozen=True)
class TrainerConfig:
    model_dir: str
    batch_size: int  # sequences per optimizer step (the token weight is 1 / batch_size)
    algorithm: str = "grpo"
    learning_rate: float = 1e-4
    clip_epsilon: float = 0.2
    kl_coef: float = 0.0
    max_grad_norm: float = 1.0
    seed: int = 0
    num_threads: int = 1  # 0: one per core this process may run on
    micro_batch_samples: int = 8  # samples per forward/backward (a call is split into these)
    keep_checkpoints: int = 0  # per-step checkpoints kept beside last.pt (runtime.checkpoints)
    device: str = "cpu"  # cpu or cuda (the model and its step run there)
    compile: bool = False  # forward and backward under torch.compile, compiled in warm_up
    skip_zero_advantage: bool = True  # no forward/backward for samples that add no gradient
    share_prompts: bool = True  # a group's samples share one copy of their prompt (packing)


@dataclass(slots=True, frozen=True)
class TrainItem:
    """One sample as the trainer sees it: prompt and output ids, old log-probs, advantage."""

    sample_id: int
    prompt_ids: tuple[int, ...]
    output_ids: tuple[int, ...]
    logprobs_old: tuple[float, ...]
    advantage: float
    reward: float
    version_start: int  # the oldest weights it depends on: its prompt KV's version


@dataclass(slots=True)
class _StepAccumulator:
    num_samples: int = 0
    num_tokens: int = 0
    loss: float = 0.0
    rewards: list[float] = field(default_factory=list)
    lags: list[int] = field(default_factory=list)
    weights: list[torch.Tensor] = field(default_factory=list)
    kl_sum: float = 0.0  # reference KL of each micro-batch, weighted by its samples
    num_skipped: int = 0  # samples not forwarded: advantage 0 (Trainer.trainable)
    passes: int = 0  # forward/backward passes run (a step without one gets zero gradients)
    busy_s: float = 0.0
    start_s: float | None = None


def _pad(rows: list[list[float]], value: float, dtype: torch.dtype) -> torch.Tensor:
    width = max(len(r) for r in rows)
    out = torch.full((len(rows), width), value, dtype=dtype)
    for i, r in enumerate(rows):
        out[i, : len(r)] = torch.tensor(r, dtype=dtype)
    return out


def token_logprobs(
    model, items: list[TrainItem], share_prompts: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-probs of each output token given its prefix ([batch, max_out]) and the mask.

    The sequences go through the model packed end to end in one row
    (:func:`runtime.packing.pack`): no padding, where padding a micro-batch to its longest
    sequence had the trainer compute ~2x the real tokens on the long-tailed answers
    (docs/live-throughput.md); with ``share_prompts`` a group's samples share one copy of
    their prompt."""
    return packed_logprobs(
        model, [it.prompt_ids for it in items], [it.output_ids for it in items], share_prompts
    )


def _dummy_item(length: int) -> TrainItem:
    half = max(1, length // 2)
    return TrainItem(0, (1,) * half, (1,) * half, (0.0,) * half, 0.0, 0.0, 0)


class Trainer:
    """One trainer process's model, optimizer and weight sender. No work in ``__init__``."""

    def __init__(self, config: TrainerConfig) -> None:
        self.config = config
        self.model: Any = None
        self.forward: Any = None  # the model, or its torch.compile wrapper (same weights)
        self.ref_model: Any = None
        self.optimizer: torch.optim.Optimizer | None = None
        self.rank = 0  # among the trainer's processes (runtime.sharded_trainer: 0 .. M - 1)
        self.version = 0  # optimizer steps taken
        self.sender = WeightSender()
        self._acc = _StepAccumulator()
        self.before_micro_batch: Callable[[], None] | None = None  # runtime.core_loan

    def initialise(self) -> None:
        from transformers import AutoModelForCausalLM

        quiet_progress_bars()  # no "Loading weights" bar on the run's console
        torch.manual_seed(self.config.seed)
        torch.set_num_threads(self.config.num_threads or len(os.sched_getaffinity(0)))
        self.model = AutoModelForCausalLM.from_pretrained(
            self.config.model_dir, dtype=torch.float32
        )
        self.model.to(self.config.device).train()
        self.forward = self.model
        if self.config.compile:  # inductor; dynamic: one graph for every packed length
            self.forward = torch.compile(self.model, dynamic=True)
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=self.config.learning_rate)
        if self.config.kl_coef > 0:
            ref = AutoModelForCausalLM.from_pretrained(self.config.model_dir)
            self.ref_model = ref.to(self.config.device).eval()

    def warm_up(self, num_samples: int = 8, num_tokens: int = 64) -> None:
        """Forward and backward passes over dummy micro-batches, their gradient dropped: a
        fresh process's first passes are slower (the allocator, first calls of kernels),
        and a compiled trainer compiles here, before the run's clock starts (packed rows
        of two lengths, so that the dynamic graph is the one the run reuses). Weights,
        optimizer state, the step being accumulated and the RNG stay as they were. Every
        rank of a sharded trainer calls it (its passes are collectives)."""
        device = next(self.model.parameters()).device
        with torch.random.fork_rng(devices=[]):
            if self.config.compile:
                for length in (num_tokens // 4, num_tokens // 2):
                    items = [_dummy_item(length) for _ in range(num_samples)]
                    logp, _ = token_logprobs(self.forward, items, self.config.share_prompts)
                    logp.sum().backward()
            else:
                ids = torch.ones(num_samples, num_tokens, dtype=torch.long, device=device)
                self.model(input_ids=ids).logits.float().log_softmax(-1).mean().backward()
        self.optimizer.zero_grad(set_to_none=True)

    # -- forward / backward ----------------------------------------------------------

    def train(self, items: list[TrainItem], now_s: float) -> float:
        """Forward and backward over ``items``, accumulated into the current step: in
        micro-batches of ``micro_batch_samples`` sequences (sorted by length, each packed
        into one row: :func:`token_logprobs`)."""
        if not items:
            return 0.0
        start = time.perf_counter()
        acc = self._acc
        acc.start_s = now_s if acc.start_s is None else acc.start_s
        loss = 0.0
        for batch in self.micro_batches(self.trainable(items)):
            if self.before_micro_batch is not None:
                self.before_micro_batch()
            loss += self._micro_batch(batch)
        acc.busy_s += time.perf_counter() - start
        return loss

    def trainable(self, items: list[TrainItem]) -> list[TrainItem]:
        """``items`` less those whose advantage is exactly 0 (every sample of the group got
        the same reward): without a reference KL their loss is 0 whatever the weights, so
        leaving them out of the forward and backward leaves the gradient as it was. They
        still count in the step's samples, tokens, reward and lag (on rank 0 only, as the
        ranks' shares are summed); the importance-weight statistics cover the rest."""
        if not self.config.skip_zero_advantage or self.config.kl_coef > 0:
            return items
        flat = [it for it in items if it.advantage == 0.0]
        if flat and self.rank == 0:
            acc = self._acc
            acc.num_skipped += len(flat)
            acc.num_samples += len(flat)
            acc.num_tokens += sum(len(it.prompt_ids) + len(it.output_ids) for it in flat)
            acc.rewards += [it.reward for it in flat]
            acc.lags += [self.version - it.version_start for it in flat]
        return [it for it in items if it.advantage != 0.0]

    def micro_batches(self, items: list[TrainItem]) -> list[list[TrainItem]]:
        """``items`` by length (with ``share_prompts``: by prompt, so that a group's samples
        fall together), cut into micro-batches of ``micro_batch_samples``."""
        if self.config.share_prompts:
            ordered = sorted(items, key=lambda it: (len(it.prompt_ids), it.prompt_ids))
        else:
            ordered = sorted(items, key=lambda it: len(it.prompt_ids) + len(it.output_ids))
        size = self.config.micro_batch_samples
        return [ordered[i : i + size] for i in range(0, len(ordered), size)]

    def _micro_batch(self, items: list[TrainItem]) -> float:
        logp, mask = token_logprobs(self.forward, items, self.config.share_prompts)
        out = rl_loss(
            logp,
            _pad([list(it.logprobs_old) for it in items], 0.0, torch.float32).to(logp.device),
            torch.tensor([it.advantage for it in items], device=logp.device),
            mask,
            self.config.batch_size,
            self.config.algorithm,
            self.config.clip_epsilon,
            self._ref_logprobs(items),
            self.config.kl_coef,
        )
        out.loss.backward()
        self._acc.passes += 1
        self._note(items, mask, out.loss, out.weights)
        self._acc.kl_sum += out.kl * len(items)
        return float(out.loss.detach())

    def _ref_logprobs(self, items: list[TrainItem]) -> torch.Tensor | None:
        if self.ref_model is None:
            return None
        with torch.no_grad():
            return token_logprobs(self.ref_model, items, self.config.share_prompts)[0]

    def _note(self, items: list[TrainItem], mask, loss, weights) -> None:
        acc = self._acc
        acc.num_samples += len(items)
        acc.num_tokens += int(mask.sum()) + sum(len(it.prompt_ids) for it in items)
        acc.loss += float(loss.detach())
        acc.rewards += [it.reward for it in items]
        acc.lags += [self.version - it.version_start for it in items]
        acc.weights.append(weights)

    def apply_gradient(self, step: int) -> tuple[_StepAccumulator, float]:
        """Clip, apply and clear the accumulated gradient (the version becomes ``step + 1``);
        the step's accumulator and its busy seconds."""
        start = time.perf_counter()
        if not self._acc.passes:  # every sample skipped: the zero gradient they would give
            for p in self.model.parameters():
                if p.requires_grad and p.grad is None:
                    p.grad = torch.zeros_like(p)
        norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.config.max_grad_norm)
        norm = float(norm.full_tensor() if hasattr(norm, "full_tensor") else norm)  # FSDP2
        if not math.isfinite(norm):  # NaN weights would be pushed, served and checkpointed
            raise NonFiniteGradient(
                f"trainer step {step}: the gradient norm is {norm}; the step was not applied, "
                f"the weights stay those of version {self.version} and the last checkpoint is "
                "intact (a lower algorithm.learning_rate may help)"
            )
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.version = step + 1
        acc, self._acc = self._acc, _StepAccumulator()
        return acc, acc.busy_s + time.perf_counter() - start

    def step(self, step: int, now_s: float) -> StepStats:
        """Apply the accumulated gradient; the step's statistics."""
        acc, busy_s = self.apply_gradient(step)
        weights = torch.cat(acc.weights) if acc.weights else torch.ones(0)
        return StepStats(
            step=step,
            version=self.version,
            num_samples=acc.num_samples,
            num_tokens=acc.num_tokens,
            start_s=acc.start_s if acc.start_s is not None else now_s,
            end_s=now_s + busy_s,
            loss=acc.loss,
            mean_reward=sum(acc.rewards) / len(acc.rewards) if acc.rewards else None,
            mean_lag=sum(acc.lags) / len(acc.lags) if acc.lags else None,
            ess=effective_sample_size(weights),
            busy_s=busy_s,
            kl=self._mean_kl(acc),
            clip_fraction=clip_fraction(weights, self.config.algorithm, self.config.clip_epsilon),
            num_skipped=acc.num_skipped,
        )

    def _mean_kl(self, acc: _StepAccumulator) -> float | None:
        """The step's reference KL per sample; None without a reference model."""
        if self.ref_model is None or not acc.num_samples:
            return None
        return acc.kl_sum / acc.num_samples

    # -- weights -----------------------------------------------------------------------

    def named_weights(self) -> list[tuple[str, torch.Tensor]]:
        """Every tensor in checkpoint layout (Hugging Face names), in broadcast order."""
        return [(n, t.detach()) for n, t in self.model.state_dict().items()]

    def weights_meta(self) -> list[dict]:
        return [
            {"name": m.name, "shape": list(m.shape), "dtype": m.dtype}
            for m in params_meta(self.named_weights())
        ]

    # -- checkpoints -------------------------------------------------------------------

    snapshots_checkpoints = True  # checkpoint_state + write_state may run apart (a thread)

    def save_checkpoint(self, path: Path, data: Any) -> None:
        """Weights, optimizer, step and ``data`` (the caller's data position), atomically."""
        write_state(Path(path), self.checkpoint_state(data))

    def checkpoint_state(self, data: Any) -> dict[str, Any]:
        """A copy of what a checkpoint holds, independent of later training steps."""
        return copy.deepcopy({
            "version": self.version,
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "data": data,
        })  # fmt: skip

    def load_checkpoint(self, path: Path) -> Any:
        state = torch.load(Path(path), weights_only=False)
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.version = state["version"]
        return state["data"]


def write_state(path: Path, state: dict[str, Any]) -> None:
    """Write a :meth:`Trainer.checkpoint_state` to ``path`` atomically."""
    buf = io.BytesIO()
    torch.save(state, buf)
    write_atomic(Path(path), buf.getvalue())
