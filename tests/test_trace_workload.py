"""A trace workload (``workload.kind: trace``) is capped and checked as the run uses it."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from policies.rng import RngStreams
from policies.spec import load_spec
from sim.workload import Workload

CONFIG = Path(__file__).resolve().parents[1] / "experiments" / "configs" / "streamrl-7b.yaml"


def _trace(path: Path, lengths: list[int]) -> Path:
    rows = [(i // 4, 100, n) for i, n in enumerate(lengths)]
    pd.DataFrame(rows, columns=["prompt_id", "prompt_tokens", "output_tokens"]).to_csv(path)
    return path


def _workload(path: Path, *sets: str) -> Workload:
    spec = load_spec(CONFIG, ["workload.kind=trace", f"workload.trace_path={path}", *sets])
    return Workload(spec, RngStreams(0))


def test_the_stage_models_lengths_are_capped_as_the_runs_are(tmp_path):
    """Seen: the balanced allocation sized the stages by a trace's uncapped lengths (up to
    4996 tokens) while the run generated them capped at 1000: 18 generation GPUs of 32
    against 4 for the same trace pre-capped, and 24 % less throughput."""
    rng = np.random.default_rng(0)
    lengths = [int(n) for n in rng.integers(1, 5000, size=64)]
    raw = _workload(_trace(tmp_path / "raw.csv", lengths), "workload.max_output_tokens=1000")
    capped = _workload(_trace(tmp_path / "capped.csv", [min(n, 1000) for n in lengths]))
    drawn = raw.sample_lengths(4096)
    assert drawn.max() == 1000
    assert np.array_equal(drawn, capped.sample_lengths(4096))
    run = [raw.true_output_tokens(r) for r in raw.batch(0)]
    assert max(run) <= 1000


@pytest.mark.parametrize(
    "value, says",
    [
        ("", "data row 3: output_tokens nan"),
        ("0", "data row 3: output_tokens 0 "),
        ("2.5", "data row 3: output_tokens 2.5 "),
        ("many", "data row 3: output_tokens 'many'"),
    ],
)
def test_a_trace_length_that_is_no_token_count_is_named_by_row(tmp_path, value, says):
    path = tmp_path / "bad.csv"
    path.write_text(f"prompt_id,output_tokens\n0,5\n0,7\n1,{value}\n1,9\n")
    with pytest.raises(ValueError, match=rf"workload.trace_path: .*bad.csv {says}"):
        _workload(path)


def test_a_trace_row_without_a_prompt_id_is_named_by_row(tmp_path):
    # before: grouping by prompt dropped the row, and the run replayed the rest unsaid
    path = tmp_path / "bad.csv"
    path.write_text("prompt_id,output_tokens\n0,5\n0,7\n,8\n1,9\n")
    with pytest.raises(ValueError, match=r"bad.csv data row 3: prompt_id is empty$"):
        _workload(path)


def test_an_empty_trace_is_named(tmp_path):
    path = tmp_path / "empty.csv"
    path.write_text("prompt_id,output_tokens\n")
    with pytest.raises(ValueError, match="workload.trace_path: .*empty.csv has no rows"):
        _workload(path)


@pytest.mark.parametrize(
    "name, content, says",
    [
        ("empty.csv", b"", "empty file"),
        ("binary.csv", b"\x00\x01prompt_id\xff\xfe", "not a CSV table"),
        ("corrupt.parquet", b"not a parquet file at all", "not a Parquet table"),
    ],
)
def test_a_trace_file_that_holds_no_table_names_the_key_and_the_file(tmp_path, name, content, says):
    """Seen: an empty trace read "No columns to parse from file", naming neither."""
    path = tmp_path / name
    path.write_bytes(content)
    with pytest.raises(ValueError, match=rf"^workload\.trace_path: {path}: {says}"):
        _workload(path)
