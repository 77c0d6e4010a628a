"""Cost models of the simulator, in integer ticks (1 tick = 1 ps) and in seconds.

Modelling assumptions (roofline, per operator; efficiencies in ``sim.efficiency``):

* A step of the engine over ``rows`` tokens (decoding sequences plus prefill tokens) on
  ``tp`` GPUs runs every linear layer once: ``2 · active params · rows`` FLOPs and one pass
  over the weights it touches (a mixture of experts touches only routed experts). A GEMM
  is compute- or memory-bound by its shape, and measured GEMMs (Vidur's profiles) go
  smoothly from one to the other, slower than either bound near the ridge: compute and
  memory time combine as a smooth maximum ``(t_c^p + t_m^p)^(1/p)`` (``gemm_overlap``).
* Attention is its own kernel: decode reads each sequence's KV (memory-bound), prefill
  computes ``query × key`` pairs (compute-bound); each takes the slower of its compute
  and memory time. Kernels of a step run one after the other, so operators add, plus a
  fixed ``step_overhead_s``. Decode time is affine in context tokens, which is what makes
  exact fast-forward possible.
* Training costs ``k·P`` FLOPs per token at ``train_mfu`` over the GPUs of ``device`` (the
  simulator passes only those the job keeps busy: ``policies.data_parallel``), with
  k = 6 for GRPO (actor forward+backward, +2 with a reference KL) and k = 18 for PPO
  (actor and critic forward+backward, reference, old-log-prob and value forwards);
  the Adam step moves 32 bytes per trained parameter through HBM. The backward pass is
  ``4·P`` FLOPs per token per trained model (twice the forward's ``2·P``; Kaplan et al.
  2020), at the same ``train_mfu``: the window the gradient all-reduce hides behind.
* Communication (``sim.comm``, every figure and its source there): a step on ``tp > 1``
  GPUs adds two ring all-reduces per layer of ``rows × hidden × 2`` bytes over NVLink (the
  node NIC, ``cluster.network.intra_dc_gbps``, once ``tp`` spans machines), plus NCCL's
  latency; a term in rows only, so decode stays affine in context. The gradient
  all-reduce (bf16 gradients of the trained parameters over every trainer GPU, once per
  optimizer step, bucketed behind the last micro-batch's backward) is
  :meth:`RooflineCostModel.grad_sync_s`; the simulator's trainer runs its exposed part
  before the optimizer step.
* Weight transfer: bf16 bytes over the link bandwidth plus latency.
* KV capacity, per rank as vLLM sizes it: ``gpu_memory_utilization`` of a GPU's HBM minus
  its ``1/tp`` of the weights, over the KV bytes a token takes on that rank (vLLM's
  ``get_num_kv_heads``: ``max(1, num_kv_heads // tp)`` heads, replicated when ``tp``
  exceeds the KV heads; the whole latent on every rank under latent attention). An
  instance holds that many tokens, not ``tp`` times it. Decode and prefill read KV per
  rank the same way; attention FLOPs split over ``tp`` (query heads shard evenly).

Known biases: communication at the links' full rate with NCCL's smallest latency (a lower
bound), no expert all-to-all, logits gather or embedding all-reduce under tensor
parallelism, no attention-kernel detail beyond its roofline, perfectly token-balanced data
parallelism over the busy GPUs in training.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Protocol

import numpy as np
import pandas as pd

from policies.cluster import NetworkSection
from policies.protocols import Device
from policies.sim_section import EfficiencySection
from policies.spec import RunSpec
from sim.comm import Fabric, exposed_grad_allreduce_s, tensor_parallel_s
from sim.decode_table import SETUP_COLUMNS, check_decode_table_setup, read_decode_table
from sim.models import Model, model_for
from sim.tables import Hardware, hardware_of, hardware_table
from sim.ticks import DecodeLaw, StepWork, to_seconds, to_ticks


class ModelDoesNotFit(ValueError):
    """The weights leave no room for a KV cache at this tensor-parallel size."""


class SimCostModel(Protocol):
    """What the simulator needs of a cost model, beyond ``policies.protocols.CostModel``."""

    weight_bytes: float

    def decode_law(self, device: Device, n: int) -> DecodeLaw: ...
    def contended_decode_law(self, device: Device, n: int) -> DecodeLaw | None: ...
    def mixed_step_s(self, device: Device, work: StepWork) -> float: ...
    def decode_step_s(self, device: Device, batch_size: int, context_tokens: int) -> float: ...
    def prefill_s(self, device: Device, num_tokens: int) -> float: ...
    def train_s(self, device: Device, num_tokens: int, num_micro_batches: int = 1) -> float: ...
    def grad_sync_s(
        self, device: Device, backward_tokens: float, fabric: Fabric | None
    ) -> float: ...
    def contended_train_s(
        self, device: Device, num_tokens: int, num_micro_batches: int = 1
    ) -> float | None: ...
    def optimizer_s(self, device: Device) -> float: ...
    def weight_transfer_s(self, num_bytes: float, gbps: float, latency_s: float) -> float: ...
    def weight_load_s(self, device: Device) -> float: ...
    def kv_capacity_tokens(self, device: Device) -> int: ...
    def context_switch_s(self, num_gpus: int, tp: int, pcie_gb_per_s: float) -> float: ...


def link_transfer_s(num_bytes: float, gbps: float, latency_s: float) -> float:
    """``num_bytes`` over a link of ``gbps`` (gigabits per second) plus its latency."""
    return num_bytes * 8 / (gbps * 1e9) + latency_s


def prefill_work(num_tokens: int) -> StepWork:
    """A step that prefills one prompt of ``num_tokens`` tokens, nothing else."""
    pairs = num_tokens * (num_tokens + 1) // 2
    return StepWork(0, 0, num_tokens, pairs, num_tokens)


class RooflineCostModel:
    def __init__(
        self, model_spec: Model, efficiency: EfficiencySection, algorithm: str, kl: bool = False,
        hardware: Mapping[str, Hardware] | None = None,
        intra_dc_gbps: float = NetworkSection().intra_dc_gbps,
    ) -> None:  # fmt: skip
        self.gpu_table = hardware_table() if hardware is None else hardware  # hardware_of
        self.model = model_spec
        self.eff = efficiency
        self.intra_dc_gbps = intra_dc_gbps  # the node NIC a tp spanning machines crosses
        self.train_flops_per_token = 18.0 if algorithm == "ppo" else 6.0 + (2.0 if kl else 0.0)
        self.train_flops_per_token *= model_spec.num_active_params
        self.num_trained_models = 2 if algorithm == "ppo" else 1
        self.backward_flops_per_token = 4.0 * model_spec.num_active_params * self.num_trained_models
        self.grad_bytes = 2.0 * model_spec.num_params * self.num_trained_models  # bf16
        self.weight_bytes = model_spec.weight_bytes
        self._laws: dict[tuple[str, int, int], DecodeLaw] = {}
        self._fabrics: dict[str, Fabric] = {}

    def hw(self, name: str) -> Hardware:
        """The figures of GPU ``name`` (hardware.csv and the spec's ``sim.hardware``)."""
        if name not in self.gpu_table:
            raise ValueError(f"unknown hardware {name!r}; known: {', '.join(self.gpu_table)}")
        return self.gpu_table[name]

    # -- operators, seconds -----------------------------------------------------------------

    def gemm_s(self, hw: Hardware, tp: int, rows: int) -> float:
        """Every linear layer of one step over ``rows`` tokens."""
        m, e = self.model, self.eff
        compute = 2 * m.num_active_params * rows / (tp * hw.bf16_flops * e.gemm_compute)
        memory = m.weight_bytes_read(rows) / (tp * hw.hbm_bytes_per_s * e.gemm_memory)
        p = e.gemm_overlap
        return (compute**p + memory**p) ** (1 / p)

    def attention_s(self, hw: Hardware, tp: int, pairs: float, kv_tokens: float) -> float:
        """Attention over ``pairs`` (query, key) positions reading ``kv_tokens`` of KV."""
        m, e = self.model, self.eff
        compute = (
            m.attention_flops_per_context_token * pairs / (tp * hw.bf16_flops * e.attention_compute)
        )
        # each rank reads its own KV (replicated heads and latent included) in parallel
        kv_bytes = m.kv_bytes_per_token_all_ranks(tp) * kv_tokens
        memory = kv_bytes / (tp * hw.hbm_bytes_per_s * e.kv_memory)
        return max(compute, memory)

    def tp_comm_s(self, hw: Hardware, tp: int, rows: int) -> float:
        """The tensor-parallel all-reduces of one step over ``rows`` tokens (``sim.comm``)."""
        fabric = self._fabrics.get(hw.name)
        if fabric is None:
            fabric = self._fabrics[hw.name] = Fabric.of(hw, self.intra_dc_gbps)
        return tensor_parallel_s(self.model, rows, tp, fabric)

    # -- exact decode law for the engine --------------------------------------------------

    def decode_law(self, device: Device, n: int) -> DecodeLaw:
        key = (device.hardware, device.num_gpus, n)
        law = self._laws.get(key)
        if law is None:
            law = self._laws[key] = self._make_law(self.hw(device.hardware), device.num_gpus, n)
        return law

    def contended_decode_law(self, device: Device, n: int) -> DecodeLaw | None:
        """None: generation and training run on their own GPUs, nothing shared."""
        return None

    def _make_law(self, hw: Hardware, tp: int, n: int) -> DecodeLaw:
        fixed = self.eff.step_overhead_s + self.gemm_s(hw, tp, n)
        if tp > 1:  # a term in n only: the law stays affine in context
            fixed += self.tp_comm_s(hw, tp, n)
        per_context_token = self.attention_s(hw, tp, 1.0, 1.0)  # each token: one pair, read once
        return DecodeLaw(n=n, p0=to_ticks(fixed), p1=to_ticks(per_context_token), q0=0, q1=0)

    def mixed_step_s(self, device: Device, work: StepWork) -> float:
        """A step with prefill tokens (and decodes): one pass of the GEMMs over all rows."""
        hw, tp = self.hw(device.hardware), device.num_gpus
        rows = work.num_decode + work.num_prefill_tokens
        decode = self.attention_s(hw, tp, work.decode_context_tokens, work.decode_context_tokens)
        prefill = self.attention_s(
            hw, tp, work.prefill_attention_pairs, work.prefill_context_tokens
        )
        step = self.eff.step_overhead_s + self.gemm_s(hw, tp, rows) + decode + prefill
        return step + self.tp_comm_s(hw, tp, rows) if tp > 1 else step

    # -- CostModel protocol (seconds) -----------------------------------------------------

    def decode_step_s(self, device: Device, batch_size: int, context_tokens: int) -> float:
        return to_seconds(self.decode_law(device, max(1, batch_size)).step(context_tokens))

    def prefill_s(self, device: Device, num_tokens: int) -> float:
        return self.mixed_step_s(device, prefill_work(num_tokens))

    def train_s(self, device: Device, num_tokens: int, num_micro_batches: int = 1) -> float:
        """FLOPs at ``train_mfu``: linear in tokens, so the micro-batches do not matter."""
        hw = self.hw(device.hardware)
        return (
            self.train_flops_per_token
            * num_tokens
            / (device.num_gpus * hw.bf16_flops * self.eff.train_mfu)
        )

    def contended_train_s(
        self, device: Device, num_tokens: int, num_micro_batches: int = 1
    ) -> float | None:
        """None: the trainer's GPUs are its own."""
        return None

    def backward_s(self, device: Device, num_tokens: int | float) -> float:
        """The backward pass alone of ``num_tokens`` on ``device`` (its ``4·P`` FLOPs)."""
        hw = self.hw(device.hardware)
        flops = self.backward_flops_per_token * num_tokens
        return flops / (device.num_gpus * hw.bf16_flops * self.eff.train_mfu)

    def grad_sync_s(self, device: Device, backward_tokens: float, fabric: Fabric | None) -> float:
        """What the gradient all-reduce over ``device``'s GPUs adds to an optimizer step: the
        part that does not hide behind one GPU's backward of its last micro-batch of
        ``backward_tokens`` (``sim.comm.exposed_grad_allreduce_s``); 0 without a fabric."""
        if fabric is None:
            return 0.0
        backward = self.backward_s(Device(device.hardware, 1), backward_tokens)
        return exposed_grad_allreduce_s(self.grad_bytes, device.num_gpus, backward, fabric)

    def optimizer_s(self, device: Device) -> float:
        hw = self.hw(device.hardware)
        moved = 32.0 * self.model.num_params * self.num_trained_models
        return moved / (device.num_gpus * hw.hbm_bytes_per_s * self.eff.kv_memory)

    def weight_transfer_s(self, num_bytes: float, gbps: float, latency_s: float) -> float:
        return link_transfer_s(num_bytes, gbps, latency_s)

    def weight_load_s(self, device: Device) -> float:
        """Copy received weights into the engine's parameters (one HBM pass)."""
        bw = self.hw(device.hardware).hbm_bytes_per_s * self.eff.kv_memory
        return self.weight_bytes / device.num_gpus / bw

    # -- capacities and colocated switch ----------------------------------------------------

    def kv_capacity_tokens(self, device: Device) -> int:
        """Tokens one instance's KV cache holds: each rank's free HBM over the KV bytes a
        token takes on that rank (vLLM sizes the cache per worker, every rank holding the
        same blocks), written as totals over the ``tp`` ranks so that an evenly sharded
        model gives the same bits as ``free / kv_bytes_per_token``."""
        tp = device.num_gpus
        self.model.check_tp(tp)
        hw = self.hw(device.hardware)
        free = tp * hw.hbm_bytes * self.eff.gpu_memory_utilization
        free -= self.model.weight_bytes
        if free <= 0:
            raise ModelDoesNotFit(
                f"{self.model.name} does not fit on {tp}× {device.hardware}; raise tp"
            )
        return int(free // self.model.kv_bytes_per_token_all_ranks(tp))

    def context_switch_s(self, num_gpus: int, tp: int, pcie_gb_per_s: float) -> float:
        """Offload one stage's state and onload the other's, per GPU over PCIe (verl-style)."""
        train_state = (16.0 * self.num_trained_models + 2.0) * self.model.num_params / num_gpus
        inference = self.model.weight_bytes / tp
        return (train_state + inference) / (pcie_gb_per_s * 1e9)


class ProfiledCostModel(RooflineCostModel):
    """Decode step time interpolated from a measured table; other operations as roofline.

    The table is a CSV with ``batch_size`` and ``decode_step_ms`` (like StreamRL's
    ``ptl_7b_h800.csv``), read by ``sim.decode_table.read_decode_table``; the step time is
    linear between points and extrapolated linearly beyond the last two. Context length
    is not a column, so it has no effect.
    """

    def __init__(self, frame: pd.DataFrame, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self._bs = frame["batch_size"].to_numpy(float)
        self._ms = frame["decode_step_ms"].to_numpy(float)

    def _step_s(self, n: int) -> float:
        if n > self._bs[-1] and len(self._bs) > 1:
            slope = (self._ms[-1] - self._ms[-2]) / (self._bs[-1] - self._bs[-2])
            return (self._ms[-1] + slope * (n - self._bs[-1])) / 1e3
        return float(np.interp(n, self._bs, self._ms)) / 1e3

    def _make_law(self, hw: Hardware, tp: int, n: int) -> DecodeLaw:
        return DecodeLaw(n=n, p0=to_ticks(self._step_s(n)), p1=0, q0=0, q1=0)

    def mixed_step_s(self, device: Device, work: StepWork) -> float:
        """The table's decode step plus the roofline's extra time for the prefill tokens."""
        roofline = super().mixed_step_s(device, work)
        without_prefill = super().mixed_step_s(
            device, StepWork(work.num_decode, work.decode_context_tokens, 0, 0, 0)
        )
        decode = self._step_s(work.num_decode) if work.num_decode else self.eff.step_overhead_s
        return decode + roofline - without_prefill


def efficiency_of(spec: RunSpec) -> EfficiencySection:
    """``sim.efficiency``, with the GEMM terms of a ``roofline:DIR`` calibration if named."""
    if not spec.sim.cost_model.startswith("roofline:"):
        return spec.sim.efficiency
    from sim.vidur import load_efficiency

    gemm = load_efficiency(Path(spec.sim.cost_model.removeprefix("roofline:")))
    return spec.sim.efficiency.model_copy(update=gemm)


def build_cost_model(spec: RunSpec) -> SimCostModel:
    if spec.sim.cost_model.startswith("roofline"):
        return RooflineCostModel(
            model_for(spec.model), efficiency_of(spec), spec.algorithm.name,
            spec.algorithm.kl_coef > 0, hardware_of(spec), spec.cluster.network.intra_dc_gbps,
        )  # fmt: skip
    path = Path(spec.sim.cost_model.removeprefix("profiled:"))
    if not path.exists():
        raise ValueError(f"sim.cost_model: profile {path} does not exist")
    if path.is_dir() or path.suffix == ".json":
        from policies.calibrated import cost_model_path
        from sim.calibrated import CalibratedCostModel

        return CalibratedCostModel.for_spec(cost_model_path(path, "sim.cost_model"), spec)
    table = read_decode_table(path)
    check_decode_table_setup(table, path, spec)
    return ProfiledCostModel(
        table, model_for(spec.model), spec.sim.efficiency, spec.algorithm.name,
        spec.algorithm.kl_coef > 0, hardware_of(spec), spec.cluster.network.intra_dc_gbps,
    )  # fmt: skip


def describe_cost_model(spec: RunSpec) -> str:
    """One line for a run's summary: calibrated from measurements, or roofline only."""
    kind = spec.sim.cost_model
    path = kind.removeprefix("profiled:")
    if kind.startswith("profiled:") and Path(path).suffix == ".csv":
        return (
            f"decode steps interpolated from the measured table {path} ({_table_check(path)}); "
            "prefill, training and weight sync roofline-only from hardware.csv and the "
            "model's shape"
        )
    if kind.startswith("profiled:"):
        return (
            f"calibrated on a measured profile ({path}): generation as profiled, training "
            "scaled to the trainer's GPUs, cross-datacenter links by bandwidth"
        )
    source = (
        f"GEMM efficiencies calibrated from {kind.removeprefix('roofline:')}"
        if kind.startswith("roofline:")
        else "shipped efficiencies (GEMMs fitted to Vidur's H100 profiles, step overhead to "
        "StreamRL's H800 decode profile)"
    )
    return f"roofline-only from hardware.csv and the model's shape; {source}"


def _table_check(path: str) -> str:
    """How far a decode table was checked against the spec (``sim.decode_table``)."""
    try:
        columns = set(pd.read_csv(path, nrows=0).columns)
    except (OSError, ValueError):
        columns = set()
    named = [c for c in SETUP_COLUMNS if c in columns]
    if not named:
        return "not checked against the spec's model or hardware: the table names neither"
    return f"its {', '.join(named)} checked against the spec's"
