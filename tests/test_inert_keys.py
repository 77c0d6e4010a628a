"""Keys that do nothing in a run are warned about, one line a key, once; a key at its
default never is (a saved spec.yaml holds every key). And a trainer that fits only with
its optimizer offloaded is warned about once by ``tandem run``, not twice."""

from __future__ import annotations

import logging

import pytest
from helpers import small_spec

from experiments import cli
from experiments.cli import main
from experiments.sweep_point import check_point_specs
from policies.inert_keys import inert_keys
from sim.cluster import check_sim_run

ELASTIC = {"policies__allocation": "elastic"}


def _flat(text: str) -> str:
    return " ".join(text.split())


@pytest.fixture(autouse=True)
def _wide_console(monkeypatch):
    """Rich wraps at 80 columns when not on a terminal; keep messages on one line."""
    monkeypatch.setattr(cli.err_console, "width", 400)


@pytest.mark.parametrize(
    ("overrides", "line"),
    [
        ({"policies__elastic__max_extra_instances": 8},
         "policies.elastic.max_extra_instances=8 has no effect: policies.allocation is 'fixed'"),
        ({"policies__elastic__gpus_per_step": 4},
         "policies.elastic.gpus_per_step=4 has no effect: policies.allocation is 'fixed'"),
        ({"policies__elastic__retire": True, "policies__allocation": "balanced"},
         "policies.elastic.retire=true has no effect: policies.allocation is 'balanced'"),
        ({"sim__instance_start_s": 10.0},  # seen: warned of policies.elastic.*, not of it
         "sim.instance_start_s=10.0 has no effect: policies.allocation is 'fixed'"),
        ({"policies__predictor_recall": 0.5},
         "policies.predictor_recall=0.5 has no effect: policies.length_predictor is 'oracle'"),
        ({"policies__predictor_recall": 0.5, "policies__length_predictor": "none",
          "policies__dispatch": "least-loaded"},
         "policies.predictor_recall=0.5 has no effect: policies.length_predictor is 'none'"),
        ({"policies__dispatch": "least-loaded", "policies__dispatch_objective": "max"},
         "policies.dispatch_objective=max has no effect: policies.dispatch is 'least-loaded'"),
        ({"policies__dispatch": "round-robin", "policies__long_tail_fraction": 0.1},
         "policies.long_tail_fraction=0.1 has no effect: policies.dispatch is 'round-robin'"),
        ({"policies__dispatch": "random", "policies__scheduling": "fcfs",
          "cluster__generation__0__scheduling_policy": "fcfs",
          "policies__length_predictor": "noisy-oracle"},
         "policies.length_predictor=noisy-oracle has no effect: policies.dispatch 'random' and "
         "policies.scheduling 'fcfs' read no predicted lengths"),
        ({"workload__kind": "histogram", "workload__lognormal_median_tokens": 1500.0,
          "workload__lognormal_sigma": 1.2},
         "workload.lognormal_sigma=1.2 has no effect: workload.kind is 'histogram'"),
        ({"workload__pareto_alpha": 2.0},
         "workload.pareto_alpha=2.0 has no effect: workload.kind is 'lognormal'"),
        ({"workload__trace_path": "lengths.csv"},
         "workload.trace_path=lengths.csv has no effect: workload.kind is 'lognormal'"),
    ],
)  # fmt: skip
def test_each_inert_key_is_one_line_naming_its_value_and_why(overrides, line):
    assert inert_keys(small_spec(**overrides)) == [line]


@pytest.mark.parametrize(
    "overrides",
    [
        {},  # every key at its default
        {**ELASTIC, "policies__elastic__max_extra_instances": 8, "policies__elastic__retire": True,
         "sim__instance_start_s": 10.0},
        {"policies__length_predictor": "noisy-oracle", "policies__predictor_recall": 0.5},
        {"policies__dispatch_objective": "max", "policies__long_tail_fraction": 0.1},
        {"policies__dispatch": "random", "policies__length_predictor": "noisy-oracle"},  # lpt
        {"policies__dispatch": "least-loaded", "policies__scheduling": "fcfs",
         "cluster__generation__0__scheduling_policy": "fcfs",
         "policies__length_predictor": "noisy-oracle"},
        {"workload__kind": "pareto", "workload__pareto_alpha": 2.0,
         "workload__lognormal_median_tokens": 1500.0},
    ],
)  # fmt: skip
def test_keys_that_are_read_or_at_their_default_are_not_reported(overrides):
    assert inert_keys(small_spec(**overrides)) == []


def test_a_live_run_is_not_told_about_the_simulators_workload_keys():
    spec = small_spec(workload__pareto_alpha=2.0, policies__predictor_recall=0.5)
    assert inert_keys(spec) == [
        "policies.predictor_recall=0.5 has no effect: policies.length_predictor is 'oracle'",
        "workload.pareto_alpha=2.0 has no effect: workload.kind is 'lognormal'",
    ]
    assert inert_keys(spec, live=True) == [
        "policies.predictor_recall=0.5 has no effect: policies.length_predictor is 'oracle'"
    ]


def test_a_simulated_run_is_not_told_about_live_keys():
    spec = small_spec(live__max_model_len=1024, workload__tasks="longtail")
    assert inert_keys(spec) == []


def test_a_live_run_attached_to_its_servers_is_told_num_servers_does_nothing():
    """Before: ``num_servers: 2`` with one URL ran one server, saying nothing."""
    spec = small_spec(live__num_servers=2, live__server_urls=["http://127.0.0.1:8400"])
    assert inert_keys(spec, live=True) == [
        "live.num_servers=2 has no effect: live.server_urls is set: the run attaches to its "
        "1 server(s), starts none"
    ]
    assert inert_keys(spec) == []  # live.* keys are not reported in a simulated run
    attached = small_spec(live__server_urls=["http://127.0.0.1:8400"])
    assert inert_keys(attached, live=True) == []  # num_servers at its default
    assert inert_keys(small_spec(live__num_servers=2), live=True) == []


def test_tandem_run_warns_once_a_key_and_its_saved_spec_runs_again_without_a_word(tmp_path, capsys):
    spec = small_spec(policies__elastic__max_extra_instances=8, policies__predictor_recall=0.5)
    path = tmp_path / "spec.yaml"
    path.write_text(spec.to_yaml())
    assert main(["run", str(path), "--out", str(tmp_path / "first")]) == 0
    err = _flat(capsys.readouterr().err)
    assert err.count("has no effect") == 2
    assert err.count("policies.elastic.max_extra_instances=8 has no effect") == 1
    assert "policies.predictor_recall=0.5 has no effect" in err
    assert "has no effect" in (tmp_path / "first" / "run.log").read_text()
    # the saved spec holds every key; with the inert ones back at their defaults, nothing
    clean = small_spec(policies__length_predictor="noisy-oracle", policies__predictor_recall=0.5)
    path.write_text(clean.to_yaml())
    assert main(["run", str(path), "--out", str(tmp_path / "clean")]) == 0
    saved = tmp_path / "clean" / "spec.yaml"
    capsys.readouterr()
    assert main(["run", str(saved), "--out", str(tmp_path / "again")]) == 0
    assert "has no effect" not in capsys.readouterr().err
    assert saved.read_text() == (tmp_path / "again" / "spec.yaml").read_text()


def test_a_sweep_reports_an_inert_key_once_for_all_its_points(caplog):
    base = small_spec(policies__predictor_recall=0.5)
    points = [{"run.seed": s} for s in range(3)]
    with caplog.at_level(logging.WARNING):
        check_point_specs(base, points)
    assert caplog.text.count("policies.predictor_recall=0.5 has no effect") == 1


def test_check_sim_run_returns_the_offload_warning_and_logs_nothing(caplog):
    spec = small_spec(cluster__trainer__num_gpus=1)  # 7B: 30 GB on the GPU, 122 GB in all
    with caplog.at_level("WARNING"):
        warnings = check_sim_run(spec)
    assert caplog.text == ""
    assert len(warnings) == 1
    assert "only with the optimizer offloaded" in warnings[0] and "2 hold it all" in warnings[0]
    assert check_sim_run(small_spec()) == []


def test_tandem_run_prints_the_offload_warning_once(tmp_path, capsys):
    """Before: once from the check before the run directory was made, once from the run."""
    path = tmp_path / "spec.yaml"
    path.write_text(small_spec(cluster__trainer__num_gpus=1).to_yaml())
    assert main(["run", str(path), "--out", str(tmp_path / "run")]) == 0
    err = _flat(capsys.readouterr().err)
    assert err.count("only with the optimizer offloaded") == 1
    assert "only with the optimizer offloaded" in (tmp_path / "run" / "run.log").read_text()


def test_a_sweep_still_reports_the_offload_warning_once(caplog):
    base = small_spec(cluster__trainer__num_gpus=1)
    with caplog.at_level(logging.WARNING):
        check_point_specs(base, [{"run.seed": s} for s in range(3)])
    assert caplog.text.count("only with the optimizer offloaded") == 1


def test_a_pool_whose_tp_spans_machines_is_warned_about_once(tmp_path, capsys):
    """Seen: ``streamrl-72b --set cluster.generation.0.tp=16`` (two 8-GPU machines an
    instance, no tensor-parallel communication priced) ran without a word."""
    spec = small_spec(
        model__name="Qwen2.5-72B", cluster__generation__0__num_gpus=16,
        cluster__generation__0__tp=16, cluster__trainer__num_gpus=16,
    )  # fmt: skip
    warnings = check_sim_run(spec)
    assert [w for w in warnings if "cluster.generation.0.tp: 16 spans more than one" in w]
    assert not [w for w in check_sim_run(small_spec()) if "spans more than one" in w]
    path = tmp_path / "spec.yaml"
    path.write_text(spec.to_yaml())
    assert main(["run", str(path), "--set", "run.iterations=1", "--out", str(tmp_path / "r")]) == 0
    assert _flat(capsys.readouterr().err).count("spans more than one 8-GPU machine") == 1
