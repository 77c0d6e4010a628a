"""The search space's axes: defaults drawn from the input spec, ``--axis`` overrides,
which tensor-parallel degrees fit the hardware, and the splits StreamRL's Alg. 1 picks.

Defaults: every registered pipeline mode with lags 1, 2, 4 (pipeline's ``max_lag``,
conventional's ``steps_per_generation - 1``) up to ``max_staleness`` (default: the input
spec's own staleness bound, so the advice never trains on staler samples than the input
does unless asked); tp 1, 2, 4, 8 where the model and one longest sequence fit;
``max_num_seqs`` at half, once and twice the input's; every dispatch and scheduling
policy; the input's length predictor plus ``none`` (``ranker`` on request: ``--axis
predictor=...,ranker``; the sim then predicts with the fitted model, ~0.1 s per batch of
requests, which makes a pipeline-mode run tens of times slower).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import yaml

from experiments.advise_estimate import Estimator
from experiments.advise_space import (
    DEFAULT_LAGS,
    DEFAULT_TPS,
    Inventory,
    SearchAxes,
    Structure,
)
from policies.allocation import BalancedAllocation
from policies.cluster import ClusterSection, GenerationPool, TrainerPool
from policies.dispatch import DISPATCH
from policies.modes import MODES
from policies.predictors import PREDICTORS
from policies.scheduling import SCHEDULING
from policies.spec import RunSpec, SpecError
from sim.cluster import kv_shortfall, min_trainer_gpus

AXIS_NAMES = (
    "mode", "lag", "tp", "max_num_seqs", "dispatch", "scheduling", "predictor", "split_parts",
)  # fmt: skip
_FIELDS = {
    "mode": "modes",
    "lag": "lags",
    "tp": "tps",
    "max_num_seqs": "max_num_seqs",
    "dispatch": "dispatches",
    "scheduling": "schedulings",
    "predictor": "predictors",
}


def staleness_of(spec: RunSpec) -> int:
    p = spec.pipeline
    return MODES.get(p.mode).staleness_bound(p.max_lag, p.steps_per_generation)


def default_axes(
    base: RunSpec, max_staleness: int | None = None, objective: str = "throughput"
) -> SearchAxes:
    mns = base.cluster.generation[0].max_num_seqs
    predictors = {base.policies.length_predictor, "none"}
    return SearchAxes(
        modes=tuple(MODES.names()),
        lags=DEFAULT_LAGS,
        tps=DEFAULT_TPS,
        max_num_seqs=tuple(sorted({max(1, mns // 2), mns, mns * 2})),
        dispatches=tuple(DISPATCH.names()),
        schedulings=tuple(SCHEDULING.names()),
        predictors=tuple(sorted(predictors)),
        max_staleness=staleness_of(base) if max_staleness is None else max_staleness,
        partial=objective == "cost-normalized",
        iterations=base.run.iterations,
    )


def apply_axes(axes: SearchAxes, overrides: list[str]) -> SearchAxes:
    """``name=v1,v2`` restricts (or widens) one axis, e.g. ``tp=4,8``."""
    for text in overrides:
        name, values = _parse_axis(text)
        if name == "split_parts":
            if len(values) != 1 or not isinstance(values[0], int) or values[0] < 1:
                raise SpecError(f"--axis {text!r}: split_parts takes one positive integer")
            axes = replace(axes, split_parts=values[0])
            continue
        _check_values(name, values, text)
        if name == "lag" and (stale := [v for v in values if v > axes.max_staleness]):
            raise SpecError(
                f"--axis {text!r}: lag {stale[0]} trains on samples up to {stale[0]} steps "
                f"stale, over --max-staleness {axes.max_staleness} (the input's own bound by "
                "default): raise --max-staleness to search it"
            )
        axes = replace(axes, **{_FIELDS[name]: tuple(values)})
    return axes


def _parse_axis(text: str) -> tuple[str, list[Any]]:
    if "=" not in text:
        raise SpecError(f"--axis {text!r} must look like name=v1,v2")
    name, raw = (part.strip() for part in text.split("=", 1))
    if name not in AXIS_NAMES:
        raise SpecError(
            f"--axis {text!r}: unknown axis {name!r}; choose one of {', '.join(AXIS_NAMES)}"
        )
    values = [yaml.safe_load(v) for v in raw.split(",") if v.strip()]
    if not values:
        raise SpecError(f"--axis {text!r} has no values")
    return name, values


def _check_values(name: str, values: list[Any], text: str) -> None:
    registries = {
        "mode": MODES,
        "dispatch": DISPATCH,
        "scheduling": SCHEDULING,
        "predictor": PREDICTORS,
    }
    if name in registries:
        known = registries[name].names()
        bad = [v for v in values if v not in known]
        if bad:
            raise SpecError(
                f"--axis {text!r}: unknown {name} {bad[0]!r}; choose from {', '.join(known)}"
            )
    elif any(not isinstance(v, int) or v < (0 if name == "lag" else 1) for v in values):
        raise SpecError(f"--axis {text!r}: {name} takes positive integers")


def feasible_tps(
    estimator: Estimator, tps: tuple[int, ...]
) -> tuple[dict[str, tuple[int, ...]], tuple[str, ...]]:
    """Per hardware, the tps at which the model shards and the weights and one longest
    sequence fit, and why each other (hardware, tp) was left out; a ``SpecError`` saying
    why each failed where none fits any hardware (else the space collapsed to the input
    spec alone, reported as fully covered)."""
    largest = max(g.num_gpus for g in estimator.inventory.groups)
    out: dict[str, tuple[int, ...]] = {}
    left_out: list[str] = []
    for g in estimator.inventory.groups:
        if g.hardware in out:  # another datacenter's group of it: the same answer
            continue
        fits = []
        for tp in tps:
            problem = _tp_problem(estimator, g.hardware, tp, largest)
            if problem is None:
                fits.append(tp)
            else:
                left_out.append(f"tp {tp} on {g.hardware}: {problem}")
        out[g.hardware] = tuple(fits)
    if not any(out.values()):
        listed = ",".join(map(str, tps))
        raise SpecError(f"tp {listed}: none fits ({'; '.join(left_out)})")
    return out, tuple(left_out)


def _tp_problem(estimator: Estimator, hardware: str, tp: int, largest: int) -> str | None:
    """Why ``tp`` does not fit on ``hardware``, or None where it does (the KV cache as the
    simulator checks it: ``sim.cluster.kv_shortfall``)."""
    pool = estimator.spec.cluster.generation[0].model_copy(update={"hardware": hardware, "tp": tp})
    try:
        short = kv_shortfall(pool, estimator.cost, estimator.longest_tokens)
    except ValueError as err:  # the heads do not shard evenly, or the weights do not fit
        return str(err).removeprefix(f"tp {tp} ")
    if tp > largest:
        return f"more than the {largest} GPUs of the largest group"
    return short


def trainer_floors(estimator: Estimator) -> dict[str, int]:
    """Per hardware, the fewest trainer GPUs that hold the model's weights and gradients."""
    return {
        g.hardware: min_trainer_gpus(estimator.cost, g.hardware) for g in estimator.inventory.groups
    }


def trainer_fits(s: Structure, inv: Inventory, floors: dict[str, int]) -> bool:
    """Whether ``s``'s trainer (every GPU, colocated) has the memory its model needs."""
    if s.colocated:
        return inv.num_gpus >= floors[inv.groups[0].hardware]
    return s.trainer_gpus >= floors[inv.groups[s.trainer_group].hardware]


def alg1_splits(estimator: Estimator, axes: SearchAxes) -> dict[int, tuple[int, ...]]:
    """Per tp, the trainer GPUs StreamRL's Alg. 1 picks (single-group inventories only)."""
    inv: Inventory = estimator.inventory
    if len(inv.groups) != 1:
        return {}
    g = inv.groups[0]
    out: dict[int, tuple[int, ...]] = {}
    for tp in axes.tps:
        if g.num_gpus <= tp:
            continue
        picks = set()
        for mns in axes.max_num_seqs:
            pool = GenerationPool(
                hardware=g.hardware, num_gpus=tp, tp=tp, datacenter=g.datacenter, max_num_seqs=mns
            )
            trainer = TrainerPool(
                hardware=g.hardware, num_gpus=g.num_gpus - tp, datacenter=g.datacenter
            )
            cluster = ClusterSection(generation=[pool], trainer=trainer)
            picks.add(BalancedAllocation().allocate(cluster, estimator.stages).trainer.num_gpus)
        out[tp] = tuple(sorted(picks))
    return out


def with_extra_splits(axes: SearchAxes, extra: dict[int, tuple[int, ...]]) -> SearchAxes:
    merged = {
        tp: tuple(sorted(set(axes.extra_splits.get(tp, ())) | set(v))) for tp, v in extra.items()
    }
    return replace(axes, extra_splits={**axes.extra_splits, **merged})
