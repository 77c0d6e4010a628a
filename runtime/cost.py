"""A tiny analytic cost model of the embedded model on one CPU core.

Only skewness-aware dispatch uses it live, to compare instance splits; the constants
are rough measurements of the tiny model (about 2,100 tokens/s at 64 sequences).
Replace with a profiled model for anything quantitative.
"""

from __future__ import annotations

from policies.protocols import Device


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

    def train_s(self, device: Device, num_tokens: int) -> float:
        return self.train_per_token_s * num_tokens

    def weight_transfer_s(self, num_bytes: float, gbps: float, latency_s: float) -> float:
        return latency_s + num_bytes * 8 / (gbps * 1e9)
