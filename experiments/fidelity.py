"""``tandem fidelity``: the same spec live and in the calibrated simulator, compared.

For each (pipeline mode, dispatch policy) the spec runs live (:func:`runtime.launcher.
run_live`, on one generation server shared by every case, checkpoints off since the sim
does not model them) and then in the simulator with the calibrated cost model, replaying
the live run's lengths: a ``trace`` workload whose prompt ``k`` is the live run's ``k``-th
group (its prompt tokens and output lengths, in order), so both runs see the same
samples in the same iterations.

With ``repeats`` > 1 every case runs that many times live (seeds ``run.seed + r``, the
repeats interleaved across cases so drift on the machine spreads over all of them), each
with its own twin; a case's live and sim figures are the medians over its repeats, its
error the median of the repeats' own errors (each live run against the twin that replayed
it), and ``repeats.csv`` keeps every run's throughput.

Writes ``fidelity.csv`` (one row per case and metric: live, sim, relative error
``sim / live - 1``), ``fidelity.md`` (the table, the throughput summary, the ranking
of modes and every run's throughput), ``repeats.csv``, ``bars.png``, ``lags.png`` and ``timeline-overlay.png``; each case's live and
sim result directories are under ``cases/MODE-DISPATCH/repeat-R/``, with the key of the run
they belong to (``fidelity-run.json``): a run refuses an ``--out`` holding another run's
cases, and a report refuses cases of different runs.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from experiments.fidelity_compare import (
    Case,
    Summary,
    compare_case,
    median_metrics,
    paired_errors,
    pooled_lag_counts,
    repeat_frame,
    summarise,
)
from experiments.fidelity_plan import (
    FidelityPlan,
    case_spec,
    check_fidelity,
    check_one_run,
    mark_case,
)
from experiments.fidelity_plots import bars, lag_histograms, overlay_iteration_of, timeline_overlay
from experiments.fidelity_tables import markdown_table, repeats_table, seed_orders_text
from policies.logs import run_log
from policies.results import RunResult
from policies.spec import RunSpec

log = logging.getLogger(__name__)


# -- the report ----------------------------------------------------------------------------


@dataclass(slots=True)
class FidelityReport:
    frame: pd.DataFrame
    summary: Summary
    repeats: pd.DataFrame

    def markdown(self) -> str:
        return (
            markdown_table(self.frame, self.summary)
            + seed_orders_text(self.repeats)
            + repeats_table(self.repeats)
        )


def build_report(cases: list[Case]) -> FidelityReport:
    rows = []
    for c in cases:
        rows += compare_case(
            c.mode, c.dispatch, median_metrics(c.lives), median_metrics(c.sims),
            pooled_lag_counts(c.lives), pooled_lag_counts(c.sims), paired_errors(c.lives, c.sims),
        )  # fmt: skip
    frame = pd.DataFrame(rows)
    return FidelityReport(frame, summarise(frame), repeat_frame(cases))


# -- the sim twin of a live run --------------------------------------------------------------


def trace_of(samples: pd.DataFrame) -> pd.DataFrame:
    """The live run's samples as a trace: prompt ``k`` is its ``k``-th group, in order."""
    ordered = samples.sort_values(["group_id", "sample_id"])
    return pd.DataFrame(
        {
            "prompt_id": ordered["group_id"].astype(int),
            "prompt_tokens": ordered["prompt_tokens"].astype(int),
            "output_tokens": ordered["output_tokens"].astype(int),
        }
    )


def sim_spec_for(live_spec: RunSpec, trace_path: Path, cost_model_dir: Path) -> RunSpec:
    data = live_spec.model_dump(mode="json")
    data["workload"] |= {"kind": "trace", "trace_path": str(trace_path)}
    data["workload"]["final_max_output_tokens"] = None
    data["sim"]["cost_model"] = f"profiled:{cost_model_dir}"
    # the twin's trainer takes the micro-batches the live trainer took (the sim sizes them
    # per trainer GPU; live they are live.micro_batch_samples)
    gpus = live_spec.cluster.trainer.num_gpus
    data["algorithm"]["micro_batch_per_gpu"] = -(-live_spec.live.micro_batch_samples // gpus)
    return RunSpec.model_validate(data)


def simulate_twin(live: RunResult, case_dir: Path, cost_model_dir: Path) -> RunResult:
    """The calibrated sim replaying ``live``'s lengths, with the spec's ranker (a ranker
    file is checked before the live run: :func:`check_fidelity`)."""
    from experiments.runs import simulate

    trace_path = case_dir / "trace.parquet"
    trace_of(live.samples_frame()).to_parquet(trace_path, index=False)
    spec = sim_spec_for(live.spec, trace_path, cost_model_dir)
    with run_log(case_dir / "sim"):
        result = simulate(spec)
        result.save(case_dir / "sim")
    return result


# -- orchestration ------------------------------------------------------------------------


def _cost_model(plan: FidelityPlan, out: Path, console) -> Path:
    if plan.cost_model_dir is not None:
        return plan.cost_model_dir
    from experiments.calibrate import calibrate

    assert plan.profile_dir is not None
    target = out / "cost-model"
    note = None if console is None else lambda text: console.print(f"note: {text}", markup=False)
    fits = calibrate(plan.profile_dir, target, note)
    if console is not None:
        for name, c in fits.items():
            console.print(
                f"{name:>16}: {'+'.join(c.fit.bases):<16} held-out MAPE {c.fit.heldout_mape:.1%}"
            )
    return target


def run_fidelity(
    base: RunSpec, plan: FidelityPlan, out: Path, console=None, on_step=None
) -> FidelityReport:
    """Every (mode, dispatch) live on one shared server, then its sim twin; write the report.
    ``on_step`` hears of every step of every live run (progress). Every case's spec, the
    cost model and ``out`` are checked before the server starts."""
    import secrets

    from runtime.live_run import model_dir_for
    from runtime.procs import free_port, split_cores, start_server, stop_server, wait_healthy
    from runtime.profile_bursts import warm_up_server

    key = check_fidelity(base, plan, out)
    out.mkdir(parents=True, exist_ok=True)
    cost_dir = _cost_model(plan, out, console)
    token, live = secrets.token_hex(8), base.live
    server = start_server(
        0, model_dir_for(base), "127.0.0.1", free_port(), token, split_cores(1)[0],
        live.kv_cache_gib, live.max_model_len, base.cluster.generation[0].max_num_seqs,
        out / "logs",
    )  # fmt: skip
    try:
        wait_healthy(server, live.startup_timeout_s)
        warm_up_server(server.base_url, base)  # as the profile did: no case runs cold
        cases = _run_cases(base, plan, out, _Target(server.base_url, token, cost_dir, key),
                           console, on_step)  # fmt: skip
    finally:
        stop_server(server)
    return write_report(cases, out, plan.overlay_iteration)


@dataclass(slots=True, frozen=True)
class _Target:
    """Where the cases run: the shared server, the cost model, the run they belong to."""

    url: str
    token: str
    cost_dir: Path
    run_key: str


def _run_cases(
    base: RunSpec, plan: FidelityPlan, out: Path, target: _Target, console, on_step
) -> list[Case]:
    cases: dict[tuple[str, str], Case] = {}
    for repeat in range(plan.repeats):  # outermost: drift spreads over every case
        for mode in plan.modes:
            for dispatch in plan.dispatches:
                spec = case_spec(
                    base, mode, dispatch, target.url, target.token, repeat, target.cost_dir
                )
                name = f"{mode}-{spec.policies.dispatch}"
                case_dir = out / "cases" / name / f"repeat-{repeat}"
                log.info("case %s, repeat %d/%d", name, repeat + 1, plan.repeats)
                mark_case(case_dir, target.run_key)
                live_result, sim_result = run_case(spec, case_dir, target.cost_dir, on_step)
                key = (mode, spec.policies.dispatch)
                if key in cases:
                    cases[key].lives.append(live_result)
                    cases[key].sims.append(sim_result)
                else:
                    cases[key] = Case(mode, key[1], [live_result], [sim_result])
                if console is not None:
                    _print_run(console, name, repeat, live_result, sim_result)
    return list(cases.values())


def run_case(
    spec: RunSpec, case_dir: Path, cost_model_dir: Path, on_step=None
) -> tuple[RunResult, RunResult]:
    """One live run of a case (under ``case_dir/live``), then its sim twin."""
    from experiments.runs import run_live_ranked

    live = run_live_ranked(spec, case_dir / "live", on_step)
    return live, simulate_twin(live, case_dir, cost_model_dir)


def load_cases(out: Path) -> list[Case]:
    """The cases a :func:`run_fidelity` wrote under ``out/cases`` (to report them again)."""
    cases: dict[tuple[str, str], Case] = {}
    runs = list((out / "cases").glob("*/repeat-*"))
    if not runs and (out / "fidelity.csv").is_file():  # a report shipped without its runs
        raise ValueError(
            f"{out}: a fidelity report without its saved runs (no cases/*/repeat-*/; the "
            "reports in docs/reports ship without them): run tandem fidelity again, "
            "without --report-only"
        )
    if not runs:
        raise ValueError(f"{out}: no cases/*/repeat-*/ directories (not a fidelity report)")
    check_one_run(runs, out)
    # in the order they ran: by repeat, then by when each live run finished
    order = {d: (int(d.name.removeprefix("repeat-")), (d / "live" / "metrics.json").stat().st_mtime)
             for d in runs}  # fmt: skip
    for run_dir in sorted(runs, key=order.__getitem__):
        live, sim = RunResult.load(run_dir / "live"), RunResult.load(run_dir / "sim")
        key = (live.spec.pipeline.mode, live.spec.policies.dispatch)
        if key in cases:
            cases[key].lives.append(live)
            cases[key].sims.append(sim)
        else:
            cases[key] = Case(*key, [live], [sim])
    return list(cases.values())


def _print_run(console, name: str, repeat: int, live: RunResult, sim: RunResult) -> None:
    a = live.metrics["throughput_samples_per_s"]
    b = sim.metrics["throughput_samples_per_s"]
    console.print(f"{name} #{repeat}: live {a:.3f} samples/s, sim {b:.3f} ({b / a - 1:+.1%})")


def write_report(cases: list[Case], out: Path, overlay_iteration: int = 2) -> FidelityReport:
    report = build_report(cases)
    report.frame.to_csv(out / "fidelity.csv", index=False)
    report.repeats.to_csv(out / "repeats.csv", index=False)
    (out / "fidelity.md").write_text(report.markdown())
    bars(report.frame, out / "bars.png")
    lag_histograms(cases, out / "lags.png")
    iteration = overlay_iteration_of(cases[0], overlay_iteration)
    if iteration is None:  # an empty plot says nothing: leave it out, and say so
        log.warning("no timeline-overlay.png: %s has no iteration in both runs", cases[0].name)
        (out / "timeline-overlay.png").unlink(missing_ok=True)
    else:
        timeline_overlay(cases[0], iteration, out / "timeline-overlay.png", overlay_iteration)
    return report
