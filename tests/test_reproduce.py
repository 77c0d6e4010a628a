"""``tandem reproduce``: the --quick reports regenerate, agree with their data, and show the
orderings issue 6 accepts (never exact numbers: the simulator's may shift slightly)."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pandas as pd
import pytest

from experiments.reproduce import reproduce

TABLE_TAG = re.compile(r"<!-- table: (\S+\.csv) -->")


@pytest.fixture(scope="module")
def streamrl(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("streamrl")
    reproduce("streamrl", out, quick=True, workers=2)
    return out


@pytest.fixture(scope="module")
def pipelinerl(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("pipelinerl")
    reproduce("pipelinerl", out, quick=True, workers=2)
    return out


def read_tables(report: str) -> dict[str, list[list[str]]]:
    """Each tagged markdown table: its header row and body rows, as cell strings."""
    tables: dict[str, list[list[str]]] = {}
    lines = report.splitlines()
    for i, line in enumerate(lines):
        match = TABLE_TAG.fullmatch(line.strip())
        if not match:
            continue
        rows = []
        for row in lines[i + 1 :]:
            if not row.startswith("|"):
                break
            cells = re.split(r"(?<!\\)\|", row.strip())[1:-1]
            rows.append([c.strip().replace("\\|", "|") for c in cells])
        tables[match.group(1)] = [rows[0], *rows[2:]]  # drop the |---| rule
    return tables


def same_cell(text: str, value: object) -> bool:
    if text == "—":
        return value is None or (isinstance(value, float) and math.isnan(value))
    if isinstance(value, bool) or not isinstance(value, int | float):
        return text == str(value)
    return math.isclose(float(text), float(value), rel_tol=1e-3, abs_tol=1e-9)


def check_report(out: Path) -> None:
    report = (out / "report.md").read_text()
    tables = read_tables(report)
    assert tables, "the report has no tagged tables"
    for name, rows in tables.items():
        frame = pd.read_csv(out / name, keep_default_na=True)
        header, body = rows[0], rows[1:]
        assert header == list(frame.columns), name
        assert len(body) == len(frame), name
        for row, record in zip(body, frame.itertuples(index=False)):
            for text, value in zip(row, record):
                assert same_cell(text, value), f"{name}: {text!r} != {value!r}"
    for png in re.findall(r"!\[[^\]]*\]\(([^)]+\.png)\)", report):
        assert (out / png).stat().st_size > 10_000, png
        assert (out / png.replace(".png", ".csv")).exists(), f"no figure data for {png}"


def test_streamrl_report_matches_its_figure_data(streamrl: Path) -> None:
    check_report(streamrl)


def test_pipelinerl_report_matches_its_figure_data(pipelinerl: Path) -> None:
    check_report(pipelinerl)


def test_stream_async_beats_stream_sync_beats_colocated(streamrl: Path) -> None:
    e2e = pd.read_csv(streamrl / "e2e_throughput.csv")
    for (model, length), cell in e2e.groupby(["model", "max_output_tokens"]):
        thr = cell.set_index("system")["throughput_samples_per_s"]
        colocated = max(thr["colocated (verl-like)"], thr["colocated + skewness-aware"])
        assert thr["stream-async"] > thr["stream-sync"] > colocated, (model, length)
    assert e2e.groupby(["model", "max_output_tokens"]).ngroups == 9


def test_cross_dc_heterogeneous_is_more_cost_effective(streamrl: Path) -> None:
    cost = pd.read_csv(streamrl / "cross_dc_cost.csv")
    wide = cost.pivot_table(
        index="max_output_tokens", columns="setup", values="cost_normalized_throughput"
    )
    assert (wide["heterogeneous cross-DC"] > wide["single-DC H800"]).all()


def test_balanced_beats_even_split(streamrl: Path) -> None:
    alloc = pd.read_csv(streamrl / "allocation.csv")
    wide = alloc.pivot_table(
        index=["model", "max_output_tokens"],
        columns="allocation",
        values="throughput_samples_per_s",
    )
    # Alg. 1 splits by its stage model, an estimate. Its generation time counts the prefill
    # and the batch's longest request (whose instance finishes last), so at 32B / 5K it picks
    # the even 32/32 (it picked 30/34, 0.985× in --quick). At 72B / 5K it picks 60/68 for the
    # even 64/64: 1.011× over 10 iterations, but 0.998× over --quick's 2, whose first
    # iteration trains without overlap and so favours the trainer.
    assert (wide["balanced"] >= wide["even split"] * 0.998).all()
    assert (wide["balanced"] > wide["even split"] * 1.01).any()


def test_elastic_adds_instances_and_bounds_delta(streamrl: Path) -> None:
    el = pd.read_csv(streamrl / "elastic.csv")
    instances = list(el["instances_elastic"])
    assert instances == sorted(instances) and instances[-1] > instances[0]
    assert list(el["max_output_tokens"]) == sorted(el["max_output_tokens"])
    assert el["delta_elastic_s"].abs().max() <= el["delta_fixed_s"].abs().max()
    assert abs(el["delta_elastic_s"].iloc[-1]) < abs(el["delta_fixed_s"].iloc[-1])


def test_pipeline_beats_conventional_at_comparable_lag(pipelinerl: Path) -> None:
    lag = pd.read_csv(pipelinerl / "lag_sweep.csv")
    g = lag["G"].max()  # the paper's G = 32: max_lag = G - 1 for both systems
    cell = lag[lag["G"] == g].set_index("system")
    assert cell.loc["pipeline", "sim_samples_per_s"] > cell.loc["conventional", "sim_samples_per_s"]
    assert cell.loc["conventional", "max_lag"] == g - 1  # recorded by the conventional mode
    assert cell.loc["pipeline", "max_lag"] <= g - 1
    split = pd.read_csv(pipelinerl / "gpu_split.csv").set_index(["gen_gpus", "line"])
    assert (
        split.loc[(48, "pipeline, sim"), "samples_per_s"]
        > split.loc[(48, "conventional, sim"), "samples_per_s"]
    )


def test_conventional_lags_are_recorded_per_step(pipelinerl: Path) -> None:
    """The j-th of G optimizer steps trains samples j versions stale: lags 0..G-1, equal shares."""
    dist = pd.read_csv(pipelinerl / "lag_distribution.csv")
    conv = dist[dist["system"].str.startswith("conventional")]
    g = pd.read_csv(pipelinerl / "lag_sweep.csv")["G"].max()
    assert list(conv["lag"]) == list(range(g))
    assert conv["share"].to_numpy() == pytest.approx(1 / g)
