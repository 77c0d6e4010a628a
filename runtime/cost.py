"""The cost model live dispatch prices with: the run's calibrated model, else tiny constants.

Only skewness-aware dispatch uses a cost model live, to compare instance splits. With
``live.cost_model`` set (a ``tandem calibrate`` output, the model the simulator uses as
``sim.cost_model: profiled:PATH``) it prices with that calibrated model
(:class:`policies.calibrated.CalibratedCosts`). Without one it falls back to
:class:`TinyCostModel`: rough constants of the embedded tiny model on one CPU core
(about 2,100 tokens/s at 64 sequences), good enough to rank splits, not for numbers.
"""

from __future__ import annotations

from policies.calibrated import CalibratedCosts, ProfileTarget, cost_model_path
from policies.protocols import CostModel, Device
from policies.spec import RunSpec


def live_cost_model(spec: RunSpec) -> CostModel:
    """``live.cost_model``'s calibrated model, or the documented fallback (tiny constants)."""
    if spec.live.cost_model is None:
        return TinyCostModel()
    path = cost_model_path(spec.live.cost_model, "live.cost_model")
    return CalibratedCosts.load(path, ProfileTarget.of(spec, "live.cost_model"))


class TinyCostModel:
    def __init__(
        self,
        step_base_s: float = 0.004,
        step_per_seq_s: float = 0.0004,
        step_per_context_token_s: float = 1e-7,
        prefill_per_token_s: float = 2e-5,
        train_per_token_s: float = 1e-4,
    ) -> None:
        self.step_base_s = step_base_s
        self.step_per_seq_s = step_per_seq_s
        self.step_per_context_token_s = step_per_context_token_s
        self.prefill_per_token_s = prefill_per_token_s
        self.train_per_token_s = train_per_token_s

    def decode_step_s(self, device: Device, batch_size: int, context_tokens: int) -> float:
        return (
            self.step_base_s
            + self.step_per_seq_s * batch_size
            + self.step_per_context_token_s * context_tokens
        )

    def prefill_s(self, device: Device, num_tokens: int) -> float:
        return self.prefill_per_token_s * num_tokens

    def train_s(self, device: Device, num_tokens: int, num_micro_batches: int = 1) -> float:
        return self.train_per_token_s * num_tokens

    def weight_transfer_s(self, num_bytes: float, gbps: float, latency_s: float) -> float:
        return latency_s + num_bytes * 8 / (gbps * 1e9)
