"""The trained model as the trainer's memory check and a calibrated optimizer step see it.

The roofline cost model has the model's whole shape (``sim.models``). A calibrated cost
model knows only the profiled model's name (``profile.json``'s ``model.name``, or the
spec's where the profile does not record it) and the bytes of the weights it pushes
(``weight_bytes``): its parameters are models.csv's where the table lists that name, else
derived from ``weight_bytes`` at 2 bytes a parameter (the pushed weights are bf16).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from sim.models import model_table
from sim.tables import Hardware

BF16_BYTES_PER_PARAM = 2  # the weights a profile pushes are bf16
# Adam's step reads and writes, a trained parameter: bf16 weight and gradient, fp32 master
# weight and two moments (the roofline's ``optimizer_s`` traffic)
ADAM_BYTES_MOVED_PER_PARAM = 32.0


@dataclass(slots=True, frozen=True)
class TrainedModel:
    """What is trained: its name, parameters, how many models train (2 under PPO: actor
    and critic) and the GPUs it may train on (hardware.csv and the spec's ``sim.hardware``)."""

    name: str
    num_params: float
    num_trained_models: int
    gpu_table: Mapping[str, Hardware]

    @classmethod
    def of_profile(
        cls, name: str, weight_bytes: float, algorithm: str, gpu_table: Mapping[str, Hardware]
    ) -> TrainedModel:
        """A profiled model: models.csv's parameters for ``name``; for a model the table does
        not list (the live runtime's ``tiny``, a model of one's own), ``weight_bytes`` over
        the 2 bytes of a bf16 parameter."""
        known = model_table().get(name)
        num_params = known.num_params if known else weight_bytes / BF16_BYTES_PER_PARAM
        return cls(name, num_params, 2 if algorithm == "ppo" else 1, gpu_table)

    def gpu(self, name: str | None) -> Hardware | None:
        """The table's GPU ``name`` in any case (a profile may write ``h800``); None if the
        table does not list it (a CPU)."""
        if name is None:
            return None
        if name in self.gpu_table:
            return self.gpu_table[name]
        by_name = {key.lower(): hw for key, hw in self.gpu_table.items()}
        return by_name.get(name.lower())

    def optimizer_state_s(self, hardware: str | None, num_gpus: int | None) -> float:
        """The least time an Adam step of this model takes on ``num_gpus`` GPUs of
        ``hardware`` over which its state is fully sharded: its traffic
        (``ADAM_BYTES_MOVED_PER_PARAM`` a parameter) at the GPUs' peak HBM bandwidth. 0
        where the hardware is not a GPU the table lists (a CPU) or the GPUs are unknown."""
        hw = self.gpu(hardware)
        if hw is None or not num_gpus:
            return 0.0
        moved = ADAM_BYTES_MOVED_PER_PARAM * self.num_params * self.num_trained_models
        return moved / (num_gpus * hw.hbm_bytes_per_s)
