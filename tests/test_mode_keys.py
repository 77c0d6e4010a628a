"""A pipeline key a mode does not use is refused naming it, never ignored.

Seen in a user trial: ``pipeline.steps_per_generation=4`` on ``stream-async``,
``pipeline`` or ``stream-sync``, and ``pipeline.inflight=drain`` on ``stream-async``, ran
exactly as without them (exit 0); ``conventional`` with ``run.iterations`` not a
multiple of ``steps_per_generation`` passed ``tandem spec show`` and failed only once the
run had started.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from policies.spec import SpecError, load_spec, override_spec

CONFIG = Path(__file__).resolve().parents[1] / "experiments" / "configs" / "streamrl-7b.yaml"


@pytest.mark.parametrize("mode", ["stream-async", "pipeline", "stream-sync"])
def test_steps_per_generation_is_conventionals_only(mode):
    with pytest.raises(
        SpecError, match=rf"steps_per_generation: 4 applies to mode 'conven.*{mode}"
    ):
        load_spec(CONFIG, [f"pipeline.mode={mode}", "pipeline.steps_per_generation=4"])
    spec = load_spec(CONFIG, ["pipeline.mode=conventional", "pipeline.steps_per_generation=5"])
    assert spec.pipeline.steps_per_generation == 5


@pytest.mark.parametrize("mode", ["stream-async", "disagg-sync", "conventional"])
def test_inflight_applies_where_weights_load_in_flight_only(mode):
    with pytest.raises(SpecError, match=rf"pipeline.inflight 'drain': mode '{mode}' updates"):
        load_spec(CONFIG, [f"pipeline.mode={mode}", "pipeline.inflight=drain"])
    for ok in (["pipeline.mode=pipeline"], ["pipeline.overlap_waves=true"]):
        assert load_spec(CONFIG, [*ok, "pipeline.inflight=drain"]).pipeline.inflight == "drain"


def test_conventional_needs_whole_rounds_before_anything_runs():
    with pytest.raises(SpecError, match=r"run.iterations \(10\) must be a multiple of .*\(4\)"):
        load_spec(CONFIG, ["pipeline.mode=conventional", "pipeline.steps_per_generation=4"])


def test_switching_modes_drops_the_keys_of_the_mode_left():
    drain = load_spec(CONFIG, ["pipeline.mode=pipeline", "pipeline.inflight=drain"])
    assert override_spec(drain, ["pipeline.mode=stream-async"]).pipeline.inflight == "keep"
    rounds = load_spec(
        CONFIG,
        ["pipeline.mode=conventional", "pipeline.steps_per_generation=5", "run.iterations=10"],
    )
    assert override_spec(rounds, ["pipeline.mode=pipeline"]).pipeline.steps_per_generation == 1
    with pytest.raises(SpecError, match="steps_per_generation: 5 applies"):  # set: refused
        override_spec(rounds, ["pipeline.mode=pipeline", "pipeline.steps_per_generation=5"])
