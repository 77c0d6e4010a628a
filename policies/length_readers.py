"""Whether a run's length predictor can change anything: which policies read its output.

A predictor's output reaches a run only as ``Request.predicted_tokens``. In the simulator
and the live runtime alike it is read by dispatch (the request itself, and the views'
``assigned_tokens`` that the modes sum from it) and by scheduling (a request's priority),
each of which declares whether it reads it (``policies.dispatch.READS_LENGTHS``,
``policies.scheduling.READS_LENGTHS``). Nothing else reads it: the modes only carry it,
allocation prices the workload's own lengths, and a completion records it for the
ranker's quality metrics (``ranker`` only). So where neither policy reads lengths,
``oracle``, ``noisy-oracle``, ``ranker`` and ``none`` give the same run (the noisy
oracle draws from its own named RNG stream; a ranker still costs its fitting time and
reports its ranking quality).
"""

from __future__ import annotations

from policies import dispatch, scheduling


def reads_lengths(dispatch_name: str | None, scheduling_name: str) -> bool:
    """Whether a run with these policies reads predicted lengths; ``dispatch_name`` None:
    dispatch is moot (one generation instance takes every request)."""
    by_dispatch = dispatch_name is not None and dispatch_name in dispatch.READS_LENGTHS
    return by_dispatch or scheduling_name in scheduling.READS_LENGTHS
