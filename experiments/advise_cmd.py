"""The ``tandem advise`` command: its arguments, and the run from a loaded spec to ``--out``.

Heavy imports (the simulator, pandas) happen inside :func:`run_advise`, so that building
the CLI's parser stays fast.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console

from experiments.arg_types import non_negative_int, path_text, positive_float, positive_int
from policies.spec import RunSpec

if TYPE_CHECKING:
    from experiments.advise_partial import PartialAdvice

# what ``tandem advise --out`` writes (``input.yaml``: the spec it was given)
ADVICE_FILES = frozenset(
    {"input.yaml", "best.yaml", "evaluations.csv", "pareto.csv", "pareto.png", "advice.md",
     "live-check.csv", "live-check.md", "status.json"}
)  # fmt: skip


def add_advise_parser(
    sub: Any,
    with_spec: Callable[[argparse.ArgumentParser, str | None], None],
    handler: Callable[[argparse.Namespace], int],
) -> None:
    p = sub.add_parser(
        "advise", help="search modes, splits, tp and policies with the simulator; write a spec"
    )
    with_spec(p, None)
    p.add_argument(
        "--out", type=path_text, required=True, help="directory for best.yaml, advice.md, pareto.*"
    )
    p.add_argument(
        "--overwrite", action="store_true", help="replace the advice --out holds for another spec"
    )
    p.add_argument(
        "--budget-s", type=positive_float, default=60.0, help="wall-time budget (default 60)"
    )
    p.add_argument(
        "--max-staleness",
        type=non_negative_int,
        default=None,
        help="largest staleness bound allowed (default: the input spec's own)",
    )
    p.add_argument(
        "--objective",
        choices=["throughput", "cost-normalized"],
        default="throughput",
        help="what to maximise: samples/s, or samples/s per H20-machine cost unit (the cost "
        "of one 8-GPU H20 machine; hardware.csv cost_per_machine_rel_h20)",
    )
    p.add_argument(
        "--workers", type=positive_int, default=2, help="simulation processes (default 2)"
    )
    p.add_argument(
        "--axis",
        action="append",
        default=[],
        metavar="NAME=V1,V2",
        help="restrict one dimension: mode, lag, tp, max_num_seqs, dispatch, scheduling, "
        "predictor, split_parts",
    )
    p.add_argument(
        "--live-check",
        type=non_negative_int,
        default=0,
        metavar="N",
        help="then run the top N and the input spec live (paired seeds) and compare orders",
    )
    p.add_argument(
        "--live-repeats", type=positive_int, default=3, help="live check: seeds per configuration"
    )
    p.set_defaults(func=handler)


def run_advise(spec: RunSpec, args: argparse.Namespace, console: Console) -> int:
    from experiments.advise import AdviseOptions, advise
    from experiments.advise_partial import AdviseInterrupted, NoFullRun
    from experiments.advise_partial_report import write_partial
    from experiments.advise_plan import SpaceOptions
    from experiments.advise_report import coverage_text, write_advice
    from experiments.ranker_source import check_ranker_path
    from runtime.errors import RunInterrupted

    check_ranker_path(spec, live=False)  # the search simulates with a ranker file
    if args.live_check:
        from experiments.advise_live import check_live_spec

        check_live_spec(spec)  # before the search, not after it
    options = AdviseOptions(
        space=SpaceOptions(args.max_staleness, args.objective, tuple(args.axis)),
        budget_s=args.budget_s,
        workers=args.workers,
    )
    try:
        advice = advise(spec, options, console)
    except AdviseInterrupted as err:  # Ctrl-C or SIGTERM: what ran so far, said to be partial
        out = write_partial(err.partial, Path(args.out))
        raise RunInterrupted(str(err), _partial_note(out, err.partial)) from err
    except NoFullRun as err:  # the budget ran out first: what ran, then the error
        out = write_partial(err.partial, Path(args.out))
        raise ValueError(f"{err} ({_partial_note(out, err.partial)})") from None
    out = write_advice(advice, Path(args.out))
    r = advice.result
    console.print(
        f"advice: [bold]{advice.best.label(advice.space.inventory)}[/bold] "
        f"{advice.best_value:.4g} (input {advice.input_value or float('nan'):.4g}); "
        f"{r.num_short} short + {r.num_full} full runs of {len(r.candidates)} candidates, "
        f"{coverage_text(r)} covered, {advice.wall_s:.1f} s"
    )
    for line in advice.space.left_out:
        console.print(f"left out: {line}")
    if not r.finished:
        console.print(
            f"[yellow]the budget (--budget-s {advice.budget_s:g}) stopped the search with "
            f"{r.num_open} candidates not covered: a better one may be among them; a larger "
            "--budget-s covers more (a loaded host runs fewer simulations in it)[/yellow]"
        )
    if args.live_check:
        from experiments.advise_live import LivePlan, live_check

        plan = LivePlan(top=args.live_check, repeats=args.live_repeats)
        report = live_check(advice, plan, out / "live-check", console)
        console.print(report.summary())
    console.print(f"advice in [bold]{out}[/bold] (best.yaml, advice.md, pareto.csv, pareto.png)")
    return 0


def _partial_note(out: Path, partial: PartialAdvice) -> str:
    best = "no full run ended" if partial.best is None else "the best so far in best.yaml"
    return (
        f"partial results ({len(partial.evaluations)} simulations; {best}) in {out} "
        "(status.json: partial; advice.md says what ran); the same command again starts over"
    )
