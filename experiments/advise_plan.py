"""From an input spec and the options of ``tandem advise`` to the candidates to search."""

from __future__ import annotations

from dataclasses import dataclass

from experiments.advise_axes import (
    alg1_splits,
    apply_axes,
    default_axes,
    feasible_tps,
    staleness_of,
    trainer_fits,
    trainer_floors,
    with_extra_splits,
)
from experiments.advise_bounds import Bounds
from experiments.advise_calibrated import fix_tp, priceable, profiled_setup
from experiments.advise_estimate import Estimator
from experiments.advise_space import (
    Candidate,
    Inventory,
    PolicyChoice,
    SearchAxes,
    canonical,
    enumerate_candidates,
    enumerate_policies,
    input_candidate,
)
from experiments.cost_hint import cost_hint
from policies.build import build_allocation, mode_of
from policies.rng import RngStreams
from policies.spec import RunSpec, SpecError
from sim.cluster import resolve_cluster
from sim.tables import hardware_of, hardware_without_cost
from sim.workload import Workload


@dataclass(frozen=True, slots=True)
class SpaceOptions:
    max_staleness: int | None = None  # None: the input spec's own bound
    objective: str = "throughput"
    axes: tuple[str, ...] = ()  # ``name=v1,v2`` overrides

    def __post_init__(self) -> None:
        if self.objective not in ("throughput", "cost-normalized"):
            raise ValueError(
                f"--objective must be throughput or cost-normalized, not {self.objective!r}"
            )
        if self.max_staleness is not None and self.max_staleness < 0:
            raise ValueError(f"--max-staleness must be >= 0, got {self.max_staleness}")


@dataclass(frozen=True, slots=True)
class Space:
    base: RunSpec
    axes: SearchAxes
    inventory: Inventory
    candidates: tuple[Candidate, ...]
    estimates: tuple[float, ...]
    input: Candidate | None  # the input spec as a candidate (None: not expressible)
    input_outside: bool  # the input breaks the constraints (staler than allowed, an --axis)
    bounds: Bounds  # which configurations are inside the space (pricing runs may not be)
    left_out: tuple[str, ...] = ()  # each (hardware, tp) or trainer size that does not fit, and why

    @property
    def prefer(self) -> PolicyChoice:
        """The input spec's policies: the value of a choice that makes no difference."""
        p = self.base.policies
        return PolicyChoice(p.dispatch, p.scheduling, p.length_predictor)


def plan_space(base: RunSpec, options: SpaceOptions) -> Space:
    estimator = Estimator.of(base)
    axes = apply_axes(
        default_axes(base, options.max_staleness, options.objective), list(options.axes)
    )
    if not enumerate_policies(axes):  # e.g. dispatch=skewness-aware with predictor=none
        raise SpecError(
            f"--axis: no policy combination the spec accepts (dispatch "
            f"{','.join(axes.dispatches)} with predictor {','.join(axes.predictors)}): "
            "skewness-aware dispatch needs a length predictor other than none"
        )
    setup, limits = profiled_setup(estimator.cost), []
    if setup is not None:
        axes, note = fix_tp(axes, setup, base.cluster.generation[0].tp)
        limits.append(note)
    tps, left_out = feasible_tps(estimator, axes.tps)
    axes = with_extra_splits(axes, alg1_splits(estimator, axes))
    the_input = _input(base, estimator)
    if the_input is not None and not the_input.structure.colocated:
        s = the_input.structure
        axes = with_extra_splits(axes, {s.tp: (s.trainer_gpus,)})
    p = base.policies
    prefer = PolicyChoice(p.dispatch, p.scheduling, p.length_predictor)
    found = enumerate_candidates(axes, estimator.inventory, tps, prefer)
    floors = trainer_floors(estimator)
    fitting = [c for c in found if trainer_fits(c.structure, estimator.inventory, floors)]
    if len(fitting) < len(found):
        left_out = (*left_out, *(
            f"a trainer of fewer than {n} {hw}: cannot hold the model's weights and gradients"
            for hw, n in floors.items() if n > 1
        ))  # fmt: skip
    found = fitting
    if setup is not None:
        found, notes = priceable(found, estimator.inventory, setup, the_input)
        left_out = (*limits, *left_out, *notes)
    bounds = Bounds.of(axes, options.axes, prefer)
    outside = (
        the_input is None
        or staleness_of(base) > axes.max_staleness
        or not bounds.admits(canonical(the_input, prefer))  # e.g. a tp no --axis tp lists
    )
    if the_input is not None and not outside:
        the_input = canonical(the_input, prefer)
        found = sorted(set(found) | {the_input})
    if not found:
        raise ValueError("the search space is empty: no mode, tp or split fits the constraints")
    if options.objective == "cost-normalized" and estimator.cost_units(found[0].structure) is None:
        groups = estimator.inventory.groups
        missing = hardware_without_cost((g.hardware for g in groups), hardware_of(base))
        raise ValueError(
            "--objective cost-normalized needs every GPU's cost: hardware.csv and sim.hardware "
            f"have no cost_per_machine_rel_h20 for {', '.join(missing)} (give it with "
            f"{cost_hint(base, missing)})"
        )
    per_structure = {c.structure: _estimate(estimator, c, options.objective) for c in found}
    estimates = tuple(per_structure[c.structure] for c in found)
    return Space(
        base, axes, estimator.inventory, tuple(found), estimates, the_input, outside, bounds,
        left_out,
    )  # fmt: skip


def _input(base: RunSpec, estimator: Estimator) -> Candidate | None:
    workload = Workload(base, RngStreams(base.run.seed))
    try:
        cluster = resolve_cluster(
            base, mode_of(base), estimator.cost, workload, build_allocation(base)
        )
    except ValueError:
        return None
    return input_candidate(base, base.model_copy(update={"cluster": cluster}))


def _estimate(estimator: Estimator, c: Candidate, objective: str) -> float:
    value = estimator.throughput(c.structure)
    if objective == "cost-normalized":
        units = estimator.cost_units(c.structure)
        return value / units if units else 0.0
    return value
