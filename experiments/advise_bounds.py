"""Which configurations lie inside the space ``tandem advise`` was asked to search.

The space is bounded by ``--max-staleness`` and by every ``--axis`` given. Pricing a
change runs the input spec with one of the advice's values, and the advice with one of
the input's, so those runs may carry a value an ``--axis`` left out (or a staleness over
the bound): they are shown, never chosen. A dimension no ``--axis`` names is bounded
only by staleness, so the input's own values (a tp or lag outside the defaults, its
split) stay inside.
"""

from __future__ import annotations

from dataclasses import dataclass

from experiments.advise_space import (
    Candidate,
    PolicyChoice,
    SearchAxes,
    canonical,
    enumerate_policies,
)

POLICY_AXES = frozenset({"dispatch", "scheduling", "predictor"})


@dataclass(frozen=True, slots=True)
class Bounds:
    """``--max-staleness`` and the values of each ``--axis`` the user gave."""

    axes: SearchAxes
    given: frozenset[str]  # the axis names given with --axis
    prefer: PolicyChoice  # the input's policies (how ``canonical`` picks a representative)

    @classmethod
    def of(cls, axes: SearchAxes, overrides: tuple[str, ...], prefer: PolicyChoice) -> Bounds:
        return cls(axes, frozenset(text.split("=", 1)[0].strip() for text in overrides), prefer)

    def admits(self, c: Candidate) -> bool:
        """Whether ``c`` is within the staleness bound and every ``--axis`` given."""
        s, a = c.structure, self.axes
        if s.staleness_bound > a.max_staleness:
            return False
        checks = (
            ("mode", s.mode, a.modes),
            ("tp", s.tp, a.tps),
            ("max_num_seqs", s.max_num_seqs, a.max_num_seqs),
        )
        if any(name in self.given and value not in allowed for name, value, allowed in checks):
            return False
        if "lag" in self.given and s.lag is not None and s.lag not in a.lags:
            return False
        return not (self.given & POLICY_AXES) or self._policies_admitted(c)

    def _policies_admitted(self, c: Candidate) -> bool:
        """Some combination the axes allow has ``c``'s policies as its representative (a
        predictor nothing reads is ``none``, whatever ``--axis predictor`` lists)."""
        return any(
            canonical(Candidate(c.structure, p), self.prefer).policies == c.policies
            for p in enumerate_policies(self.axes)
        )
