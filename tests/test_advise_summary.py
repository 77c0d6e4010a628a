"""The share covered is never written 100% while a candidate is not covered. Seen: the
summary said "100% covered" (``:.0%``) where advice.md said 99.6%."""

from __future__ import annotations

from dataclasses import replace

import experiments.advise
from experiments.advise import AdviseOptions, advise
from experiments.advise_plan import SpaceOptions
from experiments.cli import main
from tests.test_advise import AXES
from tests.test_advise_bounds import _TpOneWins
from tests.test_advise_space import small_spec


def test_one_candidate_not_covered_in_ten_thousand_is_not_100_percent(
    tmp_path, capsys, monkeypatch
):
    options = AdviseOptions(SpaceOptions(axes=(*AXES, "mode=pipeline", "tp=2")), 60.0, 1)
    found = advise(small_spec(), options, evaluator=_TpOneWins())
    r = found.result
    candidates = [*r.candidates, *[r.candidates[0]] * (10_000 - len(r.candidates))]
    ruled_out = 9_999 - len(r.full_values)
    result = replace(r, candidates=candidates, num_ruled_out=ruled_out, num_open=1, finished=False)
    monkeypatch.setattr(experiments.advise, "advise", lambda *a, **k: replace(found, result=result))
    spec = tmp_path / "small.yaml"
    spec.write_text(small_spec().to_yaml())
    assert main(["advise", str(spec), "--out", str(tmp_path / "out"), "--workers", "1"]) == 0
    said = " ".join(capsys.readouterr().out.split())
    assert "99.9% covered" in said and "100" not in said.split("covered")[0][-8:]
    assert "- covered: 99.9% of the space" in (tmp_path / "out" / "advice.md").read_text()
