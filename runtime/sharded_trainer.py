"""The trainer sharded over M processes with FSDP2 (``torch.distributed.fsdp.fully_shard``).

:class:`ShardedTrainer` has :class:`runtime.trainer.Trainer`'s methods and gives the same
step: every rank is handed the same items, sorts them as ``Trainer`` does, cuts the same
micro-batches and trains every M-th of them (rank ``r``: micro-batches ``r, r + M, …``).
Gradients are summed over ranks, not averaged (``rl_loss`` already weights every token
``1 / batch_size`` of the whole step), so the step's gradient is the single trainer's up
to float summation order. FSDP2 gathers and reduces parameters inside every forward and
backward, so all ranks run the same number of them: a rank short of micro-batches runs a
zero-weight pass on a dummy item.

Collectives (every rank must call them, in the same order): ``initialise``, ``train``,
``step``, ``named_weights``, ``save_checkpoint``, ``load_checkpoint``. ``named_weights``
gathers the full tensors onto rank 0's CPU (the others get an empty list), so only rank 0
broadcasts weights to the servers; ``weights_meta`` is local and the same on every rank.
Checkpoints are directories (:mod:`runtime.sharded_checkpoint`).

The caller builds the default process group first (:func:`init_trainer_group`): gloo on
the CPU, NCCL for ``device="cuda"`` (one GPU per rank: ``cuda:<rank % visible GPUs>``).
The frozen reference model (``kl_coef > 0``) is not sharded: every rank holds a copy.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, fields
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from policies.records import StepStats
from runtime.loss import clipped_mask, ess_from_sums
from runtime.sharded_checkpoint import ShardedCheckpointInfo, load_dcp, save_dcp
from runtime.trainer import Trainer, TrainerConfig, TrainItem, _StepAccumulator, token_logprobs
from runtime.weight_group import master_store
from runtime.weight_sync import params_meta

GROUP_TIMEOUT_S = 300.0
LOOPBACK_HOSTS = (
    "127.0.0.1",
    "localhost",
    "::1",
)  # a collective that waits longer than this on a rank fails


def init_trainer_group(
    host: str, port: int, rank: int, world_size: int, backend: str = "gloo",
    timeout_s: float = GROUP_TIMEOUT_S,
) -> None:  # fmt: skip
    """Create the default process group of the trainer's ranks; rank 0 hosts its store on
    ``host:port`` (listening on ``host`` only). Blocks until every rank has joined."""
    if backend not in ("gloo", "nccl"):
        raise ValueError(f"backend must be 'gloo' or 'nccl', not {backend!r}")
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is not in 0 .. {world_size - 1}")
    timeout = timedelta(seconds=timeout_s)
    if backend == "gloo" and host in LOOPBACK_HOSTS:
        # gloo picks its data sockets' interface from the host name, not from the store:
        # ranks that meet on the loopback address talk over it too
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    if rank == 0:
        store = master_store(host, port, world_size, timeout)
    else:
        store = dist.TCPStore(host, port, world_size, is_master=False, timeout=timeout)
    dist.init_process_group(backend, store=store, rank=rank, world_size=world_size, timeout=timeout)


@dataclass(slots=True, frozen=True)
class StepShare:
    """One rank's part of a step's statistics: sums, so that ranks add up."""

    num_samples: int
    num_tokens: int
    loss: float
    reward_sum: float
    lag_sum: float
    kl_sum: float
    num_weights: int  # tokens with an importance weight
    weight_sum: float
    weight_sq_sum: float
    num_clipped: int
    num_skipped: int
    busy_s: float  # the step's is the slowest rank's

    @classmethod
    def of(cls, acc: _StepAccumulator, busy_s: float, algorithm: str, eps: float) -> StepShare:
        w = torch.cat(acc.weights).double() if acc.weights else torch.ones(0, dtype=torch.double)
        return cls(
            acc.num_samples, acc.num_tokens, acc.loss, sum(acc.rewards), sum(acc.lags),
            acc.kl_sum, w.numel(), float(w.sum()), float((w * w).sum()),
            int(clipped_mask(w, algorithm, eps).sum()), acc.num_skipped, busy_s,
        )  # fmt: skip

    @classmethod
    def total(cls, shares: list[StepShare]) -> StepShare:
        sums = {f.name: sum(getattr(s, f.name) for s in shares) for f in fields(cls)}
        return cls(**{**sums, "busy_s": max(s.busy_s for s in shares)})


def _decoder_blocks(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The transformer blocks: ``model.model.layers``, else the largest ``ModuleList``."""
    inner = getattr(model, "model", None)
    layers = getattr(inner, "layers", None)
    if isinstance(layers, torch.nn.ModuleList) and len(layers):
        return list(layers)
    lists = [m for m in model.modules() if isinstance(m, torch.nn.ModuleList)]
    return list(max(lists, key=len)) if lists else []


class ShardedTrainer(Trainer):
    """Rank ``rank`` of a trainer sharded over ``world_size`` processes. No work in
    ``__init__``; the default process group must exist before :meth:`initialise`."""

    def __init__(
        self, config: TrainerConfig, rank: int, world_size: int, device: str = "cpu"
    ) -> None:
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} is not in 0 .. {world_size - 1}")
        if device not in ("cpu", "cuda"):
            raise ValueError(f"device must be 'cpu' or 'cuda', not {device!r}")
        if config.compile:
            raise ValueError("live.compile_trainer: the sharded trainer does not compile")
        super().__init__(config)
        self.rank = rank
        self.world_size = world_size
        self.device_type = device
        self._names: list[str] = []  # checkpoint layout, in Trainer.named_weights order

    def _device(self) -> torch.device:
        if self.device_type == "cpu":
            return torch.device("cpu")
        if not torch.cuda.is_available():
            raise ValueError("device 'cuda': no CUDA device is visible to this process")
        return torch.device("cuda", self.rank % torch.cuda.device_count())

    def initialise(self) -> None:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import FSDPModule, fully_shard

        if dist.get_world_size() != self.world_size or dist.get_rank() != self.rank:
            raise ValueError(
                f"the default process group is rank {dist.get_rank()} of "
                f"{dist.get_world_size()}, not {self.rank} of {self.world_size}"
            )
        device = self._device()
        if device.type == "cuda":
            torch.cuda.set_device(device)
        super().initialise()  # seed, threads, the full model, AdamW (replaced below)
        self._names = list(self.model.state_dict())
        self.model.to(device)
        mesh = init_device_mesh(device.type, (self.world_size,))
        for block in _decoder_blocks(self.model):
            fully_shard(block, mesh=mesh)
        fully_shard(self.model, mesh=mesh)
        for module in self.model.modules():
            if isinstance(module, FSDPModule):
                module.set_gradient_divide_factor(1.0)  # sum over ranks, do not average
                module.set_force_sum_reduction_for_comms(True)  # gloo has no PREMUL_SUM
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=self.config.learning_rate)
        if self.ref_model is not None:
            self.ref_model.to(device)

    # -- forward / backward ----------------------------------------------------------

    def train(self, items: list[TrainItem], now_s: float) -> float:
        """Collective: this rank's micro-batches of ``items`` (the same list on every
        rank) into the current step; the loss of all ranks."""
        if not items:
            return 0.0
        start = time.perf_counter()
        acc = self._acc
        acc.start_s = now_s if acc.start_s is None else acc.start_s
        batches = self.micro_batches(self.trainable(items))
        mine = batches[self.rank :: self.world_size]
        num_passes = -(-len(batches) // self.world_size)
        loss = sum(self._micro_batch(b) for b in mine)
        for _ in range(num_passes - len(mine)):
            self._idle_pass(batches[0][0])
        acc.busy_s += time.perf_counter() - start
        return self._sum_over_ranks(loss)

    def _idle_pass(self, item: TrainItem) -> None:
        """A forward and backward that adds nothing, so this rank joins the collectives
        of a pass the others run."""
        logp, _ = token_logprobs(self.model, [item], self.config.share_prompts)
        (logp.sum() * 0.0).backward()
        self._acc.passes += 1

    def _sum_over_ranks(self, value: float) -> float:
        t = torch.tensor([value], dtype=torch.float64, device=self._device())
        dist.all_reduce(t)
        return float(t[0])

    def step(self, step: int, now_s: float) -> StepStats:
        """Collective: clip the summed gradient by its global norm, apply it; the step's
        statistics over all ranks (the same on every rank)."""
        acc, busy_s = self.apply_gradient(step)
        share = StepShare.of(acc, busy_s, self.config.algorithm, self.config.clip_epsilon)
        shares: list[Any] = [None] * self.world_size
        dist.all_gather_object(shares, share)
        return self._stats(step, now_s, acc.start_s, StepShare.total(shares))

    def _stats(self, step: int, now_s: float, start_s: float | None, t: StepShare) -> StepStats:
        per_sample = (lambda x: x / t.num_samples) if t.num_samples else (lambda x: None)
        return StepStats(
            step=step,
            version=self.version,
            num_samples=t.num_samples,
            num_tokens=t.num_tokens,
            start_s=start_s if start_s is not None else now_s,
            end_s=now_s + t.busy_s,
            loss=t.loss,
            mean_reward=per_sample(t.reward_sum),
            mean_lag=per_sample(t.lag_sum),
            ess=ess_from_sums(t.num_weights, t.weight_sum, t.weight_sq_sum),
            busy_s=t.busy_s,
            kl=per_sample(t.kl_sum) if self.ref_model is not None else None,
            clip_fraction=t.num_clipped / t.num_weights if t.num_weights else None,
            num_skipped=t.num_skipped,
        )

    # -- weights -----------------------------------------------------------------------

    def named_weights(self) -> list[tuple[str, torch.Tensor]]:
        """Collective: every full tensor in checkpoint layout, in broadcast order, on rank
        0's CPU; an empty list on the other ranks."""
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            get_model_state_dict,
        )

        options = StateDictOptions(full_state_dict=True, cpu_offload=True)
        full = get_model_state_dict(self.model, options=options)
        if self.rank != 0:
            return []
        return [(name, full[name]) for name in self._names]

    def weights_meta(self) -> list[dict]:
        """Names, full shapes and dtypes (local: no collective; the same on every rank)."""
        local = self.model.state_dict()  # sharded tensors, with their full shapes
        return [
            {"name": m.name, "shape": list(m.shape), "dtype": m.dtype}
            for m in params_meta([(n, local[n]) for n in self._names])
        ]

    # -- checkpoints -------------------------------------------------------------------

    def _sharded_state(self) -> dict[str, Any]:
        from torch.distributed.checkpoint.state_dict import get_state_dict

        model, optimizer = get_state_dict(self.model, self.optimizer)
        return {"model": model, "optimizer": optimizer}

    snapshots_checkpoints = False  # a collective: every rank writes its shards in step

    def save_checkpoint(self, path: Path, data: Any) -> None:
        """Collective: the directory ``path`` with every rank's shards of the weights and
        optimizer, the version and ``data`` (the caller's data position), atomically."""
        info = ShardedCheckpointInfo(self.version, self.world_size, data)
        save_dcp(Path(path), self._sharded_state(), info, self.rank)

    def load_checkpoint(self, path: Path) -> Any:
        """Collective: restore a checkpoint directory (written by any number of ranks);
        the data position saved with it."""
        from torch.distributed.checkpoint.state_dict import set_state_dict

        state = self._sharded_state()
        info = load_dcp(Path(path), state)
        set_state_dict(
            self.model, self.optimizer,
            model_state_dict=state["model"], optim_state_dict=state["optimizer"],
        )  # fmt: skip
        self.version = info.version
        return info.data
