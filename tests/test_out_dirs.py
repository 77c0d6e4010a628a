"""Runs without ``--out`` get a directory of their own, also when started together."""

from __future__ import annotations

import argparse
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from experiments.cli import _out_dir
from experiments.guards import fresh_dir
from experiments.specs import config_path
from policies.spec import SpecError, load_spec


def test_runs_started_in_the_same_second_get_their_own_directories(tmp_path, monkeypatch):
    """Seen: two runs started within a second both wrote runs/NAME-MODE-TIME; only the
    second's spec and metrics survived, and run.log held both, interleaved."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(time, "strftime", lambda fmt: "20261205-193407")
    args = argparse.Namespace(out=None)
    spec = load_spec(None)
    with ThreadPoolExecutor(4) as pool:
        outs = list(pool.map(lambda _: _out_dir(args, spec), range(6)))
    names = sorted(p.name for p in outs)
    base = f"{spec.run.name}-{spec.pipeline.mode}-20261205-193407"
    assert names == sorted([base, *(f"{base}-{n}" for n in range(2, 7))])
    assert all(p.is_dir() for p in outs)


def test_a_default_directory_under_a_file_is_named(tmp_path):
    (tmp_path / "runs").write_text("not a directory")
    with pytest.raises(ValueError, match="runs"):
        fresh_dir(tmp_path / "runs" / "x")


def test_a_run_into_a_directory_of_another_run_leaves_none_of_its_results(tmp_path, monkeypatch):
    """Seen: a 72B run into a 7B run's --out, stopped by Ctrl-C, left the 72B spec beside
    the 7B samples, events, steps and plots; ``tandem trace`` took the mix."""
    import sim.simulator
    from experiments.cli import main

    out = tmp_path / "run"
    out.mkdir()
    for name in ("metrics.json", "samples.parquet", "steps.json", "timeline.png", "notes.txt"):
        (out / name).write_text("an earlier run's")

    def stopped(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(sim.simulator.Simulation, "run", stopped)
    assert main(["run", "streamrl-7b", "--out", str(out)]) == 2  # not this spec's: refused
    assert (out / "metrics.json").read_text() == "an earlier run's"
    assert main(["run", "streamrl-7b", "--out", str(out), "--overwrite"]) == 130
    assert sorted(p.name for p in out.iterdir()) == ["notes.txt", "run.log", "spec.yaml"]


def test_a_run_of_another_spec_is_refused_and_the_same_spec_runs_again(tmp_path, capsys):
    """Seen: ``tandem run SPEC --set run.iterations=2 --out DIR`` into a 12-iteration run
    replaced its metrics and spec and appended to its run.log: one directory, two runs."""
    from experiments.cli import main

    out = tmp_path / "run"
    assert main(["run", "streamrl-7b", "--set", "run.iterations=2", "--out", str(out)]) == 0
    metrics = (out / "metrics.json").read_bytes()
    capsys.readouterr()
    assert main(["run", "streamrl-7b", "--set", "run.iterations=3", "--out", str(out)]) == 2
    printed = capsys.readouterr()
    refusal = " ".join((printed.out + printed.err).split())
    assert "run.iterations (2 → 3)" in refusal and "--overwrite" in refusal
    assert (out / "metrics.json").read_bytes() == metrics
    # the same spec again (its balanced allocation saved the split it chose): it runs
    assert main(["run", "streamrl-7b", "--set", "run.iterations=2", "--out", str(out)]) == 0
    assert main(["run", "streamrl-7b", "--set", "run.iterations=3", "--out", str(out),
                 "--overwrite"]) == 0  # fmt: skip
    log = (out / "run.log").read_text()
    assert log.count("simulated run of") == 1
    assert load_spec(out / "spec.yaml").run.iterations == 3


def test_advice_of_another_spec_is_refused_before_any_search(tmp_path, capsys):
    """Seen: ``tandem advise`` with another spec into an earlier advice's --out replaced
    every file of it."""
    from experiments.advise_cmd import ADVICE_FILES
    from experiments.cli import main
    from experiments.guards import check_run_out

    out = tmp_path / "advice"
    out.mkdir()
    earlier = load_spec(config_path("streamrl-7b"), ["run.iterations=3"])
    (out / "input.yaml").write_text(earlier.to_yaml())
    (out / "advice.md").write_text("the earlier advice")
    assert main(["advise", "streamrl-7b", "--out", str(out)]) == 2
    printed = capsys.readouterr()
    assert "run.iterations" in " ".join((printed.out + printed.err).split())
    assert (out / "advice.md").read_text() == "the earlier advice"
    assert check_run_out(out, earlier, False, ADVICE_FILES, "input.yaml") is False
    assert check_run_out(out, load_spec(None), True, ADVICE_FILES, "input.yaml") is True
    with pytest.raises(SpecError, match="no input.yaml"):  # advice files, but no spec
        (out / "input.yaml").unlink()
        check_run_out(out, earlier, False, ADVICE_FILES, "input.yaml")


def test_a_directory_given_for_a_file_or_a_file_of_another_kind_is_one_line(tmp_path, capsys):
    """Seen: ``tandem trace RUN --out DIR`` and ``tandem ranker fit … --out DIR`` ended in an
    IsADirectoryError traceback naming a temporary file; ``tandem ranker eval`` of a JSON
    file in an UnpicklingError traceback."""
    from experiments.cli import main

    out = tmp_path / "run"
    assert main(["run", "streamrl-7b", "--set", "run.iterations=1", "--out", str(out)]) == 0
    capsys.readouterr()
    assert main(["trace", str(out), "--out", str(tmp_path)]) == 2
    said = " ".join(capsys.readouterr().out.split())
    assert f"error: {tmp_path}: a directory, where a file is to be written" in said
    assert main(["ranker", "eval", str(out / "metrics.json"), str(out / "samples.parquet")]) == 2
    said = " ".join(capsys.readouterr().out.split())
    assert "metrics.json is not a tandem ranker file" in said and "Traceback" not in said


def test_an_out_file_that_is_the_input_or_a_run_result_is_refused(tmp_path, capsys):
    """Seen: ``tandem trace RUN --out RUN/metrics.json`` replaced the run's metrics (rc 0);
    ``tandem ranker fit tr.csv --out tr.csv`` replaced the trace with the pickle."""
    from experiments.cli import main

    run = tmp_path / "run"
    run.mkdir()
    for name in ("spec.yaml", "metrics.json"):
        (run / name).write_text("the run's")
    trace = tmp_path / "tr.csv"
    trace.write_text("prompt,output_tokens\na,3\nb,4\n")
    relative = tmp_path / "sub" / ".." / "tr.csv"
    (tmp_path / "sub").mkdir()
    cases = [
        (["trace", str(run), "--out", str(run / "metrics.json")], "a result of run"),
        (["ranker", "fit", str(trace), "--out", str(relative)], "is the command's input"),
        (["ranker", "eval", str(trace), str(trace), "--json", str(trace)], "command's input"),
    ]
    for argv, says in cases:
        assert main(argv) == 2
        assert says in " ".join(capsys.readouterr().out.split())
    assert (run / "metrics.json").read_text() == "the run's"
    assert trace.read_text().startswith("prompt,output_tokens")


def test_a_file_that_cannot_be_written_is_named_not_its_temporary():
    """Seen: ``--out /proc/x.model`` said ``/proc/.x.model.b9kkcsgo: No such file``."""
    from policies.results import write_atomic

    if not Path("/proc/self").is_dir():
        pytest.skip("needs Linux's /proc, where no file can be made")
    with pytest.raises(FileNotFoundError) as raised:
        write_atomic(Path("/proc/x.model"), b"x")
    assert raised.value.filename == "/proc/x.model", raised.value
