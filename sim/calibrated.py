"""The calibrated cost model (``policies.calibrated``) as the simulator uses it: in ticks.

The operators' math lives in :class:`policies.calibrated.CalibratedCosts`, shared with
live dispatch; this adapter adds the decode law in integer ticks that the engine
fast-forwards, and prices a decode step through that law (so the sim's dispatch sees the
very step times its engines take, rounded to ticks). Built for a spec, it knows the
trained model (``sim.trained_model``): the trainer's memory is checked as the roofline
model's is (``sim.cluster``), and the profiled optimizer step is split from first
principles into the work on its sharded state, at most its traffic at peak HBM bandwidth
(which spreads over the trainer's GPUs), and a per-step overhead (which does not). It
also prices the one thing a profile cannot hold for another trainer size: the gradient
all-reduce over the run's trainer GPUs (:meth:`CalibratedCostModel.grad_sync_s`,
``sim.comm``).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from policies.calibrated import CalibratedCosts, ProfileTarget
from policies.protocols import Device
from policies.spec import RunSpec
from sim.comm import Fabric, exposed_grad_allreduce_s
from sim.tables import hardware_of
from sim.ticks import DecodeLaw, to_seconds, to_ticks
from sim.trained_model import TrainedModel


@dataclass(slots=True)
class CalibratedCostModel(CalibratedCosts):
    """A :class:`CalibratedCosts` with the decode law in ticks (``sim.costs.SimCostModel``)."""

    trained: TrainedModel | None = None  # None: loaded without a spec (no memory check)

    @classmethod
    def for_spec(
        cls, path: Path, spec: RunSpec, key: str = "sim.cost_model"
    ) -> CalibratedCostModel:
        """The cost model at ``path`` checked against ``spec`` (``CalibratedCosts.load``),
        knowing the model it trains and the part of its optimizer step that is sharded."""
        cost = cls.load(path, ProfileTarget.of(spec, key))
        name = cost.setup.model or spec.model.name  # the profile's, checked to be the spec's
        trained = TrainedModel.of_profile(
            name, cost.weight_bytes, spec.algorithm.name, hardware_of(spec)
        )
        setup = cost.setup
        state_s = trained.optimizer_state_s(setup.trainer_hardware, setup.trainer_num_gpus)
        return replace(cost, trained=trained, optimizer_state_s=state_s)

    def decode_law(self, device: Device, n: int) -> DecodeLaw:
        return DecodeLaw(
            n=n,
            p0=to_ticks(self.decode_fixed_s(n)),
            p1=to_ticks(self.decode_per_context_token_s()),
            q0=0,
            q1=0,
        )

    def contended_decode_law(self, device: Device, n: int) -> DecodeLaw | None:
        """Decode while the trainer computes: the idle law times the profiled
        ``decode_slowdown`` at batch ``n`` (on one host the two stages share caches and
        memory bandwidth; never faster than idle). None if not profiled."""
        factor = self.decode_slowdown(n)
        if factor is None:
            return None
        law = self.decode_law(device, n)
        return DecodeLaw(n=n, p0=round(law.p0 * factor), p1=round(law.p1 * factor), q0=0, q1=0)

    def decode_step_s(self, device: Device, batch_size: int, context_tokens: int) -> float:
        return to_seconds(self.decode_law(device, max(1, batch_size)).step(context_tokens))

    def grad_sync_s(self, device: Device, backward_tokens: float, fabric: Fabric | None) -> float:
        """The gradient all-reduce over ``device``'s GPUs that the profile does not contain:
        its exposed part (``sim.comm.exposed_grad_allreduce_s``: the push's bytes, as
        gradients take their weights' dtype, behind one GPU's measured backward of
        ``backward_tokens``) less that of the profiled trainer's GPUs, which the measured
        times already include. 0 without a fabric (a trainer hardware.csv does not list,
        such as ``cpu``)."""
        if fabric is None:
            return 0.0
        profiled = self.setup.trainer_num_gpus or 1
        tokens = backward_tokens * self.training_share(Device(device.hardware, 1))
        backward = self.fits["backward"](tokens=tokens)
        run, measured = (
            exposed_grad_allreduce_s(self.weight_bytes, n, backward, fabric)
            for n in (device.num_gpus, profiled)
        )
        return max(0.0, run - measured)
