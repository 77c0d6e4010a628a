"""``tandem run``'s run itself, between its checks and its summary
(:func:`experiments.cli.cmd_run`): the run into its directory, its results saved, tracked
and plotted."""

from __future__ import annotations

import argparse
import logging
from collections.abc import Callable
from pathlib import Path

from experiments.live_out import nothing_left_if_refused
from experiments.progress import RunProgress, chain
from experiments.tracking import Tracker
from policies.given_split import replaced_split, split_keys_given
from policies.inert_keys import log_inert_keys
from policies.logs import run_log
from policies.results import RunResult, write_atomic
from policies.spec import RunSpec
from runtime.graceful_stop import StopRequests

log = logging.getLogger(__name__)


def run_into(
    args: argparse.Namespace, spec: RunSpec, out: Path, tracker: Tracker, progress: RunProgress,
    shutdown: StopRequests,
) -> RunResult:  # fmt: skip
    """The run into ``out``, its results saved, tracked and plotted. Once they are saved, a
    stop signal only ends the shutdown of a finished run (``shutdown``)."""
    from experiments.plots import timeline

    label = f"{spec.run.name} · {spec.pipeline.mode}"
    with (
        nothing_left_if_refused(out, made_out=args.out is None),
        run_log(out),
        tracker,
        progress as bar,
    ):
        log.info("%s run of %s in %s", "live" if args.live else "simulated", label, out)
        log_inert_keys([spec], live=args.live)  # in run.log too
        if not args.live:  # balanced re-splits a simulated run's GPUs, never a live one's
            for line in replaced_split([spec], split_keys_given(args.set)):
                log.warning("%s", line)
            # the spec is on disk from the start, also if the run is stopped
            if gone := RunResult.clear(out):  # an earlier run's: never beside this spec
                log.warning("%s: the earlier run's %s replaced", out, ", ".join(gone))
            write_atomic(out / "spec.yaml", spec.to_yaml().encode())
        on_step = chain(tracker, bar.on_step)
        result = execute(spec, out, args.live, on_step, args.force_new_spec, args.ray)
        if not args.live:  # run_live saved its result (a resumed run keeps its spec.yaml)
            result.save(out)
        shutdown.results_saved()
        if tracker.reports:  # not a finished live run's saved results: tracked once already
            tracker.finish(result.metrics)
        timeline(result, out / "timeline.png")
    return result


def execute(
    spec: RunSpec, out: Path, live: bool, on_step: Callable, force_new_spec: bool = False,
    ray_address: str | None = None,
) -> RunResult:  # fmt: skip
    """The run, with its ranker (whose source and quality its metrics record)."""
    from experiments.runs import run_live_ranked, simulate

    if live:
        return run_live_ranked(spec, out, on_step, force_new_spec, ray_address)
    return simulate(spec, on_step)
