"""Whether a cost model's decode step keeps ``StageModel.generation_floor_s`` a lower bound.

The floor prices the batch's tokens at the per-token cost of a full batch (every one of the
instance's ``max_num_seqs`` slots busy) at one mean context, and the longest request as if
decoded alone at its mean context. Those are lower bounds on what an instance's steps cost
only if, for sequences of one context, a decode step

* costs no less per token at a smaller batch (``decode_step_s(b, b·ctx) / b`` does not rise
  with ``b``): an instance rarely fills every slot;
* costs no less as the context grows, and grows at least linearly (does not fall and is
  convex in the context): the mean context then bounds the sum over a request's steps;
* costs no less for more sequences holding the same KV (``decode_step_s(b, C)`` does not
  fall with ``b``): the longest request never decodes alone.

The roofline model (step = a term in the batch plus a term in its KV, both non-negative) and
a calibrated one with non-negative coefficients meet all three; a cost model fitted to a
profile need not. :func:`floor_premise_holds` checks them on a grid of batch sizes and
contexts, so it can miss a violation between grid points. Comparisons allow a relative
``FLOAT_SLACK`` for rounding (the simulator prices steps in integer ticks).
"""

from __future__ import annotations

import numpy as np

from policies.protocols import CostModel, Device

NUM_BATCH_POINTS = 5  # batch sizes from 1 to max_num_seqs, geometrically and linearly spaced
NUM_CONTEXT_POINTS = 5  # contexts from the shortest to the longest, evenly spaced
FLOAT_SLACK = 1e-9  # relative: rounding, not a violation


def floor_premise_holds(
    cost: CostModel,
    device: Device,
    max_num_seqs: int,
    min_context_tokens: int,
    max_context_tokens: int,
) -> bool:
    """Whether ``cost``'s decode step on ``device`` meets the floor's premise (the module's
    three conditions) at every point of the grid: batch sizes from 1 to ``max_num_seqs``,
    per-sequence contexts from ``min_context_tokens`` to ``max_context_tokens``."""
    batches = _batch_points(max_num_seqs)
    contexts = _context_points(min_context_tokens, max_context_tokens)
    steps = np.array([[cost.decode_step_s(device, b, b * c) for c in contexts] for b in batches])
    alone = np.array([[cost.decode_step_s(device, 1, b * c) for c in contexts] for b in batches])
    per_token = steps / np.asarray(batches, float)[:, None]
    return (
        _non_increasing(per_token, axis=0)
        and _non_increasing(-steps, axis=1)
        and _convex(steps, axis=1)
        and bool(np.all(steps >= alone * (1 - FLOAT_SLACK)))
    )


def _batch_points(max_num_seqs: int) -> list[int]:
    slots = max(1, max_num_seqs)
    geometric = np.geomspace(1, slots, NUM_BATCH_POINTS)
    linear = np.linspace(1, slots, NUM_BATCH_POINTS)
    return sorted({int(round(b)) for b in (*geometric, *linear)})


def _context_points(min_context_tokens: int, max_context_tokens: int) -> list[int]:
    """Evenly spaced (in whole tokens, so that second differences test convexity)."""
    low = max(0, min_context_tokens)
    step = max(1, -(-(max(low, max_context_tokens) - low) // (NUM_CONTEXT_POINTS - 1)))
    return [low + k * step for k in range(NUM_CONTEXT_POINTS)]


def _non_increasing(values: np.ndarray, axis: int) -> bool:
    rises = np.diff(values, axis=axis)
    return bool(np.all(rises <= FLOAT_SLACK * np.abs(values).max(initial=0.0)))


def _convex(values: np.ndarray, axis: int) -> bool:
    bends = np.diff(values, n=2, axis=axis)
    return bool(np.all(bends >= -FLOAT_SLACK * np.abs(values).max(initial=0.0)))
