"""The tables of ``tandem fidelity``'s report: the per-case comparison, every repeat's
throughput, and the pairs of modes that live orders alike on every seed."""

from __future__ import annotations

import pandas as pd

from experiments.fidelity_compare import METRICS, Summary


def _fmt(value: object, pct: bool = False) -> str:
    if value is None or (isinstance(value, float) and pd.isna(value)):
        return "—"
    return f"{value:+.1%}" if pct else f"{value:.4g}"


def markdown_table(frame: pd.DataFrame, summary: Summary) -> str:
    lines = ["| mode | dispatch | metric | live | sim | error |", "|---|---|---|---:|---:|---:|"]
    for _, r in frame.iterrows():
        lines.append(
            f"| {r['mode']} | {r['dispatch']} | {METRICS.get(r['metric'], r['metric'])} | "
            f"{_fmt(r['live'])} | {_fmt(r['sim'])} | "
            f"{_fmt(r['rel_error'], pct=r['metric'] != 'lag_tv_distance')} |"
        )
    lines += [
        "",
        f"Median |throughput error|: {summary.median_abs_throughput_error:.1%}; "
        f"largest: {summary.max_abs_throughput_error:.1%}.",
        "",
    ]
    for d, (live, sim) in summary.rankings.items():
        verdict = "same" if live == sim else "DIFFERENT"
        lines.append(f"Ranking ({d}): live {' > '.join(live)}; sim {' > '.join(sim)} ({verdict}).")
    return "\n".join(lines) + "\n"


def repeats_table(repeats: pd.DataFrame) -> str:
    """Every run's throughput (live, its twin, error), and each case's live spread."""
    lines = ["", "Throughput of every run (samples/s). The case rows above give the medians of "
             "live and sim, and the median of these paired errors:", "",
             "| mode | dispatch | repeat | seed | live | sim | error |",
             "|---|---|---:|---:|---:|---:|---:|"]  # fmt: skip
    for _, r in repeats.iterrows():
        lines.append(
            f"| {r['mode']} | {r['dispatch']} | {r['repeat']} | {r['seed']} | "
            f"{_fmt(r['live'])} | {_fmt(r['sim'])} | {_fmt(r['rel_error'], pct=True)} |"
        )
    if repeats["repeat"].max() > 0:
        spread = live_spread(repeats)
        lines += ["", "Live spread over the repeats ((max − min) / median throughput; the "
                  "seeds differ, so this is workload and noise): " + ", ".join(
            f"{m}·{d} {v:.1%}" for m, d, v in spread.itertuples(index=False)
        ) + "."]  # fmt: skip
    return "\n".join(lines) + "\n"


def seed_orders(repeats: pd.DataFrame, dispatch: str) -> list[tuple[str, str, bool]]:
    """``(faster, slower, sim agrees)`` for each pair of modes that live orders the same way
    on every seed (the repeats are paired: one seed, one workload, every mode); the sim
    agrees when its twins order the pair that way on every seed too."""
    rows = repeats[repeats["dispatch"] == dispatch]
    live = rows.pivot_table(index="seed", columns="mode", values="live")
    sim = rows.pivot_table(index="seed", columns="mode", values="sim")
    modes = list(dict.fromkeys(rows["mode"]))
    out = []
    for i, a in enumerate(modes):
        for b in modes[i + 1 :]:
            for fast, slow in ((a, b), (b, a)):
                if len(live) > 1 and (live[fast] > live[slow]).all():
                    out.append((fast, slow, bool((sim[fast] > sim[slow]).all())))
    return out


def seed_orders_text(repeats: pd.DataFrame) -> str:
    """The report's lines on the pairs of modes every seed orders alike (none: one repeat)."""
    if repeats["repeat"].max() == 0:
        return ""
    lines = ["", "Pairs of modes that live orders the same way on every seed (the other pairs "
             "swap between seeds, so live does not rank them):"]  # fmt: skip
    for d in dict.fromkeys(repeats["dispatch"]):
        pairs = seed_orders(repeats, d)
        text = ", ".join(f"{f} > {s}" + ("" if ok else " (sim: NOT on every seed)")
                         for f, s, ok in pairs) or "none"  # fmt: skip
        agree = sum(ok for *_, ok in pairs)
        lines.append(f"- {d}: {text}; the sim orders {agree} of {len(pairs)} alike on every seed.")
    return "\n".join(lines) + "\n"


def live_spread(repeats: pd.DataFrame) -> pd.DataFrame:
    """Per case: the live runs' throughput range over their median (seeds and noise)."""
    grouped = repeats.groupby(["mode", "dispatch"], sort=False)["live"]
    return ((grouped.max() - grouped.min()) / grouped.median()).rename("live_spread").reset_index()
