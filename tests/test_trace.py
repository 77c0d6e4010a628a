"""``trace.json``: every run's timeline in Chrome's trace-event format, validated."""

from __future__ import annotations

import json
import logging
import re
from collections import defaultdict
from pathlib import Path

from helpers import small_spec
from trace_format import validate_trace

from experiments.cli import main
from policies.records import Span, SpanKind
from policies.results import RunResult
from policies.trace import trace_events
from sim.simulator import Simulation


def _complete(doc: dict) -> list[dict]:
    return [e for e in doc["traceEvents"] if e["ph"] == "X"]


def test_every_simulated_run_writes_a_valid_trace_of_its_spans_samples_and_steps(tmp_path):
    result = Simulation(small_spec(run__iterations=3, pipeline__mode="stream-async")).run()
    result.save(tmp_path)
    doc = json.loads((tmp_path / "trace.json").read_text())
    tracks = validate_trace(doc)
    events = _complete(doc)
    by_cat = defaultdict(list)
    for e in events:
        by_cat[e["cat"]].append(e)
    assert len(by_cat["span"]) == len(result.spans)
    assert len(by_cat["sample"]) == len(result.samples)
    assert len(by_cat["step"]) == 3
    resources = {s.resource for s in result.spans}
    processes = {e["args"]["name"] for e in doc["traceEvents"] if e["name"] == "process_name"}
    assert processes == resources  # one process per instance, trainer and link
    assert {"gen-0", "gen-1", "trainer"} <= set(tracks.values())
    # times are microseconds of the run; names carry sample, iteration, step and version
    sample = result.samples[5]
    [ev] = [e for e in by_cat["sample"] if e["name"] == f"sample {sample.sample_id}"]
    assert ev["ts"] == round(sample.gen_start_s * 1e6)
    assert ev["ts"] + ev["dur"] == round(sample.gen_end_s * 1e6)
    assert ev["args"]["version_start"] == sample.version_start
    assert tracks[(ev["pid"], ev["tid"])].startswith("samples ")
    names = {e["name"] for e in events}
    assert {"decode · iter 0", "train · step 2", "step 1", "weight_sync · v1"} <= names


def test_spans_that_overlap_without_nesting_go_to_a_second_lane():
    spans = [
        Span("gen-0", SpanKind.DECODE, 0.0, 1.0, 0, 4),
        Span("gen-0", SpanKind.WEIGHT_SYNC, 0.5, 0.6),  # nested: same lane
        Span("gen-0", SpanKind.WEIGHT_SYNC, 0.9, 1.2),  # straddles the end: a new lane
        Span("trainer", SpanKind.TRAIN, 0.2, 0.8, 0, 8),
    ]
    doc = {"traceEvents": trace_events(spans)}
    tracks = validate_trace(doc)
    lanes = defaultdict(list)
    for e in _complete(doc):
        lanes[tracks[(e["pid"], e["tid"])]].append(e["ts"])
    assert lanes == {"gen-0": [0, 500_000], "gen-0 · lane 1": [900_000], "trainer": [200_000]}


def test_the_validator_catches_a_broken_trace():
    good = {"traceEvents": trace_events([Span("gen-0", SpanKind.DECODE, 0.0, 1.0)])}
    validate_trace(good)
    broken = json.loads(json.dumps(good))
    broken["traceEvents"].append({**_complete(good)[0], "ts": 500_000})  # overlapping
    try:
        validate_trace(broken)
    except AssertionError as err:
        assert "overlap" in str(err)
    else:
        raise AssertionError("an overlapping event passed")


def test_tandem_trace_rewrites_the_trace_of_a_run_directory(tmp_path: Path):
    Simulation(small_spec(run__iterations=2)).run().save(tmp_path)
    before = (tmp_path / "trace.json").read_bytes()
    (tmp_path / "trace.json").unlink()
    assert main(["trace", str(tmp_path)]) == 0
    assert (tmp_path / "trace.json").read_bytes() == before  # from the parquet files alone
    assert RunResult.load(tmp_path).trace_json() == before


def test_tandem_trace_names_a_directory_that_holds_no_finished_run(tmp_path: Path, capsys):
    Simulation(small_spec(run__iterations=2)).run().save(tmp_path)
    (tmp_path / "metrics.json").unlink()  # as a run that stopped before its results
    assert main(["trace", str(tmp_path)]) == 2
    said = " ".join(capsys.readouterr().out.split())
    assert f"{tmp_path}: not a finished run's directory (no metrics.json" in said


def test_tandem_trace_on_a_missing_directory_says_it_does_not_exist(tmp_path: Path, capsys):
    """Before: "not a finished run's directory (no spec.yaml; ...)" for a typo'd path."""
    assert main(["trace", str(tmp_path / "nope")]) == 2
    said = capsys.readouterr().out.strip()
    assert said == f"error: run directory {tmp_path / 'nope'} does not exist"
    (tmp_path / "file").write_text("")
    assert main(["trace", str(tmp_path / "file")]) == 2
    assert f"run directory {tmp_path / 'file'} is a file" in capsys.readouterr().out


def test_saving_says_before_and_after_writing_the_trace(tmp_path, caplog):
    """Before: a stepped run's 86 MB trace.json took ~55 s with nothing shown (the run's
    progress bar shows each INFO line of tandem's loggers as its status)."""
    result = Simulation(small_spec(run__iterations=1)).run()
    with caplog.at_level(logging.INFO, logger="policies.results"):
        result.save(tmp_path)
    lines = [r.getMessage() for r in caplog.records if r.name == "policies.results"]
    spans, samples = len(result.spans), len(result.samples)
    assert lines[0] == f"writing results to {tmp_path}…"  # the parquet files first
    assert lines[1] == f"writing trace.json ({spans} spans, {samples} samples)…"
    size_mb = (tmp_path / "trace.json").stat().st_size / 1e6
    assert re.fullmatch(rf"wrote trace\.json \({size_mb:.1f} MB\) in \d+\.\d s", lines[2])


def test_tandem_trace_names_a_table_that_lacks_a_column(tmp_path: Path, capsys):
    """Seen: ``TypeError: Span.__init__() missing 1 required positional argument``."""
    import pandas as pd

    Simulation(small_spec(run__iterations=2)).run().save(tmp_path)
    events = tmp_path / "events.parquet"
    pd.read_parquet(events).drop(columns=["resource"]).to_parquet(events)
    assert main(["trace", str(tmp_path)]) == 2
    said = " ".join(capsys.readouterr().out.split())
    assert f"{events}: no column resource (a Span needs it)" in said
