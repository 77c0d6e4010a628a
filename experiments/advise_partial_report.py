"""Writing what a stopped ``tandem advise`` had (:class:`experiments.advise_partial.PartialAdvice`):
the simulations so far and the best so far, said to be partial."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from experiments.advise_partial import AdviceStatus, PartialAdvice
from experiments.advise_report import (
    LIVE_CHECK_FILES,
    STATUS_FILE,
    evaluations_frame,
    fmt,
    full_runs,
    ratio,
    status_record,
    top_table,
)
from experiments.advise_space import candidate_spec
from policies.results import write_atomic


def write_partial(partial: PartialAdvice, out: Path) -> Path:
    """What a stopped ``advise`` had: ``status.json`` saying partial (first), ``input.yaml``,
    ``evaluations.csv``, and where a full run inside the space ended, ``best.yaml`` (the
    best so far) and a short ``advice.md`` that says it is partial. Files of an earlier
    advice that these do not replace are removed."""
    out.mkdir(parents=True, exist_ok=True)
    write_atomic(out / STATUS_FILE, status_record(AdviceStatus.PARTIAL, partial))
    for name in ("best.yaml", "pareto.csv", "pareto.png", "advice.md", *LIVE_CHECK_FILES):
        (out / name).unlink(missing_ok=True)
    write_atomic(out / "input.yaml", partial.space.base.to_yaml().encode())
    runs = evaluations_frame(partial)
    write_atomic(out / "evaluations.csv", runs.to_csv(index=False).encode())
    if partial.best is not None:
        best_spec = candidate_spec(partial.space.base, partial.best)
        write_atomic(out / "best.yaml", best_spec.to_yaml().encode())
    shown = full_runs(runs) if len(runs) else runs  # stopped before any simulation ended
    write_atomic(out / "advice.md", partial_markdown(partial, shown).encode())
    return out


def partial_markdown(partial: PartialAdvice, runs: pd.DataFrame) -> str:
    """advice.md of a stopped search: the best so far, said to be no more than that."""
    inv, n = partial.space.inventory, len(partial.evaluations)
    full = sum(e.iterations >= partial.space.base.run.iterations for e in partial.evaluations)
    label = "no full run inside the space ended" if partial.best is None else (
        f"`{partial.best.label(inv)}` — **{fmt(partial.best_value)}** "
        f"({ratio(partial.best_value, partial.input_value)} the input; in `best.yaml`)")  # fmt: skip
    lines = [
        f"# tandem advise · {partial.space.base.run.name} · PARTIAL", "",
        f"**{_why(partial)} after {partial.wall_s:.1f} s of the {partial.budget_s:g} s budget, "
        f"with {n} simulations ({n - full} short, {full} full): the search did not end and "
        "no change was priced. This is the best so far, not advice** (`status.json`: "
        "partial; every simulation is in `evaluations.csv`).", "",
        f"- input: {fmt(partial.input_value)}", f"- best so far: {label}",
    ]  # fmt: skip
    if not runs.empty:
        lines += [
            "",
            "## Best full runs so far",
            "",
            *top_table(partial.objective, runs, best_tag="best so far"),
        ]
    return "\n".join(lines) + "\n"


def _why(partial: PartialAdvice) -> str:
    return (
        "The budget ran out before any full run ended" if partial.budget_ran_out else "Interrupted"
    )
