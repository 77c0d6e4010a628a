"""``tandem reproduce streamrl``: the StreamRL (arXiv 2504.15930) throughput study.

Runs every point of :mod:`experiments.reproduce.streamrl_points` in parallel, then draws
the figures and writes ``report.md`` with the published text-level claims of
the StreamRL paper (arXiv 2504.15930) beside our numbers.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd
from rich.console import Console

import experiments.reproduce.streamrl_points as sp
from experiments.reproduce.assumptions import STREAMRL_ASSUMPTIONS
from experiments.reproduce.figures import Axes, bars
from experiments.reproduce.points import Point, PointResult
from experiments.reproduce.report import (
    Claim,
    Section,
    Table,
    max_verdict,
    range_verdict,
    ratio_range,
    write_report,
)
from experiments.reproduce.streamrl_scaling import (
    cross_dc_section,
    elastic_section,
    ptl_section,
    stage_section,
)
from experiments.reproduce.workers import run_points

Results = dict[Point, PointResult]
BASELINE = "colocated (verl-like)"
COLOCATION_RL = "colocated + skewness-aware"


def _e2e_frame(res: Results, b: sp.Budget) -> pd.DataFrame:
    rows = []
    for m in sp.MODELS:
        for n in b.lengths:
            for s in b.systems:
                r = res[sp.e2e_point(m, n, s, b)]
                rows.append(
                    {
                        "model": m,
                        "max_output_tokens": n,
                        "system": s,
                        "gen_gpus": r.gen_gpus,
                        "train_gpus": r.train_gpus,
                        "throughput_samples_per_s": r.metrics["throughput_samples_per_s"],
                        "iteration_time_s": r.metrics["iteration_time_s"],
                        "generation_time_s": r.metrics["generation_time_s"],
                        "max_staleness": r.metrics["max_staleness"],
                    }
                )
    return pd.DataFrame(rows)


def speedups(e2e: pd.DataFrame) -> pd.DataFrame:
    """Each system's throughput over the verl-like baseline's, per model × length cell."""
    wide = e2e.pivot_table(
        index=["model", "max_output_tokens"],
        columns="system",
        values="throughput_samples_per_s",
        sort=False,
    )
    out = wide.div(wide[BASELINE], axis=0).drop(columns=[BASELINE])
    out.columns = [f"{c} / verl-like" for c in out.columns]
    out["stream-sync / colocated+skew"] = wide["stream-sync"] / wide[COLOCATION_RL]
    return out.reset_index()


def _e2e_claims(up: pd.DataFrame) -> list[Claim]:
    sync = list(up["stream-sync / verl-like"])
    sync_col = list(up["stream-sync / colocated+skew"])
    asyn = list(up["stream-async / verl-like"])
    why_low = (
        "Our gain is only what the mechanisms give on the roofline cost model: streaming "
        "overlaps training with generation, but the long tail of Fig. 7 keeps generation the "
        "longer stage, and the colocated baseline loses just a PCIe context switch and the "
        "tail's idle GPUs. verl's other overheads (resharding, its engine, memory limits on "
        "its batch) are not modelled. Our speedups therefore sit at the low end of the "
        "published ranges."
    )
    why_overlap = "Overlap at the low end only; see the first claim of this section."
    return [
        Claim("Throughput over existing systems", "up to 2.66×", f"up to {max(asyn):.2f}×",
              "consistent" if max(asyn) >= 2.66 else "we disagree (ours lower)", why_low),
        Claim("StreamRL-Sync over verl", "1.12–2.12×", ratio_range(sync),
              range_verdict(sync, 1.12, 2.12), why_overlap),
        Claim("StreamRL-Sync over ColocationRL", "1.06–1.41×", ratio_range(sync_col),
              range_verdict(sync_col, 1.06, 1.41),
              "ColocationRL is modelled as the colocated mode with StreamRL's dispatch and "
              "scheduling (skewness-aware, LPT, ranker of recall 0.87)."),
        Claim("StreamRL-Async over verl", "1.30–2.66×", ratio_range(asyn),
              range_verdict(asyn, 1.30, 2.66), why_overlap),
    ]  # fmt: skip


def e2e_section(res: Results, b: sp.Budget, out: Path) -> Section:
    e2e = _e2e_frame(res, b)
    up = speedups(e2e)
    axes = Axes("max_output_tokens", "throughput_samples_per_s", "system",
                "max output length (tokens)", "throughput (samples/s)", panel="model")  # fmt: skip
    bars(
        e2e, axes, "End-to-end throughput (7B/32, 32B/64, 72B/128 H800)", out / "e2e_throughput.png"
    )
    note = (
        "Colocated systems use every GPU for both stages; disaggregated ones start from the "
        "shipped even split and re-split it with `balanced` (StreamRL Alg. 1); gen/train "
        "GPUs are the split that ran. All disaggregated systems use skewness-aware dispatch, "
        "LPT and a ranker of recall 0.87. Throughput is trained samples over the makespan of "
        f"a {b.iterations}-iteration run (pipeline fill included)."
    )
    return Section(
        "End-to-end throughput",
        "How much faster are stream-sync and stream-async than colocated RL, per model and length?",
        ["e2e_throughput.png"],
        [Table("e2e_throughput", e2e), Table("e2e_speedup", up)],
        claims=_e2e_claims(up),
        notes=[note],
    )


def ablation_section(res: Results, b: sp.Budget, out: Path) -> Section:
    rows = []
    for step, s in enumerate(sp.ABLATION):
        r = res[sp.e2e_point("72B", 20000, s, b)]
        rows.append(
            {"step": step, "system": s, "throughput": r.metrics["throughput_samples_per_s"]}
        )
    frame = pd.DataFrame(rows)
    frame["speedup"] = frame["throughput"] / frame["throughput"].iloc[0]
    axes = Axes("system", "speedup", "system", "system (each adds one mechanism)",
                "throughput / colocated (×)")  # fmt: skip
    bars(frame, axes, "Ablation, 72B on 128 H800, 20K max length", out / "ablation.png")
    note = (
        "Colocated (verl-like) → + skewness-aware dispatch, LPT and the ranker → + "
        "disaggregation and streaming (stream-sync) → + one-step asynchrony (stream-async). "
        "Throughput in samples/s."
    )
    return Section(
        "Ablation (72B, 20K)",
        "How much does each StreamRL mechanism add?",
        ["ablation.png"],
        [Table("ablation", frame)],
        notes=[note],
    )


def predictor_section(res: Results, b: sp.Budget, out: Path) -> Section:
    rows = []
    for m in sp.MODELS:
        for p in sp.PREDICTORS:
            r = res[sp.predictor_point(m, p, b)]
            rows.append(
                {
                    "model": m,
                    "dispatch": p,
                    "generation_time_s": r.metrics["generation_time_s"],
                    "skewness_bubble_s": r.metrics["skewness_bubble_s"],
                }
            )
    frame = pd.DataFrame(rows)
    axes = Axes("model", "generation_time_s", "dispatch", "model",
                "generation time per iteration (s)")  # fmt: skip
    bars(frame, axes, "Generation time at 20K (stream-sync)", out / "generation_time.png")
    base = frame.pivot_table(index="model", columns="dispatch", values="generation_time_s")
    gain = base["random + FIFO"] / base["skewness-aware + ranker (recall 0.87)"]
    note = (
        "The README lists no number for this figure, so there is no claim to check; we "
        f"find random + FIFO / skewness-aware with the ranker = {ratio_range(list(gain))} in "
        "generation time. The gain is small in our model because a 20K tail sample "
        "bounds the makespan whatever the dispatch, and the roofline decode step barely grows "
        "with batch below the compute-bound point, so batching many short samples beside a "
        "long one costs little. Where the ranker's mistakes put a long sample on a busy "
        "instance it can be slower than random."
    )
    return Section(
        "Skewness-aware dispatch and the length ranker",
        "How much generation time do skewness-aware dispatch, a realistic ranker and an "
        "oracle save against random dispatch with FIFO?",
        ["generation_time.png"],
        [Table("generation_time", frame)],
        notes=[note],
    )


def allocation_section(res: Results, b: sp.Budget, out: Path) -> Section:
    rows = []
    for m in ("32B", "72B"):
        for n in b.lengths:
            for a, label in (("fixed", "even split"), ("balanced", "balanced")):
                r = res[sp.allocation_point(m, n, a, b)]
                rows.append(
                    {
                        "model": m,
                        "max_output_tokens": n,
                        "allocation": label,
                        "gen_gpus": r.gen_gpus,
                        "train_gpus": r.train_gpus,
                        "throughput_samples_per_s": r.metrics["throughput_samples_per_s"],
                    }
                )
    frame = pd.DataFrame(rows)
    axes = Axes("max_output_tokens", "throughput_samples_per_s", "allocation",
                "max output length (tokens)", "throughput (samples/s)", panel="model")  # fmt: skip
    bars(frame, axes, "Resource allocation (stream-async)", out / "allocation.png")
    t = frame.pivot_table(
        index=["model", "max_output_tokens"],
        columns="allocation",
        values="throughput_samples_per_s",
    )
    ratio = t["balanced"] / t["even split"]
    gains = list(ratio)
    claim = Claim(
        "Resource allocation balances the stages", "up to 1.25× speedup",
        f"up to {max(gains):.2f}× ({ratio_range(gains)})",
        max_verdict(gains, 1.25),
        _allocation_note(ratio),
    )  # fmt: skip
    return Section(
        "Resource allocation: even split vs balanced",
        "How much does StreamRL's allocation (Alg. 1) gain over an even GPU split?",
        ["allocation.png"],
        [Table("allocation", frame)],
        claims=[claim],
    )


def _allocation_note(ratio: pd.Series) -> str:
    """What the balanced/even-split ratios (indexed by model and length) show."""
    note = (
        "Alg. 1 gains most where generation dominates (long outputs). The paper does not "
        "say what its speedup is over; ours is over an even split, which the stage times "
        "of these points already leave close to balanced."
    )
    (model, length), worst = ratio.idxmin(), ratio.min()
    if worst < 0.995:
        note += (
            f" Where the stages are close it can lose: {model} at {length} tokens runs "
            f"{worst:.2f}× the even split: its stage model is an estimate (generation of "
            "the batch split evenly over the instances, decode at the mean context, no "
            "dispatch skew), and where it puts the two stages within a few percent the "
            "simulated run can rank the splits the other way."
        )
    return note


INTRO = [
    "Simulated with tandem's SimPy simulator on the StreamRL paper's setups "
    "(arXiv 2504.15930): Qwen2.5-7B/32B/72B on 32/64/128 H800, PPO, "
    "1024 samples per iteration, lengths from the paper's Fig. 7 histogram scaled to "
    "5K/10K/20K. Every parameter comes from `hardware.csv`, `models.csv`, the published "
    "profile or a documented engine-efficiency assumption (table at the end); nothing is "
    "fitted to the published results. Regenerate with `tandem reproduce streamrl`.",
]


def build(out: Path, quick: bool, workers: int, console: Console | None = None) -> Path:
    b = sp.QUICK if quick else sp.FULL
    res = run_points(sp.all_points(b), workers, "streamrl", console)
    sections = [
        stage_section(res, b, out),
        ptl_section(out),
        e2e_section(res, b, out),
        ablation_section(res, b, out),
        predictor_section(res, b, out),
        allocation_section(res, b, out),
        elastic_section(res, b, out),
        cross_dc_section(res, b, out),
    ]
    intro = [*INTRO, f"Mode: {'--quick' if quick else 'full'}; {b.iterations} iterations per run."]
    return write_report(out, "StreamRL reproduction", intro, sections, STREAMRL_ASSUMPTIONS)
