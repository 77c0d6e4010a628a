"""The timeline of a large run thins its generation rows evenly and says so."""

from __future__ import annotations

from experiments.plots import shown_resources
from policies.resources import GENERATION_PREFIX, TRAINER


def test_a_large_run_shows_instances_spread_over_all_of_them_and_says_so() -> None:
    gens = [f"{GENERATION_PREFIX}{i}" for i in range(1024)]
    rows, note = shown_resources([TRAINER, *gens, "link-0"], 48)
    shown = [r for r in rows if r.startswith(GENERATION_PREFIX)]
    assert len(shown) == 48
    assert shown[0] == "gen-0" and shown[-1] == "gen-1023"  # both ends, not the first 48
    assert TRAINER in rows and "link-0" in rows
    assert note == "48 of 1024 generation instances shown, evenly spaced"


def test_a_small_run_shows_every_row_without_a_note() -> None:
    names = [TRAINER, "gen-0", "gen-1"]
    assert shown_resources(names, 48) == (names, "")
