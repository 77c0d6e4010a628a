"""The ``pipeline`` section of a run spec: the mode, its staleness bound and how weights
reach the instances."""

from __future__ import annotations

from typing import Annotated, Literal, get_args

from pydantic import Field, ValidationInfo, field_validator, model_validator

from policies.cluster import MAX_ITERATIONS, check_name, count
from policies.cluster import Section as _Section
from policies.modes import MODES
from policies.records import InflightHandling

# what a spec may set; ``barrier`` is the controllers' own (updates between batches)
SpecInflight = Literal[
    InflightHandling.KEEP, InflightHandling.ABORT_RESUBMIT, InflightHandling.DRAIN
]


def overlap_modes() -> list[str]:
    """The modes ``pipeline.overlap_waves`` applies to: the wave modes on their own
    instances with a bound of at least one step (one-step-async, stream-async)."""
    return [
        name
        for name in MODES.names()
        if (t := MODES.get(name)).max_lag and not (t.colocated or t.continuous or t.conventional)
    ]


class PipelineSection(_Section):
    """The pipeline mode. ``max_lag`` is the ``pipeline`` mode's (unset: 4); every other
    mode fixes its own bound (0 for the sync modes, 1 for the one-step async ones,
    ``steps_per_generation − 1`` for ``conventional``), so there it stays unset (or equal
    to that bound): any other value is an error naming the key, never ignored."""

    # the registry in the annotation: ``tandem spec keys`` lists its names as the choices
    mode: Annotated[str, MODES] = Field(
        "stream-async", description="pipeline mode (tandem spec keys lists the registered ones)"
    )
    inflight: SpecInflight = Field(
        InflightHandling.KEEP,
        description="running requests at a weight update: keep, abort-resubmit or drain",
    )
    steps_per_generation: int = count(
        1, ge=1, le=4096, description="conventional mode: optimizer steps per generated batch (G)"
    )
    max_lag: int | None = count(
        None,
        ge=0,
        le=MAX_ITERATIONS,
        description="pipeline mode: max versions a sample may lag (unset: 4)",
    )  # after mode and steps_per_generation: its check reads them
    push_every: int = count(
        1, ge=1, le=MAX_ITERATIONS,
        description="pipeline mode: push weights to the servers every this many optimizer "
        "steps (1: every step, as PipelineRL); max_lag still bounds staleness, so at most "
        "max_lag + 1",
    )  # fmt: skip
    overlap_waves: bool | None = Field(
        None,
        description="one-step-async / stream-async: start batch w once every instance "
        "holds weights w-1 (loaded in flight, as pipeline.inflight says) instead of after "
        "batch w-1's last answer; staleness stays within 1. None: the mode's own (pipeline "
        "always overlaps, the wave modes do not)",
    )

    @field_validator("mode")
    @classmethod
    def _known_mode(cls, value: str) -> str:
        return check_name(value, MODES.names())

    @field_validator("max_lag")
    @classmethod
    def _lag_of_the_mode(cls, value: int | None, info: ValidationInfo) -> int | None:
        """Resolve ``pipeline``'s default; refuse a lag the mode does not take."""
        mode, steps = info.data.get("mode"), info.data.get("steps_per_generation")
        if mode is None or steps is None:  # reported on their own keys
            return value
        traits = MODES.get(mode)
        bound = traits.staleness_bound(value, steps)
        return bound if traits.fixed_lag(steps) is None else value

    @field_validator("steps_per_generation")
    @classmethod
    def _steps_of_the_mode(cls, value: int, info: ValidationInfo) -> int:
        mode = info.data.get("mode")
        if value != 1 and mode is not None and not MODES.get(mode).conventional:
            raise ValueError(
                f"{value} applies to mode 'conventional' only, not {mode!r}: leave it 1"
            )
        return value

    @model_validator(mode="after")
    def _inflight_of_the_mode(self) -> PipelineSection:
        """Running requests meet a weight update only where weights load in flight: the
        ``pipeline`` mode, or a wave mode with ``overlap_waves``; elsewhere an update waits
        for the servers to drain, and another ``inflight`` would change nothing."""
        if self.inflight == InflightHandling.KEEP or self.mode not in MODES:
            return self
        if not (MODES.get(self.mode).continuous or self.overlap_waves):
            raise ValueError(
                f"pipeline.inflight {self.inflight.value!r}: mode {self.mode!r} updates "
                "weights between batches, with no request running; it applies to mode "
                "'pipeline' and to pipeline.overlap_waves only: leave it keep"
            )
        return self

    @field_validator("push_every")
    @classmethod
    def _pushes_of_the_mode(cls, value: int, info: ValidationInfo) -> int:
        mode = info.data.get("mode")
        if value != 1 and mode is not None and not MODES.get(mode).continuous:
            raise ValueError(f"{value} applies to mode 'pipeline' only, not {mode!r}: leave it 1")
        lag = info.data.get("max_lag")  # resolved above (unset: the mode's default)
        if lag is not None and value > lag + 1:
            # the servers hold weights up to push_every - 1 versions old, so a sample
            # started on them must be trained within max_lag steps: past lag + 1 none can be
            raise ValueError(
                f"{value} is more than pipeline.max_lag + 1 ({lag + 1}): servers {value - 1} "
                f"versions behind could start no sample within pipeline.max_lag {lag}; the run "
                "would stall"
            )
        return value

    @field_validator("overlap_waves")
    @classmethod
    def _overlap_of_the_mode(cls, value: bool | None, info: ValidationInfo) -> bool | None:
        mode = info.data.get("mode")
        if value is None or mode is None:
            return value
        if MODES.get(mode).continuous:
            if not value:
                raise ValueError(f"mode {mode!r} always overlaps its batches: leave it unset")
            return value
        if value and mode not in overlap_modes():
            names = ", ".join(repr(m) for m in overlap_modes())
            raise ValueError(f"applies to modes {names} only, not {mode!r}: leave it unset")
        if value and info.data.get("inflight") == InflightHandling.ABORT_RESUBMIT:
            # the wave modes do not dispatch aborted requests again: a batch would stall
            raise ValueError("needs pipeline.inflight keep or drain, not abort-resubmit")
        return value

    @field_validator("inflight", mode="before")
    @classmethod
    def _one_of_the_choices(cls, value: object) -> object:
        """Say the choices in words (pydantic would print the enum members)."""
        if value not in get_args(SpecInflight):
            raise ValueError("must be keep, abort-resubmit or drain")
        return value
