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
sim result directories are under ``cases/MODE-DISPATCH/repeat-R/``.
"""

from __future__ import annotations

import statistics
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from experiments.fidelity_tables import (
    METRICS,
    markdown_table,
    repeats_table,
    seed_orders_text,
)
from policies.results import RunResult
from policies.spec import RunSpec

NO_CHECKPOINTS = 10**9  # live.checkpoint_every: never within a run


@dataclass(slots=True, frozen=True)
class FidelityPlan:
    modes: tuple[str, ...]
    dispatches: tuple[str | None, ...] = (None,)  # None: the spec's own
    profile_dir: Path | None = None  # calibrated into OUT/cost-model
    cost_model_dir: Path | None = None
    overlay_iteration: int = 2  # the iteration of the timeline overlay
    repeats: int = 1  # live runs per case, each with its own sim twin

    def __post_init__(self) -> None:
        if self.repeats < 1:
            raise ValueError(f"repeats must be at least 1, got {self.repeats}")


@dataclass(slots=True)
class Case:
    """One (mode, dispatch): its live runs and, at the same index, each one's sim twin."""

    mode: str
    dispatch: str
    lives: list[RunResult]
    sims: list[RunResult]

    def __post_init__(self) -> None:
        if not self.lives or len(self.lives) != len(self.sims):
            raise ValueError(f"{self.name}: need one sim twin per live run")

    @property
    def name(self) -> str:
        return f"{self.mode}·{self.dispatch}"

    @property
    def live(self) -> RunResult:
        return self.lives[0]

    @property
    def sim(self) -> RunResult:
        return self.sims[0]


# -- comparison (pure) ----------------------------------------------------------------------


def relative_error(live: float | None, sim: float | None) -> float | None:
    """``sim / live - 1``; None where live is zero or either is missing."""
    if live is None or sim is None or live == 0:
        return None
    return sim / live - 1


def lag_counts(samples: pd.DataFrame) -> dict[int, int]:
    """Trained samples per lag (``version_trained - version_prompt``: from the weights the
    prompt KV came from; ``version_start`` in results written before that column)."""
    trained = samples[samples["version_trained"].notna()]
    oldest = trained["version_start"]
    if "version_prompt" in trained:
        oldest = trained["version_prompt"].fillna(oldest)
    lags = (trained["version_trained"] - oldest).astype(int)
    return dict(sorted(Counter(lags.tolist()).items()))


def lag_distance(live: dict[int, int], sim: dict[int, int]) -> float:
    """Total variation distance between two lag distributions (0: equal, 1: disjoint)."""
    n_live, n_sim = sum(live.values()) or 1, sum(sim.values()) or 1
    keys = set(live) | set(sim)
    return 0.5 * sum(abs(live.get(k, 0) / n_live - sim.get(k, 0) / n_sim) for k in keys)


def median_metrics(results: list[RunResult]) -> dict[str, float | None]:
    """Each metric of :data:`METRICS` as the median over the runs that report it."""
    out: dict[str, float | None] = {}
    for key in METRICS:
        values = [r.metrics[key] for r in results if r.metrics.get(key) is not None]
        out[key] = float(statistics.median(values)) if values else None
    return out


def paired_errors(lives: list[RunResult], sims: list[RunResult]) -> dict[str, float | None]:
    """Each metric's median over repeats of ``sim_r / live_r - 1``: every live run against
    its own twin (the repeats sample different seeds, so different workloads)."""
    out: dict[str, float | None] = {}
    for key in METRICS:
        errors = [
            relative_error(a.metrics.get(key), b.metrics.get(key)) for a, b in zip(lives, sims)
        ]
        known = [e for e in errors if e is not None]
        out[key] = float(statistics.median(known)) if known else None
    return out


def pooled_lag_counts(results: list[RunResult]) -> dict[int, int]:
    total: Counter[int] = Counter()
    for r in results:
        total.update(lag_counts(r.samples_frame()))
    return dict(sorted(total.items()))


def compare_case(
    mode: str,
    dispatch: str,
    live: dict,
    sim: dict,
    live_lags: dict,
    sim_lags: dict,
    errors: dict[str, float | None] | None = None,
) -> list[dict]:
    """One row per metric of :data:`METRICS` (error: ``errors[key]`` if given, else from
    ``live`` and ``sim``), plus the lag distributions' distance."""
    if errors is None:
        errors = {key: relative_error(live.get(key), sim.get(key)) for key in METRICS}
    rows = [
        {"mode": mode, "dispatch": dispatch, "metric": key, "live": live.get(key),
         "sim": sim.get(key), "rel_error": errors[key]}
        for key in METRICS
    ]  # fmt: skip
    rows.append(
        {"mode": mode, "dispatch": dispatch, "metric": "lag_tv_distance", "live": None,
         "sim": None, "rel_error": lag_distance(live_lags, sim_lags)}
    )  # fmt: skip
    return rows


def ranking(frame: pd.DataFrame, column: str, dispatch: str) -> list[str]:
    """Modes by throughput (highest first) for one dispatch policy."""
    rows = frame[(frame["metric"] == "throughput_samples_per_s") & (frame["dispatch"] == dispatch)]
    return list(rows.sort_values(column, ascending=False, kind="stable")["mode"])


@dataclass(slots=True)
class Summary:
    median_abs_throughput_error: float
    max_abs_throughput_error: float
    rankings: dict[str, tuple[list[str], list[str]]] = field(default_factory=dict)  # live, sim

    @property
    def rankings_match(self) -> bool:
        return all(live == sim for live, sim in self.rankings.values())

    def passes(self, median_bound: float = 0.10, max_bound: float = 0.20) -> bool:
        return (
            self.median_abs_throughput_error <= median_bound
            and self.max_abs_throughput_error <= max_bound
            and self.rankings_match
        )


def summarise(frame: pd.DataFrame) -> Summary:
    errors = frame.loc[frame["metric"] == "throughput_samples_per_s", "rel_error"].abs()
    rankings = {
        d: (ranking(frame, "live", d), ranking(frame, "sim", d))
        for d in dict.fromkeys(frame["dispatch"])
    }
    return Summary(float(statistics.median(errors)), float(errors.max()), rankings)


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


def repeat_frame(cases: list[Case]) -> pd.DataFrame:
    """Every live run's throughput next to its own twin's, one row per repeat."""
    key = "throughput_samples_per_s"
    rows = [
        {"mode": c.mode, "dispatch": c.dispatch, "repeat": r, "seed": live.spec.run.seed,
         "live": live.metrics[key], "sim": sim.metrics[key],
         "rel_error": relative_error(live.metrics[key], sim.metrics[key])}
        for c in cases
        for r, (live, sim) in enumerate(zip(c.lives, c.sims))
    ]  # fmt: skip
    return pd.DataFrame(rows)


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
    from sim.simulator import Simulation

    trace_path = case_dir / "trace.parquet"
    trace_of(live.samples_frame()).to_parquet(trace_path, index=False)
    result = Simulation(sim_spec_for(live.spec, trace_path, cost_model_dir)).run()
    result.save(case_dir / "sim")
    return result


# -- orchestration ------------------------------------------------------------------------


def case_spec(
    base: RunSpec, mode: str, dispatch: str | None, url: str, token: str, repeat: int = 0
) -> RunSpec:
    data = base.model_dump(mode="json")
    data["run"]["seed"] = base.run.seed + repeat
    data["pipeline"]["mode"] = mode
    if dispatch is not None:
        data["policies"]["dispatch"] = dispatch
    data["live"] |= {"server_urls": [url], "token": token, "checkpoint_every": NO_CHECKPOINTS}
    return RunSpec.model_validate(data)


def _cost_model(plan: FidelityPlan, out: Path, console) -> Path:
    if plan.cost_model_dir is not None:
        return plan.cost_model_dir
    from experiments.calibrate import calibrate

    assert plan.profile_dir is not None
    target = out / "cost-model"
    fits = calibrate(plan.profile_dir, target)
    if console is not None:
        for name, c in fits.items():
            console.print(
                f"{name:>16}: {'+'.join(c.fit.bases):<16} held-out MAPE {c.fit.heldout_mape:.1%}"
            )
    return target


def run_fidelity(base: RunSpec, plan: FidelityPlan, out: Path, console=None) -> FidelityReport:
    """Every (mode, dispatch) live on one shared server, then its sim twin; write the report."""
    import secrets

    from runtime.launcher import model_dir_for, run_live
    from runtime.procs import free_port, split_cores, start_server, stop_server, wait_healthy
    from runtime.profile_bursts import warm_up_server

    if base.live.num_servers != 1 or base.live.server_urls:
        raise ValueError("tandem fidelity starts one server itself: live.num_servers must be 1")
    out.mkdir(parents=True, exist_ok=True)
    cost_dir = _cost_model(plan, out, console)
    token, live = secrets.token_hex(8), base.live
    server = start_server(
        0, model_dir_for(base), "127.0.0.1", free_port(), token, split_cores(1)[0],
        live.kv_cache_gib, live.max_model_len, base.cluster.generation[0].max_num_seqs,
        out / "logs",
    )  # fmt: skip
    cases: dict[tuple[str, str], Case] = {}
    try:
        wait_healthy(server, live.startup_timeout_s)
        warm_up_server(server.base_url, base)  # as the profile did: no case runs cold
        for repeat in range(plan.repeats):  # outermost: drift spreads over every case
            for mode in plan.modes:
                for dispatch in plan.dispatches:
                    spec = case_spec(base, mode, dispatch, server.base_url, token, repeat)
                    name = f"{mode}-{spec.policies.dispatch}"
                    case_dir = out / "cases" / name / f"repeat-{repeat}"
                    live_result = run_live(spec, case_dir / "live")
                    sim_result = simulate_twin(live_result, case_dir, cost_dir)
                    key = (mode, spec.policies.dispatch)
                    if key in cases:
                        cases[key].lives.append(live_result)
                        cases[key].sims.append(sim_result)
                    else:
                        cases[key] = Case(mode, key[1], [live_result], [sim_result])
                    if console is not None:
                        _print_run(console, name, repeat, live_result, sim_result)
    finally:
        stop_server(server)
    return write_report(list(cases.values()), out, plan.overlay_iteration)


def load_cases(out: Path) -> list[Case]:
    """The cases a :func:`run_fidelity` wrote under ``out/cases`` (to report them again)."""
    cases: dict[tuple[str, str], Case] = {}
    runs = list((out / "cases").glob("*/repeat-*"))
    if not runs:
        raise ValueError(f"{out}: no cases/*/repeat-*/ directories (not a fidelity report)")
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
    from experiments.fidelity_plots import bars, lag_histograms, timeline_overlay

    report = build_report(cases)
    report.frame.to_csv(out / "fidelity.csv", index=False)
    report.repeats.to_csv(out / "repeats.csv", index=False)
    (out / "fidelity.md").write_text(report.markdown())
    bars(report.frame, out / "bars.png")
    lag_histograms(cases, out / "lags.png")
    timeline_overlay(cases[0], overlay_iteration, out / "timeline-overlay.png")
    return report
