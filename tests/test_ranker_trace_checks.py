"""What ``tandem ranker fit`` / ``eval`` say of trace cells that are no prompt or no id, of
traces with no data rows, and of a ``--before`` that leaves nothing to fit on."""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from experiments.cli import main
from ranker.evaluate import rank_metrics
from ranker.traces import read_trace


def _csv(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "tr.csv"
    path.write_text(text)
    return path


def test_prompt_text_na_and_null_stay_text(tmp_path):
    """Seen: pandas read NA and null as NaN: 'object of type 'float' has no len()'."""
    trace = read_trace(_csv(tmp_path, "prompt,output_tokens\nNA,3\nnull,4\nb,5\nNA,6\n"))
    assert list(trace["prompt"]) == ["NA", "null", "b", "NA"]
    assert list(trace["prompt_id"]) == [0, 1, 2, 0]
    assert list(trace["prompt_tokens"]) == [2, 4, 1, 2]


def test_a_blank_prompt_is_named_by_file_and_row(tmp_path):
    path = _csv(tmp_path, "prompt,output_tokens\nab,3\n,4\n")
    with pytest.raises(ValueError, match=rf"^trace {path} data row 2: prompt is empty"):
        read_trace(path)


def test_a_missing_parquet_prompt_is_named_by_file_and_row(tmp_path):
    path = tmp_path / "tr.parquet"
    pd.DataFrame({"prompt": ["ab", None], "output_tokens": [3, 4]}).to_parquet(path)
    with pytest.raises(ValueError, match=rf"^trace {path} data row 2: prompt is empty"):
        read_trace(path)


def test_the_cli_refuses_a_blank_prompt_with_exit_2(tmp_path, capsys):
    path = _csv(tmp_path, "prompt,output_tokens\nab,3\n,4\n")
    assert main(["ranker", "fit", str(path), "--out", str(tmp_path / "r.model")]) == 2
    assert "data row 2: prompt is empty" in " ".join(capsys.readouterr().out.split())


@pytest.mark.parametrize(
    "header, row, says",
    [
        ("prompt_id,output_tokens", "x,4", "prompt_id 'x' is not a whole number"),
        ("prompt_id,output_tokens", ",4", "prompt_id nan is not a whole number"),
        ("prompt_id,output_tokens", "1.5,4", "prompt_id 1.5 is not a whole number"),
        ("prompt,iteration,output_tokens", "a,x,4", "iteration 'x' is not a whole number"),
        ("prompt_id,iteration,output_tokens", "1,0.5,4", "iteration 0.5 is not a whole number"),
    ],
)
def test_an_id_that_is_no_whole_number_is_named_by_file_and_row(tmp_path, header, row, says):
    """Seen: "invalid literal for int() with base 10: 'x'"; a blank id became -2^63 and
    1.5 became 1, both silently."""
    first = ",".join(
        "a" if c == "prompt" else "0" if c != "output_tokens" else "3" for c in header.split(",")
    )
    path = _csv(tmp_path, f"{header}\n{first}\n{row}\n")
    with pytest.raises(ValueError, match=rf"^trace {path} data row 2: {says}"):
        read_trace(path)


def test_a_header_only_trace_is_named_as_having_no_data_rows(tmp_path):
    path = _csv(tmp_path, "prompt,output_tokens\n")
    with pytest.raises(ValueError, match=rf"^trace {path} has no data rows"):
        read_trace(path)


@pytest.mark.parametrize("before", ["0", "-1"])
def test_a_before_that_leaves_no_rows_names_the_flag_and_the_iterations(tmp_path, capsys, before):
    """Seen: 'cannot fit a ranker on an empty trace', naming neither."""
    path = _csv(tmp_path, "prompt,output_tokens\na,3\nb,4\na,5\nb,6\n")
    out = tmp_path / "r.model"
    assert main(["ranker", "fit", str(path), "--before", before, "--out", str(out)]) == 2
    said = " ".join(capsys.readouterr().out.split())
    assert f"--before {before}" in said and "iterations 0 to 1" in said
    assert "empty trace" not in said


def test_rank_metrics_of_one_sample_are_undefined_without_a_warning():
    """Seen: scipy's SmallSampleWarning, twice, before eval's own error."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        metrics = rank_metrics(np.array([3.0]), np.array([1.0]))
    assert np.isnan(metrics.spearman) and np.isnan(metrics.kendall)
    assert metrics.num_samples == 1
