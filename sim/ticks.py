"""Simulated time in integer ticks (1 tick = 1 ps) and the decode law in ticks.

Integer ticks keep the engine's fast-forward exact: a batch's decode steps between two
events are summed in closed form (:meth:`DecodeLaw.span`) and equal the step-by-step sum
bit for bit.
"""

from __future__ import annotations

from dataclasses import dataclass

TICKS_PER_S = 10**12


def to_ticks(seconds: float) -> int:
    return int(round(seconds * TICKS_PER_S))


def to_seconds(ticks: int) -> float:
    return ticks / TICKS_PER_S


def _ap_sum(a: int, b: int, lo: int, hi: int) -> int:
    """Σ_{k=lo}^{hi-1} (a + b·k), exactly."""
    if hi <= lo:
        return 0
    return a * (hi - lo) + b * (hi * (hi - 1) // 2 - lo * (lo - 1) // 2)


@dataclass(slots=True, frozen=True)
class DecodeLaw:
    """Step time ``max(p0 + p1·ctx, q0 + q1·ctx)`` ticks for a fixed batch size ``n``."""

    n: int
    p0: int
    p1: int
    q0: int
    q1: int

    def step(self, ctx: int) -> int:
        return max(self.p0 + self.p1 * ctx, self.q0 + self.q1 * ctx)

    def span(self, ctx0: int, num_steps: int) -> int:
        """Ticks of ``num_steps`` steps starting at context ``ctx0`` (grows by n a step).

        Both terms are arithmetic progressions in the step index, so their max switches
        from one to the other at most once: sum each piece in closed form.
        """
        af, bf = self.p0 + self.p1 * ctx0, self.p1 * self.n
        ag, bg = self.q0 + self.q1 * ctx0, self.q1 * self.n
        da, db = af - ag, bf - bg  # f_k - g_k = da + db·k
        if db > 0:  # g first, f from the first k with da + db·k >= 0
            split = 0 if da >= 0 else min(num_steps, (-da + db - 1) // db)
            return _ap_sum(ag, bg, 0, split) + _ap_sum(af, bf, split, num_steps)
        if db == 0:
            split = num_steps if da >= 0 else 0
        else:  # f first, g from the first k with da + db·k < 0
            split = 0 if da < 0 else min(num_steps, da // (-db) + 1)
        return _ap_sum(af, bf, 0, split) + _ap_sum(ag, bg, split, num_steps)

    def steps_within(self, ctx0: int, ticks: int, limit: int) -> int:
        """Largest k ≤ limit with span(ctx0, k) ≤ ticks."""
        lo, hi = 0, limit
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if self.span(ctx0, mid) <= ticks:
                lo = mid
            else:
                hi = mid - 1
        return lo


@dataclass(slots=True, frozen=True)
class StepWork:
    """What one engine step computes (the cost input of a step that is not decode-only)."""

    num_decode: int  # sequences decoding one token
    decode_context_tokens: int  # KV tokens they attend to
    num_prefill_tokens: int  # prefill (or recompute) tokens, in chunks
    prefill_attention_pairs: int  # Σ over prefill tokens of the positions each attends to
    prefill_context_tokens: int  # KV tokens the prefill chunks read
