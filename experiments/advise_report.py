"""Writing an :class:`experiments.advise.Advice`: the spec files, the tables, the figure, and
``advice.md`` (the choice against the input spec, from the runs the search made)."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pandas as pd

from experiments.advise import Advice, Change, Unpriced
from experiments.advise_partial import AdviceStatus, PartialAdvice
from experiments.advise_search import SearchResult
from experiments.advise_space import Candidate, predictor_read
from policies.results import COST_NORMALIZED_UNIT, write_atomic

STATUS_FILE = "status.json"  # complete or partial (AdviceStatus)
LIVE_CHECK_FILES = ("live-check.csv", "live-check.md")
OBJECTIVE_COLUMN = {
    "throughput": "throughput_samples_per_s",
    "cost-normalized": "cost_normalized_throughput",
}


def write_advice(advice: Advice, out: Path) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    write_atomic(out / STATUS_FILE, status_record(AdviceStatus.PARTIAL, advice))  # until the last
    write_atomic(out / "input.yaml", advice.space.base.to_yaml().encode())
    write_atomic(out / "best.yaml", advice.best_spec.to_yaml().encode())
    runs = evaluations_frame(advice)
    write_atomic(out / "evaluations.csv", runs.to_csv(index=False).encode())
    front = pareto_front(full_runs(runs))
    write_atomic(out / "pareto.csv", front.to_csv(index=False).encode())
    pareto_plot(full_runs(runs, with_input=True), front, advice, out / "pareto.png")
    write_atomic(out / "advice.md", advice_markdown(advice, full_runs(runs)).encode())
    write_atomic(out / STATUS_FILE, status_record(AdviceStatus.COMPLETE, advice))
    return out


def status_record(status: AdviceStatus, advice: Advice | PartialAdvice) -> bytes:
    record = {"status": status.value, "num_simulations": len(advice.evaluations),
              "wall_s": round(advice.wall_s, 1), "budget_s": advice.budget_s}  # fmt: skip
    return json.dumps(record, indent=2).encode()


def evaluations_frame(advice: Advice | PartialAdvice) -> pd.DataFrame:
    """Every simulation: configuration, kind (short / full), figures."""
    full = advice.space.base.run.iterations
    rows = []
    for e in advice.evaluations:
        s = e.candidate.structure
        rows.append({
            "kind": "full" if e.iterations >= full else "short",
            **e.candidate.columns(advice.space.inventory),
            "staleness_bound": s.staleness_bound,
            "gpus": s.num_gpus,
            "iterations": e.iterations,
            "objective_value": e.value(advice.objective, full),
            **e.metrics,
            "wall_s": round(e.wall_s, 3),
            "error": e.error,
            "is_input": e.candidate == advice.space.input,
            "is_best": e.candidate == advice.best,
            "in_space": advice.space.bounds.admits(e.candidate),
        })  # fmt: skip
    return pd.DataFrame(rows)


def full_runs(runs: pd.DataFrame, with_input: bool = False) -> pd.DataFrame:
    """The full runs inside the space (a pricing run outside it is in evaluations.csv only),
    and with ``with_input`` the input spec's wherever it lies."""
    shown = runs["in_space"] | (runs["is_input"] & with_input)
    ok = runs[(runs["kind"] == "full") & runs["error"].isna() & shown]
    return ok.drop_duplicates(subset=[c for c in ok.columns if c in _CONFIG], keep="first")


_CONFIG = (
    "mode", "lag", "tp", "placement", "max_num_seqs", "dispatch", "scheduling", "predictor",
)  # fmt: skip


def pareto_front(frame: pd.DataFrame) -> pd.DataFrame:
    """Full runs no other full run beats on every one of: throughput, cost-normalized
    throughput (higher), staleness bound, GPUs (lower)."""
    if frame.empty:
        return frame
    cost = frame["cost_normalized_throughput"].fillna(0.0).to_numpy()
    thr = frame["throughput_samples_per_s"].to_numpy()
    stale = frame["staleness_bound"].to_numpy()
    gpus = frame["gpus"].to_numpy()
    keep = []
    for i in range(len(frame)):
        at_least = (thr >= thr[i]) & (cost >= cost[i]) & (stale <= stale[i]) & (gpus <= gpus[i])
        better = (thr > thr[i]) | (cost > cost[i]) | (stale < stale[i]) | (gpus < gpus[i])
        keep.append(not (at_least & better).any())
    cols = ["throughput_samples_per_s", "cost_normalized_throughput", "staleness_bound",
            "max_staleness", "gpus", *_CONFIG, "trainer_gpus", "generation_gpus", "is_input", "is_best"]  # fmt: skip
    front = frame.loc[keep, cols]
    return front.sort_values("throughput_samples_per_s", ascending=False).reset_index(drop=True)


def pareto_plot(runs: pd.DataFrame, front: pd.DataFrame, advice: Advice, path: Path) -> None:
    """Every full run's throughput per mode (columns in order of staleness bound) and, when
    the GPU count varies, against GPUs; the Pareto front circled, input and advice marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    by_gpus = runs["gpus"].nunique() > 1
    fig, axes = plt.subplots(
        1, 2 if by_gpus else 1, figsize=(11 if by_gpus else 7, 4.5), squeeze=False
    )
    runs = runs.assign(variant=runs["mode"] + runs["lag"].map(_lag_suffix))
    order = runs.drop_duplicates("variant").sort_values(["staleness_bound", "variant"])["variant"]
    column = {v: k for k, v in enumerate(order)}
    ax = axes[0][0]
    for _, group in runs.groupby("variant"):
        ax.scatter(group["variant"].map(column), group["throughput_samples_per_s"], s=16, alpha=0.6)
    _overlay(ax, runs.assign(x=runs["variant"].map(column)), front, "x")
    labels = [
        f"{v}\n(stale {int(runs.loc[runs['variant'] == v, 'staleness_bound'].iloc[0])})"
        for v in order
    ]
    ax.set_xticks(range(len(order)), labels, fontsize=7)
    ax.set_ylabel("throughput (samples/s)")
    if by_gpus:
        axes[0][1].scatter(runs["gpus"], runs["throughput_samples_per_s"], s=16, alpha=0.6)
        _overlay(axes[0][1], runs, front, "gpus")
        axes[0][1].set_xlabel("GPUs")
    fig.suptitle(f"tandem advise · {advice.space.base.run.name} · every full run (front circled)")
    buf = io.BytesIO()
    fig.tight_layout()
    fig.savefig(buf, format="png", dpi=110)
    plt.close(fig)
    write_atomic(path, buf.getvalue())


def _overlay(ax: Any, runs: pd.DataFrame, front: pd.DataFrame, x: str) -> None:
    """Circle the runs on the front; mark the input and the advice."""
    on_front = runs.merge(front[list(_CONFIG)], on=list(_CONFIG))
    ax.scatter(
        on_front[x], on_front["throughput_samples_per_s"], s=90, facecolors="none", edgecolors="k"
    )
    for flag, text in (("is_input", "input"), ("is_best", "advice")):
        row = runs[runs[flag]]
        if not row.empty:
            point = (row[x].iloc[0], row["throughput_samples_per_s"].iloc[0])
            ax.annotate(text, point, xytext=(12, -16 if flag == "is_input" else 10),
                        textcoords="offset points", arrowprops={"arrowstyle": "->"})  # fmt: skip


def _lag_suffix(lag: Any) -> str:
    return "" if lag is None or pd.isna(lag) else f":{int(lag)}"


# -- advice.md ---------------------------------------------------------------------------------


def advice_markdown(advice: Advice, runs: pd.DataFrame) -> str:
    lines = [f"# tandem advise · {advice.space.base.run.name}", ""]
    lines += _headline(advice)
    lines += ["", "## What each change buys", ""]
    lines += _changes_table(advice) or ["The advice is the input spec: nothing to change."]
    lines += ["", "## Best full runs", ""]
    lines += top_table(advice.objective, runs)
    lines += ["", "## The search", ""]
    lines += _search_lines(advice)
    lines += ["", "## Caveats", ""]
    lines += _caveats(advice)
    return "\n".join(lines) + "\n"


def fmt(value: float | None) -> str:
    return "—" if value is None else f"{value:.4g}"


def ratio(value: float | None, ref: float | None) -> str:
    if value is None or not ref:
        return "—"
    return f"{value / ref:.3f}×"


def _headline(advice: Advice) -> list[str]:
    inv = advice.space.inventory
    unit = "samples/s" if advice.objective == "throughput" else COST_NORMALIZED_UNIT
    out = [
        f"Objective: **{advice.objective}** ({unit}); staleness at most "
        f"**{advice.space.axes.max_staleness}** step(s); {advice.space.base.run.iterations} "
        f"iterations per full run, seed {advice.space.base.run.seed}.",
        "",
        f"- input: `{advice.space.input.label(inv) if advice.space.input else 'not expressible as a candidate'}` — "
        f"{fmt(advice.input_value)}",
        f"- advice: `{advice.best.label(inv)}` — **{fmt(advice.best_value)}** "
        f"({ratio(advice.best_value, advice.input_value)} the input)",
        "",
        "`best.yaml` is the advice as a complete spec (`tandem run best.yaml`).",
    ]
    out += _unread_predictor_notes(advice)
    out += _incomplete_note(advice)
    if advice.space.input_outside:
        out += ["", "The input spec itself lies outside the constraints (staler than allowed, or a "
                "value no `--axis` lists), so it was run for comparison only."]  # fmt: skip
    out += _outside_note(advice)
    return out


def _outside_note(advice: Advice) -> list[str]:
    """Pricing runs carry the input's values; those outside the space are never the advice."""
    outside = {
        e.candidate for e in advice.evaluations if not advice.space.bounds.admits(e.candidate)
    }
    outside.discard(advice.space.input)
    if not outside:
        return []
    return ["", f"{len(outside)} configuration(s) run to price the changes lie outside the space "
            "(the staleness bound or an `--axis`): they are in `evaluations.csv` "
            "(`in_space` false), never the advice, the Pareto set or the tables here."]  # fmt: skip


def _unread_predictor_notes(advice: Advice) -> list[str]:
    """Where the input spec names a length predictor that the input's or the advice's
    policies never read: that configuration runs (and is shown) with ``none``, the same
    run (``advise_space.canonical``)."""
    given = advice.space.base.policies.length_predictor
    pairs = [("input", advice.space.input)]
    if advice.best != advice.space.input:
        pairs.append(("advice", advice.best))
    out = [
        _unread_note(who, c, given)
        for who, c in pairs
        if c is not None and given != "none" and not predictor_read(c)
    ]
    return ["", *out] if out else []


def _unread_note(who: str, c: Candidate, given: str) -> str:
    p = c.policies
    if c.structure.num_instances == 1:
        readers = f"on its one generation instance dispatch is moot and scheduling `{p.scheduling}`"
        readers += " reads no predicted lengths"
    else:
        readers = f"its dispatch `{p.dispatch}` and scheduling `{p.scheduling}`"
        readers += " read no predicted lengths"
    if who == "input":
        return f"The input's length predictor: {readers}, so it was run, and is shown, with `none` (the same run)."
    return (
        f"The advice's length predictor: {readers}, so it runs with `none`, the same run as "
        f"with the input spec's `{given}`: deployable as it is."
    )


def _incomplete_note(advice: Advice) -> list[str]:
    """A plain warning when the budget ran out before the runs that price the changes."""
    whys = [w for c in advice.changes for w in (c.alone_why, c.reverted_why)]
    unmeasured = whys.count(Unpriced.NO_BUDGET)
    if not unmeasured:
        return []
    return [
        "",
        f"**The explanation of the advice is incomplete: the budget ({advice.budget_s:g} s) "
        f"ran out before {unmeasured} of the {len(whys)} full runs that price its changes** "
        '("What each change buys"). Rerun with a larger `--budget-s` (e.g. '
        f"`--budget-s {4 * advice.budget_s:g}`) to see what each change buys.",
    ]


def _changes_table(advice: Advice) -> list[str]:
    if not advice.changes:
        return []
    head = [
        "Each change priced by full runs from both ends: applied alone to the input spec, "
        "and undone alone on the advice (a cell without a figure says why).",
        "",
        "| dimension | input | advice | input + this change | advice − this change |",
        "|---|---|---|---:|---:|",
    ]
    return head + [_change_row(c, advice) for c in advice.changes]


def _change_row(c: Change, advice: Advice) -> str:
    alone = _priced_cell(c.alone, c.alone_why, advice.input_value)
    reverted = _priced_cell(c.reverted, c.reverted_why, advice.best_value)
    return f"| {c.dimension} | {c.before} | {c.after} | {alone} | {reverted} |"


def _priced_cell(value: float | None, why: Unpriced | None, ref: float | None) -> str:
    if value is None:
        return f"— ({(why or Unpriced.NO_VALUE).value})"
    return f"{fmt(value)} ({ratio(value, ref)})"


def top_table(
    objective: str, runs: pd.DataFrame, n: int = 8, best_tag: str = "advice"
) -> list[str]:
    col = OBJECTIVE_COLUMN[objective]
    top = runs.sort_values([col, "is_best"], ascending=False).head(n)
    out = [
        "| # | configuration | throughput | cost-normalized | staleness bound | GPUs |",
        "|---:|---|---:|---:|---:|---:|",
    ]
    for rank, (_, r) in enumerate(top.iterrows(), 1):
        label = _label(r, best_tag)
        out.append(
            f"| {rank} | {label} | {fmt(r['throughput_samples_per_s'])} | "
            f"{fmt(r['cost_normalized_throughput'])} | {r['staleness_bound']} | {r['gpus']} |"
        )
    return [*out, "", f"Throughput in samples/s; cost-normalized in {COST_NORMALIZED_UNIT}."]


def _label(r: pd.Series, best_tag: str) -> str:
    mode = f"{r['mode']}{_lag_suffix(r['lag'])}"
    tags = " (input)" if r["is_input"] else f" ({best_tag})" if r["is_best"] else ""
    return f"{mode} tp{r['tp']} {r['placement']} seqs{r['max_num_seqs']} {r['dispatch']}/{r['scheduling']}/{r['predictor']}{tags}"


def _search_lines(advice: Advice) -> list[str]:
    r = advice.result
    n = len(r.candidates)
    full_equiv = sum(e.iterations for e in advice.evaluations) / advice.space.base.run.iterations
    stop = ("it ran to its end: no candidate's optimistic value exceeds the best full run"
            if r.finished else f"the budget ({advice.budget_s:g} s) stopped it: a better "
            f"candidate may be among the {r.num_open} not covered")  # fmt: skip
    return [
        f"- space: {n} candidates (equivalent points once; models that do not fit left out)",
        *(f"  - left out: {line}" for line in advice.space.left_out),
        f"- simulations: {r.num_short} short + {r.num_full} full in the search, "
        f"{len(advice.evaluations) - len(r.evaluations)} more pricing the changes "
        f"({full_equiv:.1f} full-run equivalents)",
        f"- covered: {coverage_text(r)} of the space (run in full: {len(r.full_values)}; ruled out by "
        f"their optimistic value: {r.num_ruled_out}); not covered: {r.num_open}",
        f"- stopped because {stop}; wall time {advice.wall_s:.1f} s",
    ]


def coverage_text(r: SearchResult) -> str:
    """The share of the space covered, one decimal, rounded down: never "100.0%" while a
    candidate is not covered (``SearchResult.coverage`` from its integer counts)."""
    total = len(r.candidates)
    done = len(r.full_values) + r.num_ruled_out
    tenths = done * 1000 // total if total else 1000
    return f"{tenths // 10}.{tenths % 10}%"


def _caveats(advice: Advice) -> list[str]:
    out = [
        "- Every figure is the simulator's (same seed for every candidate); the short runs only "
        "steer the search, the tables hold full runs.",
        "- Ruling out relies on the largest errors of the estimates seen so far, not on a proof.",
    ]
    from sim.cluster import check_sim_run

    out += [f"- {warning}" for warning in check_sim_run(advice.best_spec)]  # as tandem run says
    if (tp := advice.best.structure.tp) > 1:
        out.append(
            f"- The advice runs tp {tp}. The simulator prices its tensor-parallel "
            "communication (docs/sim-engine.md: two ring all-reduces per layer over NVLink) as "
            "a lower bound (full link rate, NCCL's smallest latency), so a tp this large may "
            "be slower in practice than it shows here, the more so for a small model; compare "
            "with `--axis tp=1,2` or measure it (`tandem calibrate`)."
        )
    if advice.best.policies.predictor in ("oracle", "noisy-oracle"):
        out.append(
            f"- The advice uses the `{advice.best.policies.predictor}` length predictor, which only "
            "the simulator has (live: the task's answer length); `ranker` is the deployable one."
        )
    return out
