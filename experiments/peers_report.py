"""The figures of ``bench peers``: medians over accepted rounds, spread, ratios to TRL,
and the files of its output directory (``runs.csv``, ``summary.json``, ``spec.yaml``).

A system's figure is the median over the accepted rounds of its per-run rates, with
the lowest and highest beside it (the spread is the run-to-run noise). A mode's ratio
to TRL is the ratio of the two medians; the per-round ratios (mode and TRL of the same
round) are listed too. With no accepted round the figures fall back to every round and
``accepted_only`` says so.
"""

from __future__ import annotations

import csv
import json
import statistics
from collections.abc import Sequence
from typing import Any

from experiments.bench_peers import TRL, PeerBenchConfig, RoundResult, SystemRun

FIGURES = ("samples_per_s", "steady_samples_per_s", "tokens_per_s", "steady_tokens_per_s")
CSV_COLUMNS = (
    "attempt", "seed", "system", "accepted", "samples_per_s", "steady_samples_per_s",
    "tokens_per_s", "steady_tokens_per_s", "num_samples", "completion_tokens",
    "mean_completion_tokens", "cpu_ms_per_sample", "mean_reward", "late_reward", "wall_s",
    "other_load_share", "disturbed",
)  # fmt: skip
OTHER_FIGURES = ("mean_completion_tokens", "cpu_ms_per_sample", "mean_reward", "late_reward")


def _figure(run: SystemRun, name: str) -> float | None:
    if name == "mean_completion_tokens":
        return run.rates.mean_completion_tokens
    return getattr(run.rates, name)


def _median_and_range(values: Sequence[float | None]) -> dict[str, Any]:
    known = [v for v in values if v is not None]
    if not known:
        return {"median": None, "min": None, "max": None}
    return {"median": statistics.median(known), "min": min(known), "max": max(known)}


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def summarize(config: PeerBenchConfig, results: list[RoundResult]) -> dict[str, Any]:
    """The benchmark's figures (JSON-ready)."""
    accepted = [r for r in results if r.rejected is None]
    used = accepted or results
    systems: dict[str, dict[str, Any]] = {}
    for system in config.systems:
        runs = [run for r in used for run in r.runs if run.system == system]
        systems[system] = {
            name: _median_and_range([_figure(run, name) for run in runs])
            for name in (*FIGURES, *OTHER_FIGURES)
        }
    ratios = {
        mode: {
            name: _ratio(systems[mode][name]["median"], systems[TRL][name]["median"])
            for name in FIGURES
        }
        for mode in config.modes
    }
    return {
        "systems": systems,
        "ratio_to_trl": ratios,
        "ratio_to_trl_per_round": [_round_ratios(config, r) for r in used],
        "rounds_accepted": len(accepted),
        "rounds_rejected": [
            {"round": r.attempt + 1, "reason": r.rejected} for r in results if r.rejected
        ],  # fmt: skip
        "accepted_only": bool(accepted),
        "steps": config.steps,
        "batch": {
            "samples": config.spec.algorithm.batch_size,
            "group_size": config.spec.algorithm.group_size,
        },  # fmt: skip
        "max_output_tokens": config.spec.workload.max_output_tokens,
        "trl_threads": config.trl_threads,
        "max_other_load_share": config.max_other_share,
        "out": str(config.out_dir),
    }


def _round_ratios(config: PeerBenchConfig, result: RoundResult) -> dict[str, float | None]:
    """Each mode's whole-run samples/s over TRL's, in one round."""
    by_system = {run.system: run.rates.samples_per_s for run in result.runs}
    trl = by_system.get(TRL)
    return {m: _ratio(by_system.get(m), trl) for m in config.modes}


def csv_rows(results: list[RoundResult]) -> list[dict[str, Any]]:
    """One row per run, rejected rounds included."""
    rows = []
    for r in results:
        for run in r.runs:
            rates = run.rates
            rows.append({
                "attempt": r.attempt, "seed": r.seed, "system": run.system,
                "accepted": r.rejected is None, "samples_per_s": rates.samples_per_s,
                "steady_samples_per_s": rates.steady_samples_per_s,
                "tokens_per_s": rates.tokens_per_s,
                "steady_tokens_per_s": rates.steady_tokens_per_s,
                "num_samples": rates.num_samples, "completion_tokens": rates.completion_tokens,
                "mean_completion_tokens": rates.mean_completion_tokens,
                "cpu_ms_per_sample": rates.cpu_ms_per_sample, "mean_reward": rates.mean_reward,
                "late_reward": rates.late_reward, "wall_s": rates.wall_s,
                "other_load_share": run.load.other_share, "disturbed": run.disturbed or "",
            })  # fmt: skip
    return rows


def save(config: PeerBenchConfig, results: list[RoundResult], summary: dict[str, Any]) -> None:
    """``runs.csv``, ``summary.json`` and the resolved ``spec.yaml`` in ``config.out_dir``."""
    out = config.out_dir
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "runs.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=CSV_COLUMNS)
        writer.writeheader()
        writer.writerows(csv_rows(results))
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    (out / "spec.yaml").write_text(config.spec.to_yaml())


def table_rows(config: PeerBenchConfig, summary: dict[str, Any]) -> list[list[str]]:
    """Rows of the printed table: system, four rates (median [min–max]), mean completion
    tokens, CPU milliseconds per sample, reward (all timed steps / last quarter),
    whole-run and steady ratios to TRL."""
    rows = []
    for system in config.systems:
        figures = summary["systems"][system]
        cells = [system, *(_cell(figures[name]) for name in FIGURES)]
        mean_tokens = figures["mean_completion_tokens"]["median"]
        cells.append("—" if mean_tokens is None else f"{mean_tokens:.1f}")
        cpu = figures["cpu_ms_per_sample"]["median"]
        cells.append("—" if cpu is None else f"{cpu:.1f}")
        mean, late = (figures[k]["median"] for k in ("mean_reward", "late_reward"))
        cells.append("—" if mean is None or late is None else f"{mean:.2f} / {late:.2f}")
        ratio = summary["ratio_to_trl"].get(system, {})
        for name in ("samples_per_s", "steady_samples_per_s"):
            value = ratio.get(name) if system != TRL else 1.0
            cells.append("—" if value is None else f"{value:.2f}")
        rows.append(cells)
    return rows


TABLE_HEADER = (
    "system", "samples/s", "steady samples/s", "tokens/s", "steady tokens/s",
    "mean tokens", "CPU ms/sample", "reward / last ¼", "÷ TRL", "÷ TRL steady",
)  # fmt: skip


def _cell(figure: dict[str, Any]) -> str:
    if figure["median"] is None:
        return "—"
    return f"{figure['median']:.0f} [{figure['min']:.0f}–{figure['max']:.0f}]"
