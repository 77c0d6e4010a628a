"""RunResult.save: frames built column by column are the frames ``asdict`` row by row
gave; metrics.json, the completion marker, is written last; ``run.trace`` says whether
trace.json is written."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import pandas as pd
import pytest
from helpers import small_spec

import policies.results as results
from policies.records import SampleRecord, Span, SpanKind
from policies.results import SAMPLE_COLUMNS, SPAN_COLUMNS, RunResult
from sim.simulator import Simulation


@pytest.fixture(scope="module")
def result() -> RunResult:
    return Simulation(small_spec(run__iterations=2)).run()


def _hand_built() -> RunResult:
    """Every kind of value a column holds: None beside ints, all None, tuples, text."""
    samples = [
        SampleRecord(0, 0, 0, 0, 1, 10, 5, None, 0.0, None, None, None, 0, 0, None, None),
        SampleRecord(
            1, 0, 0, 1, 2, 10, 7, 6.5, 0.5, 1.0, 2.0, 3, 1, 2, 3, 0.25, 1, "done", (4, 5, 2)
        ),
    ]
    spans = [Span("gen-0", SpanKind.DECODE, 0.0, 1.0), Span("trainer", SpanKind.TRAIN, 1, 2, 0, 8)]
    return RunResult(small_spec(), {}, samples, spans)


def _asdict_frames(r: RunResult) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The frames as they were built before: ``dataclasses.asdict`` row by row."""
    samples = pd.DataFrame([asdict(s) for s in r.samples], columns=SAMPLE_COLUMNS)
    rows = [{**asdict(s), "kind": str(s.kind)} for s in r.spans]
    spans = pd.DataFrame(rows, columns=SPAN_COLUMNS)
    return samples, spans.astype({"iteration": "Int64", "batch_size": "Int64"})


@pytest.mark.parametrize("which", ["run", "hand-built", "empty"])
def test_frames_are_what_asdict_gave(which, result):
    r = {"run": result, "hand-built": _hand_built(), "empty": RunResult(small_spec(), {}, [], [])}
    r = r[which]
    want_samples, want_spans = _asdict_frames(r)
    for got, want in ((r.samples_frame(), want_samples), (r.spans_frame(), want_spans)):
        pd.testing.assert_frame_equal(got, want, check_exact=True)
        assert list(got.dtypes) == list(want.dtypes)
        assert results._parquet_bytes(got) == results._parquet_bytes(want)


def test_metrics_json_is_written_last(result, tmp_path, monkeypatch):
    written: list[str] = []
    real = results.write_atomic

    def record(path: Path, data: bytes) -> None:
        written.append(path.name)
        real(path, data)

    monkeypatch.setattr(results, "write_atomic", record)
    result.save(tmp_path)
    assert written[-1] == "metrics.json" and written.count("metrics.json") == 1
    assert {"spec.yaml", "samples.parquet", "events.parquet", "trace.json"} <= set(written)


def test_a_save_stopped_part_way_leaves_no_metrics_json(result, tmp_path, monkeypatch):
    """An earlier save's metrics.json goes first: a stopped save does not look complete."""
    result.save(tmp_path)

    def stop(*args: object) -> bytes:
        raise KeyboardInterrupt

    monkeypatch.setattr(results, "_parquet_bytes", stop)
    with pytest.raises(KeyboardInterrupt):
        result.save(tmp_path)
    assert not (tmp_path / "metrics.json").exists()
    with pytest.raises(ValueError, match="not a finished run"):
        RunResult.load(tmp_path)


@pytest.mark.parametrize(
    ("trace", "by_default", "written"),
    [(None, True, True), (None, False, False), (True, False, True), (False, True, False)],
)
def test_run_trace_says_whether_trace_json_is_written(result, tmp_path, trace, by_default, written):
    (tmp_path / "trace.json").write_text("{}")  # an earlier run's: never beside these results
    r = RunResult(small_spec(run__trace=trace), result.metrics, result.samples, result.spans)
    r.save(tmp_path, trace_by_default=by_default)
    assert (tmp_path / "trace.json").exists() == written
    loaded = RunResult.load(tmp_path)  # tandem trace RUN rebuilds it from the parquet files
    assert json.loads(loaded.trace_json()) == json.loads(r.trace_json())


SMALL = ["--set", "algorithm.batch_size=64", "--set", "workload.max_output_tokens=2000"]


@pytest.mark.parametrize(("given", "written"), [([], False), (["--set", "run.trace=true"], True)])
def test_a_sweep_writes_no_trace_per_point_unless_asked(tmp_path, given, written):
    from experiments.cli import main

    out = tmp_path / "sweep"
    grid = ["--grid", "run.iterations=1", "--workers", "1"]
    assert main(["sweep", "streamrl-7b", *grid, *SMALL, *given, "--out", str(out)]) == 0
    point = out / "points" / "0000"
    assert (point / "metrics.json").exists() and (point / "trace.json").exists() == written
