"""What prefilling an instance's prompts costs, priced as the engine prices its steps.

One place prices it, for the stage model that allocation plans with
(``policies.stage_model.StageModel.prefill``), with the cost model's mixed step
(``SimCostModel.mixed_step_s``), the function the simulated engine gives every step with
prefill tokens (``sim.engine``).

Modelling assumptions: the prompts arrive together and the engine prefills them in steps
of ``max_num_batched_tokens`` tokens (chunked prefill; without it, whole prompts up to the
same budget take about as many steps); a chunk of whole prompts of ``P`` tokens holds
``(P + 1) / 2`` attention pairs a token and reads its own tokens' KV. The decodes those
steps carry are left out: the stage model prices every output token as a decode step
already. Known bias: prompts shared by a group's siblings (prefix caching) are counted
once per request.
"""

from __future__ import annotations

from dataclasses import dataclass

from policies.protocols import Device
from sim.costs import SimCostModel
from sim.ticks import StepWork


@dataclass(frozen=True, slots=True)
class ChunkedPrefill:
    """Prefill time of an instance's prompts, in seconds (satisfies
    ``policies.allocation.PrefillCost``)."""

    cost: SimCostModel

    def prefill_s(
        self, device: Device, num_prompts: int, prompt_tokens: float, max_batched_tokens: int
    ) -> float:
        tokens = int(num_prompts * prompt_tokens)
        num_full, rest = divmod(tokens, max_batched_tokens)
        full_s = num_full * self._chunk_s(device, max_batched_tokens, prompt_tokens)
        return full_s + self._chunk_s(device, rest, prompt_tokens)

    def _chunk_s(self, device: Device, num_tokens: int, prompt_tokens: float) -> float:
        """One step prefilling ``num_tokens`` tokens of prompts of ``prompt_tokens``."""
        if num_tokens <= 0:
            return 0.0
        pairs = int(num_tokens * (prompt_tokens + 1) / 2)
        return self.cost.mixed_step_s(device, StepWork(0, 0, num_tokens, pairs, num_tokens))
