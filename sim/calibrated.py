"""The calibrated cost model (``policies.calibrated``) as the simulator uses it: in ticks.

The operators' math lives in :class:`policies.calibrated.CalibratedCosts`, shared with
live dispatch; this adapter adds the decode law in integer ticks that the engine
fast-forwards, and prices a decode step through that law (so the sim's dispatch sees the
very step times its engines take, rounded to ticks).
"""

from __future__ import annotations

from policies.calibrated import CalibratedCosts
from policies.protocols import Device
from sim.ticks import DecodeLaw, to_seconds, to_ticks


class CalibratedCostModel(CalibratedCosts):
    """A :class:`CalibratedCosts` with the decode law in ticks (``sim.costs.SimCostModel``)."""

    __slots__ = ()

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
