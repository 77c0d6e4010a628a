"""A run of a spec, with the spec's length ranker, for every command that runs one.

``tandem run``, ``sweep`` (each point), ``fidelity`` (each live case and its sim twin),
``bench`` and ``advise --live-check`` all go through here, so that each of them

* refuses a bad ``policies.ranker_path`` before it runs anything, naming the key and the
  file (:func:`check_run`; :func:`experiments.ranker_source.load_ranker_file` says what
  a file must be);
* ranks with the ranker :func:`experiments.ranker_source.ranker_for` builds;
* records where that ranker came from and how well it ranked the run's own samples, in
  run.log and metrics.json (``ranker_*``, :mod:`experiments.ranker_quality`).

The simulator and the launcher are imported when a run starts, not with this module.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from experiments.ranker_quality import record_ranker_quality
from experiments.ranker_source import check_ranker_path, ranker_for
from policies.results import RunResult
from policies.spec import RunSpec
from policies.tracking import StepUpdate

OnStep = Callable[[StepUpdate], None]


def check_run(
    spec: RunSpec,
    live: bool = False,
    ray_address: str | None = None,
    ranker_files_passed: set[str] | None = None,
) -> list[str]:
    """What a run of ``spec`` (live: on ``ray_address``, if given) refuses at its start,
    refused now, before anything is written: the simulator's or the launcher's checks,
    then the ranker file (``ranker_files_passed``: those a sweep's earlier points passed).
    Returns what a simulated run will warn about (it logs that itself;
    ``sim.cluster.check_sim_run``)."""
    warnings: list[str] = []
    if live:
        from runtime.launcher import check_live_run

        check_live_run(spec, ray_address)
    else:
        from sim.cluster import check_sim_run

        warnings = check_sim_run(spec)
    check_ranker_path(spec, live, ranker_files_passed)
    return warnings


def simulate(spec: RunSpec, on_step: OnStep | None = None, fast_forward: bool = True) -> RunResult:
    """Simulate ``spec`` with its ranker; the result's metrics say how it ranked."""
    from sim.simulator import Simulation

    predictor = ranker_for(spec)
    result = Simulation(spec, fast_forward=fast_forward, ranker=predictor).run(on_step=on_step)
    if predictor is not None:
        record_ranker_quality(result, predictor.source)
    return result


def run_live_ranked(
    spec: RunSpec,
    out_dir: Path,
    on_step: OnStep | None = None,
    force_new_spec: bool = False,
    ray_address: str | None = None,
) -> RunResult:
    """Run ``spec`` live into ``out_dir`` (``runtime.launcher.run_live``) with its ranker;
    its saved metrics.json says how the ranker ranked."""
    from runtime.launcher import run_live

    predictor = ranker_for(spec, live=True)
    result = run_live(
        spec, out_dir, predictor, force_new_spec=force_new_spec, on_step=on_step,
        ray_address=ray_address,
    )  # fmt: skip
    if predictor is not None:
        record_ranker_quality(result, predictor.source, out_dir)
    return result
