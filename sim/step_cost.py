"""What an optimizer step costs the trainer beyond its forward and backward passes: the
exposed part of the gradient all-reduce, then the optimizer step itself.

One place prices both, for the simulated trainer (``sim.simulator`` runs them as the
step's optimizer job, ``sim.trainer``) and for the stage model that allocation and the
advise estimate plan with (``policies.stage_model.StageModel.step_cost``), so that a split
is chosen by the training time the simulated trainer pays.

Modelling assumptions (``sim.comm``, ``sim.trainer``): the all-reduce runs over every
trainer GPU (idle ones hold gradients too) and hides behind one GPU's backward pass of the
step's last micro-batch, taken as its mean one (``micro_batch_per_gpu`` samples of the
step's mean tokens per sample); the optimizer step's state is sharded over every trainer
GPU. A trainer whose hardware the tables do not list (a CPU) has no fabric: no all-reduce.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from policies.protocols import Device
from policies.spec import RunSpec
from sim.comm import Fabric
from sim.costs import SimCostModel
from sim.tables import Hardware, hardware_of


@dataclass(frozen=True, slots=True)
class StepCost:
    """An optimizer step's time beyond forward/backward, in seconds (satisfies
    ``policies.allocation.OptimizerStepCost``)."""

    cost: SimCostModel
    gpu_table: Mapping[str, Hardware]  # hardware.csv and the spec's sim.hardware
    intra_dc_gbps: float  # the node NIC a trainer spanning machines crosses
    micro_batch_per_gpu: int  # samples per trainer GPU per micro-batch

    @classmethod
    def of(cls, spec: RunSpec, cost: SimCostModel) -> StepCost:
        return cls(
            cost,
            hardware_of(spec),
            spec.cluster.network.intra_dc_gbps,
            spec.algorithm.micro_batch_per_gpu,
        )

    def grad_sync_s(self, device: Device, num_samples: int, num_tokens: float) -> float:
        """The exposed gradient all-reduce over ``device`` (every trainer GPU) of a step of
        ``num_samples`` samples and ``num_tokens`` tokens."""
        hw = self.gpu_table.get(device.hardware)
        fabric = None if hw is None else Fabric.of(hw, self.intra_dc_gbps)
        per_gpu = self.micro_batch_per_gpu
        tokens = num_tokens * min(per_gpu, num_samples) / max(1, num_samples)
        return self.cost.grad_sync_s(device, tokens, fabric)

    def optimizer_s(self, device: Device) -> float:
        """The optimizer step on ``device`` (every trainer GPU)."""
        return self.cost.optimizer_s(device)

    def step_s(self, device: Device, num_samples: int, num_tokens: float) -> float:
        """Both: what a step adds to its forward and backward jobs."""
        return self.grad_sync_s(device, num_samples, num_tokens) + self.optimizer_s(device)
