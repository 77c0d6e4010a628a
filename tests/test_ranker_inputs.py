"""What ``tandem ranker fit`` / ``eval`` refuse or write for traces that are not usable as
they stand: lengths that are no token count, metrics that are undefined, too few prompts."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from experiments.cli import main
from ranker.traces import read_trace


def _strict_json(path: Path) -> dict:
    """The document at ``path``, refusing the ``NaN`` that ``json.dumps`` writes by default."""

    def refuse(name: str) -> None:
        raise ValueError(f"{path}: {name} is not JSON")

    return json.loads(path.read_text(), parse_constant=refuse)


@pytest.mark.parametrize(
    "value, says",
    [
        ("", "data row 2: output_tokens nan"),
        ("-3", "data row 2: output_tokens -3 "),
        ("0", "data row 2: output_tokens 0 "),
        ("2.5", "data row 2: output_tokens 2.5 "),
    ],
)
def test_a_trace_length_that_is_no_token_count_is_named_by_file_and_row(tmp_path, value, says):
    """Seen: an empty output_tokens became -9223372036854775808 with a numpy warning."""
    path = tmp_path / "tr.csv"
    path.write_text(f"prompt,output_tokens\nab,5\ncd,{value}\nef,9\n")
    with pytest.raises(ValueError, match=rf"trace .*tr.csv {says}"):
        read_trace(path)


def _fit(tmp_path: Path, frame: pd.DataFrame) -> tuple[Path, Path]:
    trace, model = tmp_path / "tr.csv", tmp_path / "r.model"
    frame.to_csv(trace, index=False)
    assert main(["ranker", "fit", str(trace), "--out", str(model)]) == 0
    return trace, model


def test_eval_of_undefined_rank_correlations_writes_valid_json(tmp_path):
    """Seen: equal lengths gave spearman NaN, written as a bare NaN (invalid JSON)."""
    prompts = [f"p{i}" for i in range(10)]
    trace, model = _fit(tmp_path, pd.DataFrame({"prompt": prompts * 2, "output_tokens": 7}))
    assert main(["ranker", "eval", str(model), str(trace)]) == 0
    report = _strict_json(model.with_name(model.name + ".eval.json"))
    assert report["later_epoch"]["ranker"]["spearman"] is None


def test_eval_says_how_many_rows_the_trace_has_beside_the_timed_ones(tmp_path, capsys):
    """Seen: 'wall seconds on 10000 rows of the trace' for a trace of 20 rows."""
    prompts = [f"p{i}" for i in range(10)]
    frame = pd.DataFrame({"prompt": prompts * 2, "output_tokens": range(3, 23)})
    trace, model = _fit(tmp_path, frame)
    capsys.readouterr()
    assert main(["ranker", "eval", str(model), str(trace)]) == 0
    said = " ".join(capsys.readouterr().out.split())
    assert "wall seconds on 10000 rows resampled (with repeats) from the trace's 20" in said


def test_eval_of_one_prompt_says_it_is_too_few_to_hold_out(tmp_path, capsys):
    """Seen: 'cannot fit a ranker on an empty trace' for a trace of one prompt."""
    trace, model = _fit(
        tmp_path, pd.DataFrame({"prompt": ["a"] * 4, "output_tokens": [3, 5, 4, 6]})
    )
    capsys.readouterr()
    assert main(["ranker", "eval", str(model), str(trace)]) == 2
    said = " ".join(capsys.readouterr().out.split())
    assert "1 prompt id(s), too few to hold some out" in said and "empty trace" not in said


def test_a_ranker_trace_that_holds_no_table_is_named(tmp_path):
    path = tmp_path / "empty.csv"
    path.write_bytes(b"")
    with pytest.raises(ValueError, match=rf"^trace {path}: empty file"):
        read_trace(path)
