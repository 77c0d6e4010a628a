"""What ``pipeline.inflight: abort-resubmit`` throws away is reported: ``aborted_requests``
and ``discarded_tokens`` (decoded, then thrown away) in metrics.json and a sweep's table,
0 for ``keep`` and ``drain``. Before: no metric counted them, and
``throughput_tokens_per_s`` (kept tokens only) hid the decode time spent on them."""

from __future__ import annotations

import pytest
from engine_harness import make_rig
from helpers import request, small_spec

from policies.records import Discarded, InflightHandling
from policies.results import DISCARD_METRICS, SIM_METRICS
from sim.simulator import Simulation


def test_an_abort_counts_the_requests_and_the_tokens_they_had_decoded():
    """Pushed at 35: the update starts at the step boundary at 40, when each of the two
    requests has its prefill's token and 3 decoded ones; both are aborted, 8 tokens lost."""
    rig = make_rig({0: 10, 1: 6}, resubmit_aborted=True)
    rig.submit_at(0, [request(0), request(1)])
    rig.push_at(35, 1, InflightHandling.ABORT_RESUBMIT, pause_ticks=7)
    rig.run()
    assert rig.aborts == [(47, (0, 1))]
    assert rig.engine.discarded == Discarded(num_requests=2, num_output_tokens=8)
    assert [c.output_tokens for c in rig.done] == [6, 10]  # the kept generations


@pytest.mark.parametrize("inflight", ["keep", "drain"])
def test_keep_and_drain_discard_nothing(inflight):
    rig = make_rig({0: 10, 1: 6})
    rig.submit_at(0, [request(0), request(1)])
    rig.push_at(35, 1, InflightHandling(inflight), pause_ticks=7)
    rig.run()
    assert rig.engine.discarded == Discarded()


def _pipeline(inflight: str) -> dict:
    spec = small_spec(pipeline__mode="pipeline", pipeline__max_lag=1,
                      pipeline__inflight=inflight, run__iterations=3)  # fmt: skip
    return Simulation(spec).run().metrics


def test_a_simulated_run_reports_the_discarded_work_of_its_aborts():
    names = [m.name for m in DISCARD_METRICS]
    assert names == ["aborted_requests", "discarded_tokens"]
    assert set(names) <= set(SIM_METRICS)  # in every simulated metrics.json
    aborted = _pipeline("abort-resubmit")
    assert aborted["aborted_requests"] > 0
    assert aborted["discarded_tokens"] >= aborted["aborted_requests"]  # a token each at least
    for inflight in ("keep", "drain"):
        m = _pipeline(inflight)
        assert (m["aborted_requests"], m["discarded_tokens"]) == (0, 0)


def test_a_sweeps_table_has_the_discard_metrics(tmp_path):
    from experiments.sweep import parse_grid, run_sweep

    base = small_spec(pipeline__mode="pipeline", pipeline__max_lag=1, run__iterations=3)
    grid = [parse_grid("pipeline.inflight=keep,abort-resubmit")]
    run_sweep(base, grid, tmp_path / "sweep", workers=1, quiet=True)
    import pandas as pd

    table = pd.read_csv(tmp_path / "sweep" / "results.csv")
    rows = dict(zip(table["pipeline.inflight"], table["discarded_tokens"]))
    assert rows["keep"] == 0 and rows["abort-resubmit"] > 0
    assert (table["aborted_requests"] > 0).tolist() == [False, True]
