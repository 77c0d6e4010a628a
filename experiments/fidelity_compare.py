"""``tandem fidelity``'s comparison, pure: live and sim results of each case, their errors,
lag distributions and the rankings of modes."""

from __future__ import annotations

import statistics
from collections import Counter
from dataclasses import dataclass, field

import pandas as pd

from policies.results import RunResult

METRICS = {
    "throughput_samples_per_s": "throughput (samples/s)",
    "generation_time_s": "generation time per iteration (s)",
    "iteration_time_s": "iteration time (s)",
    "trainer_utilization": "trainer busy fraction",
    "pipeline_bubble_s": "pipeline bubble (s)",
    "skewness_bubble_s": "skewness bubble (s)",
    "mean_staleness": "mean lag (versions)",
}


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
