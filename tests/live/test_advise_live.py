"""``tandem advise --live-check`` end to end on real vLLM (tiny model, CPU), at small scale:
advise on the live tasks' trace with the calibrated cost model, then its top configuration
and the input spec live on one shared server, each with its sim twin."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from experiments.cli import main

REPO = Path(__file__).resolve().parents[2]
COST_MODEL = REPO / "docs" / "reports" / "fidelity-run14" / "cost-model"
SETS = ["algorithm.batch_size=12", "algorithm.group_size=3", "workload.max_output_tokens=48",
        "run.iterations=3", "workload.num_prompts=64", "pipeline.mode=disagg-sync"]  # fmt: skip


@pytest.mark.live
def test_advise_live_check_runs_the_top_and_the_input_live(tmp_path, capsys):
    from experiments.advise_live import main as live_main

    trace = tmp_path / "trace.parquet"
    sets = sum((["--set", s] for s in SETS), [])
    assert live_main(["trace", "live-tiny", *sets, "--out", str(trace)]) == 0
    out = tmp_path / "advice"
    args = [
        "advise", "live-tiny", *sets, "--set", "workload.kind=trace",
        "--set", f"workload.trace_path={trace}", "--set", f"sim.cost_model=profiled:{COST_MODEL}",
        "--axis", "tp=1", "--axis", "max_num_seqs=64", "--axis", "mode=disagg-sync,stream-async",
        "--axis", "scheduling=fcfs", "--axis", "predictor=oracle",
        "--max-staleness", "1", "--budget-s", "60", "--workers", "1", "--out", str(out),
        "--live-check", "1", "--live-repeats", "1",
    ]  # fmt: skip
    assert main(args) == 0
    printed = capsys.readouterr().out
    assert "live check: the live order" in printed
    frame = pd.read_csv(out / "live-check" / "live-check.csv")
    assert len(frame) == 2  # the top configuration and the input spec
    assert (frame["live_median"] > 0).all() and (frame["twin_median"] > 0).all()
    assert frame["configuration"].str.contains("(input)", regex=False).any()
    text = (out / "live-check" / "live-check.md").read_text()
    assert "seed +0:" in text and "sim twins" in text
    runs = list((out / "live-check" / "cases").glob("config-*/repeat-0/live/metrics.json"))
    assert len(runs) == 2
