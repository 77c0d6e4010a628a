"""What a ``tandem fidelity`` run will run, checked before anything starts.

:class:`FidelityPlan` is the grid (modes × dispatches × repeats); :func:`check_plan`
builds every case's spec and loads the cost model up front, so that a typo in the second
mode fails in a second, not after the first mode's live runs. Each case directory records
the run it belongs to (:data:`RUN_FILE`, a key over the base spec and the plan), so that a
report never mixes the cases of two runs in one ``--out``.
"""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import dataclass
from pathlib import Path

from policies.calibrated import CalibratedCosts, cost_model_path
from policies.results import write_atomic
from policies.spec import RunSpec, SpecError, override_spec, spec_from_dict

NO_CHECKPOINTS = 10**9  # live.checkpoint_every: never within a run
RUN_FILE = "fidelity-run.json"  # in each cases/NAME/repeat-R/: the run it came from

log = logging.getLogger(__name__)


@dataclass(slots=True, frozen=True)
class FidelityPlan:
    modes: tuple[str, ...]
    dispatches: tuple[str | None, ...] = (None,)  # None: the spec's own
    profile_dir: Path | None = None  # calibrated into OUT/cost-model
    cost_model_dir: Path | None = None
    overlay_iteration: int = 2  # the iteration of the timeline overlay (if the run has it)
    repeats: int = 1  # live runs per case, each with its own sim twin

    def __post_init__(self) -> None:
        if self.repeats < 1:
            raise ValueError(f"repeats must be at least 1, got {self.repeats}")


def case_spec(
    base: RunSpec,
    mode: str,
    dispatch: str | None,
    url: str,
    token: str,
    repeat: int = 0,
    cost_model_dir: Path | None = None,
) -> RunSpec:
    """One live case; with ``cost_model_dir`` its dispatch prices with the calibrated model
    its sim twin runs on (``live.cost_model``)."""
    spec = override_spec(base, [f"pipeline.mode={mode}", f"run.seed={base.run.seed + repeat}"])
    data = spec.model_dump(mode="json")
    if dispatch is not None:
        data["policies"]["dispatch"] = dispatch
    data["live"] |= {"server_urls": [url], "token": token, "checkpoint_every": NO_CHECKPOINTS}
    if cost_model_dir is not None:
        data["live"]["cost_model"] = str(cost_model_dir)
    return spec_from_dict(data)


def _one_line(err: SpecError, key: str) -> str:
    """The spec error without the key its flag already names."""
    return str(err).removeprefix(f"{key}: ")


def check_fidelity(base: RunSpec, plan: FidelityPlan, out: Path) -> str:
    """Everything a fidelity run into ``out`` can be refused for before it starts a
    server: the spec, its ranker file (checked for the sim: each live case's twin ranks
    with it too), each case, the cost model, another run's cases. Its run key."""
    from experiments.ranker_source import check_ranker_path

    if base.live.num_servers != 1 or base.live.server_urls:
        raise ValueError("tandem fidelity starts one server itself: live.num_servers must be 1")
    check_ranker_path(base, live=False)
    check_plan(base, plan)
    key = run_key(base, plan)
    check_no_other_run(out, key)
    return key


def check_plan(base: RunSpec, plan: FidelityPlan) -> None:
    """Every case's spec builds and the cost model (if given) loads; else a ValueError
    naming the flag (``--modes``, ``--dispatch``, ``--cost-model``)."""
    for mode in plan.modes:
        try:
            override_spec(base, [f"pipeline.mode={mode}"])
        except SpecError as err:
            raise ValueError(f"--modes {mode}: {_one_line(err, 'pipeline.mode')}") from None
    for mode in plan.modes:
        for dispatch in plan.dispatches:
            try:
                case_spec(base, mode, dispatch, "http://127.0.0.1:1", "check")
            except SpecError as err:
                about_dispatch = str(err).startswith("policies.dispatch: ")
                flag = f"--dispatch {dispatch}" + ("" if about_dispatch else f" (mode {mode})")
                raise ValueError(f"{flag}: {_one_line(err, 'policies.dispatch')}") from None
    if plan.cost_model_dir is not None:
        path = cost_model_path(plan.cost_model_dir, "--cost-model")
        try:
            CalibratedCosts.load(path)
        except (ValueError, KeyError, TypeError) as err:  # KeyError: a field it lacks
            raise ValueError(
                f"--cost-model {plan.cost_model_dir}: cannot load {path}: {err}"
            ) from None


def run_key(base: RunSpec, plan: FidelityPlan) -> str:
    """A short key of what a run ran: the base spec and the plan's grid and cost model."""
    source = plan.profile_dir if plan.profile_dir is not None else plan.cost_model_dir
    what = {
        "spec": base.public_dump(),
        "modes": plan.modes,
        "dispatches": plan.dispatches,
        "repeats": plan.repeats,
        "cost_model": str(source),
    }
    return hashlib.sha256(json.dumps(what, sort_keys=True).encode()).hexdigest()[:12]


def mark_case(case_dir: Path, key: str) -> None:
    """Record in ``case_dir`` that it belongs to the run ``key``."""
    write_atomic(case_dir / RUN_FILE, (json.dumps({"run": key}) + "\n").encode())


def case_run(case_dir: Path) -> str | None:
    """The run key ``case_dir`` records; None for a case of an older tandem (no record)."""
    path = case_dir / RUN_FILE
    return json.loads(path.read_text())["run"] if path.is_file() else None


def check_no_other_run(out: Path, key: str) -> None:
    """Refuse an ``out`` whose ``cases/`` holds cases of another run (a report would mix
    them): the user moves them away or picks another ``--out``."""
    others = [d for d in sorted((out / "cases").glob("*/repeat-*")) if case_run(d) != key]
    if others:
        names = ", ".join(str(d.relative_to(out)) for d in others[:4])
        more = f" and {len(others) - 4} more" if len(others) > 4 else ""
        raise ValueError(
            f"{out}/cases holds cases of another fidelity run ({names}{more}); give a new "
            f"--out, or remove {out}/cases to run into this one"
        )


def check_one_run(runs: list[Path], out: Path) -> None:
    """Refuse cases that come from different runs (or some recorded, some not)."""
    by_run: dict[str | None, list[Path]] = {}
    for d in runs:
        by_run.setdefault(case_run(d), []).append(d)
    if list(by_run) == [None]:  # cases of an older tandem: nothing to compare
        log.warning("%s/cases records no runs (an older tandem): not checked for a mix", out)
    if len(by_run) > 1:
        groups = "; ".join(
            f"run {key or 'unrecorded'}: " + ", ".join(str(d.relative_to(out)) for d in dirs)
            for key, dirs in sorted(by_run.items(), key=lambda kv: str(kv[0]))
        )
        raise ValueError(
            f"{out}/cases mixes cases of different fidelity runs ({groups}); move all but "
            "one run's cases out of it to report that run"
        )
