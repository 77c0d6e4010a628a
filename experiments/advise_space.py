"""The configuration space ``tandem advise`` searches, and each point as a runnable spec.

A :class:`Candidate` is a :class:`Structure` (pipeline mode and its lag, tensor
parallelism, where the trainer sits and how many GPUs each side gets, vLLM's
``max_num_seqs``) plus :class:`PolicyChoice` (dispatch, scheduling, length predictor).
The GPUs come from an :class:`Inventory`: the input spec's pools merged by (hardware,
datacenter); every candidate places the trainer in one group and generation on what is
left, so per-datacenter placement is searched whenever the spec has several groups.

Equivalent points are enumerated once (colocated modes have no split; where neither
dispatch nor scheduling reads predicted lengths, as their modules declare
(:mod:`policies.length_readers`), the predictor is ``none``; with no length predictor
``lpt`` orders like ``fcfs``; with one generation instance every dispatch policy sends
everything to it), and candidates whose model does not fit the hardware at
their tensor parallelism are left out. The input spec's own configuration is a candidate
unless it breaks the constraints (:mod:`experiments.advise_bounds`), so the search can only
improve on it.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from policies.cluster import GenerationPool
from policies.dispatch import DISPATCH, NEEDS_LENGTHS
from policies.length_readers import reads_lengths
from policies.modes import MODES
from policies.spec import PipelineSection, RunSpec, spec_from_dict

DEFAULT_LAGS = (1, 2, 4)
DEFAULT_TPS = (1, 2, 4, 8)
SPLIT_PARTS = 8  # the trainer's share moves in steps of 1/8 of its group (plus Alg. 1's split)


@dataclass(frozen=True, slots=True)
class GpuGroup:
    hardware: str
    datacenter: str
    num_gpus: int


@dataclass(frozen=True, slots=True)
class Inventory:
    groups: tuple[GpuGroup, ...]

    @classmethod
    def of(cls, spec: RunSpec) -> Inventory:
        counts: dict[tuple[str, str], int] = {}
        pools = [(p.hardware, p.datacenter, p.num_gpus) for p in spec.cluster.generation]
        t = spec.cluster.trainer
        for hw, dc, n in [*pools, (t.hardware, t.datacenter, t.num_gpus)]:
            counts[(hw, dc)] = counts.get((hw, dc), 0) + n
        return cls(tuple(GpuGroup(hw, dc, n) for (hw, dc), n in counts.items()))

    @property
    def num_gpus(self) -> int:
        return sum(g.num_gpus for g in self.groups)


@dataclass(frozen=True, slots=True, order=True)
class Structure:
    """Where the GPUs go and how generation runs; ``trainer_gpus == 0`` means colocated."""

    mode: str
    lag: int | None  # pipeline: max_lag; conventional: steps_per_generation - 1; else None
    tp: int
    trainer_group: int
    trainer_gpus: int
    generation_gpus: tuple[int, ...]  # per inventory group
    max_num_seqs: int

    @property
    def colocated(self) -> bool:
        return self.trainer_gpus == 0

    @property
    def num_gpus(self) -> int:
        return sum(self.generation_gpus) + self.trainer_gpus

    @property
    def num_instances(self) -> int:
        return sum(n // self.tp for n in self.generation_gpus)

    @property
    def mode_variant(self) -> str:
        return self.mode if self.lag is None else f"{self.mode}:{self.lag}"

    @property
    def staleness_bound(self) -> int:
        traits = MODES.get(self.mode)
        if traits.conventional or traits.max_lag is None:
            return self.lag or 0
        return traits.max_lag


@dataclass(frozen=True, slots=True, order=True)
class PolicyChoice:
    dispatch: str
    scheduling: str
    predictor: str

    @property
    def key(self) -> str:
        return f"{self.dispatch}/{self.scheduling}/{self.predictor}"


@dataclass(frozen=True, slots=True, order=True)
class Candidate:
    structure: Structure
    policies: PolicyChoice

    def label(self, inventory: Inventory) -> str:
        s, p = self.structure, self.policies
        place = "colocated" if s.colocated else split_label(s, inventory)
        return f"{s.mode_variant} tp{s.tp} {place} seqs{s.max_num_seqs} {p.key}"

    def columns(self, inventory: Inventory) -> dict[str, Any]:
        """Flat config columns for tables (pareto.csv, the grid fixture)."""
        s, p = self.structure, self.policies
        return {
            "mode": s.mode,
            "lag": s.lag,
            "tp": s.tp,
            "placement": "colocated" if s.colocated else split_label(s, inventory),
            "trainer_gpus": s.trainer_gpus,
            "generation_gpus": "+".join(str(n) for n in s.generation_gpus),
            "max_num_seqs": s.max_num_seqs,
            "dispatch": p.dispatch,
            "scheduling": p.scheduling,
            "predictor": p.predictor,
        }


def split_label(s: Structure, inventory: Inventory) -> str:
    gen = "+".join(
        f"{n}{g.hardware}@{g.datacenter}" for n, g in zip(s.generation_gpus, inventory.groups) if n
    )
    t = inventory.groups[s.trainer_group]
    return f"gen {gen} / train {s.trainer_gpus}{t.hardware}@{t.datacenter}"


@dataclass(frozen=True, slots=True)
class SearchAxes:
    """The values each dimension may take (defaults: :func:`default_axes`)."""

    modes: tuple[str, ...]
    lags: tuple[int, ...]
    tps: tuple[int, ...]
    max_num_seqs: tuple[int, ...]
    dispatches: tuple[str, ...]
    schedulings: tuple[str, ...]
    predictors: tuple[str, ...]
    max_staleness: int
    split_parts: int = SPLIT_PARTS
    partial: bool = False  # also leave GPUs unused (only worth it for cost-normalized)
    iterations: int = 0  # the run's: conventional's steps_per_generation must divide it
    extra_splits: dict[int, tuple[int, ...]] = field(default_factory=dict)  # tp -> trainer GPUs


# -- spec <-> candidate -----------------------------------------------------------------------


def candidate_spec(base: RunSpec, c: Candidate) -> RunSpec:
    """The complete spec of ``c``: the input spec with this candidate's choices set."""
    data = base.model_dump(mode="json")
    data["cluster"].update(_cluster(base, c.structure))
    data["pipeline"].update(_pipeline(base, c.structure))
    data["policies"].update(
        dispatch=c.policies.dispatch,
        scheduling=c.policies.scheduling,
        length_predictor=c.policies.predictor,
        allocation="fixed",
    )
    if c.policies.predictor != "ranker":  # the file is the ranker's alone (policies.spec)
        data["policies"]["ranker_path"] = None
    return spec_from_dict(data)


def _cluster(base: RunSpec, s: Structure) -> dict[str, Any]:
    inv = Inventory.of(base)
    pool0 = base.cluster.generation[0]
    if s.colocated:  # the sim shares every GPU; any split with whole instances says so
        g = inv.groups[0]
        pool = _pool(pool0, g, g.num_gpus - s.tp, s)
        trainer = {"hardware": g.hardware, "datacenter": g.datacenter, "num_gpus": s.tp}
        return {"generation": [pool], "trainer": trainer}
    pools = [_pool(pool0, g, n, s) for g, n in zip(inv.groups, s.generation_gpus) if n]
    t = inv.groups[s.trainer_group]
    trainer = {"hardware": t.hardware, "datacenter": t.datacenter, "num_gpus": s.trainer_gpus}
    return {"generation": pools, "trainer": trainer}


def _pool(template: GenerationPool, g: GpuGroup, n: int, s: Structure) -> dict[str, Any]:
    data = template.model_dump(mode="json")
    data.update(hardware=g.hardware, datacenter=g.datacenter, num_gpus=n, tp=s.tp)
    data["max_num_seqs"] = s.max_num_seqs
    return data


def _pipeline(base: RunSpec, s: Structure) -> dict[str, Any]:
    traits = MODES.get(s.mode)
    out: dict[str, Any] = {"mode": s.mode}
    default_lag = PipelineSection.model_fields["max_lag"].default
    out["max_lag"] = s.lag if traits.max_lag is None and not traits.conventional else default_lag
    out["steps_per_generation"] = (s.lag or 0) + 1 if traits.conventional else 1
    return out


def input_candidate(base: RunSpec, resolved: RunSpec) -> Candidate | None:
    """The input spec as a candidate (``resolved``: its cluster after allocation), or None
    when it is not expressible (pools with different tp or max_num_seqs)."""
    pools = resolved.cluster.generation
    if len({(p.tp, p.max_num_seqs) for p in pools}) != 1:
        return None
    mode = base.pipeline.mode
    traits = MODES.get(mode)
    lag = None
    if traits.conventional:
        lag = base.pipeline.steps_per_generation - 1
    elif traits.max_lag is None:
        lag = traits.staleness_bound(base.pipeline.max_lag, base.pipeline.steps_per_generation)
    p = base.policies
    policy = PolicyChoice(p.dispatch, p.scheduling, p.length_predictor)
    return Candidate(_input_structure(base, resolved, mode, lag), policy)


def _input_structure(base: RunSpec, resolved: RunSpec, mode: str, lag: int | None) -> Structure:
    inv = Inventory.of(base)
    pool = resolved.cluster.generation[0]
    if MODES.get(mode).colocated:
        return Structure(mode, lag, pool.tp, 0, 0, (inv.num_gpus,), pool.max_num_seqs)
    keys = [(g.hardware, g.datacenter) for g in inv.groups]
    gen = [0] * len(keys)
    for p in resolved.cluster.generation:
        gen[keys.index((p.hardware, p.datacenter))] += p.num_gpus
    t = resolved.cluster.trainer
    group = keys.index((t.hardware, t.datacenter))
    return Structure(mode, lag, pool.tp, group, t.num_gpus, tuple(gen), pool.max_num_seqs)


# -- enumeration -------------------------------------------------------------------------------


def mode_variants(axes: SearchAxes) -> list[tuple[str, int | None]]:
    """(mode, lag) pairs whose staleness bound is within ``axes.max_staleness``."""
    out: list[tuple[str, int | None]] = []
    for mode in axes.modes:
        traits = MODES.get(mode)
        lags: tuple[int | None, ...] = (
            axes.lags if traits.conventional or traits.max_lag is None else (None,)
        )
        for lag in lags:
            s = Structure(mode, lag, 1, 0, 1, (1,), 1)
            whole_waves = not traits.conventional or axes.iterations % ((lag or 0) + 1) == 0
            if s.staleness_bound <= axes.max_staleness and whole_waves:
                out.append((mode, lag))
    return out


def enumerate_structures(
    axes: SearchAxes, inv: Inventory, feasible_tp: dict[str, tuple[int, ...]]
) -> list[Structure]:
    """Every structure of the space; ``feasible_tp``: hardware -> tps the model fits."""
    out: list[Structure] = []
    for mode, lag in mode_variants(axes):
        colocated = MODES.get(mode).colocated
        for tp in axes.tps:
            if any(tp not in feasible_tp.get(g.hardware, ()) for g in inv.groups):
                continue
            for mns in axes.max_num_seqs:
                base = Structure(mode, lag, tp, 0, 0, (0,) * len(inv.groups), mns)
                if colocated:
                    if len(inv.groups) == 1 and inv.num_gpus % tp == 0:
                        out.append(replace(base, generation_gpus=(inv.num_gpus,)))
                    continue
                out.extend(_placements(base, axes, inv))
    return sorted(set(out))


def _placements(base: Structure, axes: SearchAxes, inv: Inventory) -> list[Structure]:
    out = []
    for group, g in enumerate(inv.groups):
        others = [(h.num_gpus // base.tp) * base.tp for i, h in enumerate(inv.groups) if i != group]
        for trainer, gen in _splits(g.num_gpus, base.tp, axes, has_others=sum(others) > 0):
            gens = list(others)
            gens.insert(group, gen)
            if sum(gens) == 0:
                continue
            out.append(
                replace(
                    base, trainer_group=group, trainer_gpus=trainer, generation_gpus=tuple(gens)
                )
            )
    return out


def _splits(total: int, tp: int, axes: SearchAxes, has_others: bool) -> list[tuple[int, int]]:
    """(trainer GPUs, generation GPUs) of one group: the trainer's share on a grid of
    ``split_parts`` steps plus the extra splits (Alg. 1's, the input's), generation
    rounded down to whole instances and the rest to the trainer; with ``partial`` also
    fewer generation GPUs (some left idle)."""
    step = max(1, total // axes.split_parts)
    shares = set(range(step, total + (1 if has_others else 0), step))
    shares |= {t for t in axes.extra_splits.get(tp, ()) if 0 < t <= total}
    out = set()
    for share in shares:
        gen = ((total - share) // tp) * tp
        if gen <= 0 and not has_others:
            continue
        out.add((total - gen, gen))
        if axes.partial:
            out |= {(total - gen, g) for g in range(tp, gen, max(tp, (step // tp) * tp))}
    return sorted(out)


def enumerate_policies(axes: SearchAxes) -> list[PolicyChoice]:
    """Every combination the spec accepts: a dispatch that ranks by predicted length
    (skewness-aware) never goes without a length predictor."""
    return [
        PolicyChoice(d, s, p)
        for d in axes.dispatches
        for s in axes.schedulings
        for p in axes.predictors
        if _valid_pairing(d, p)
    ]


def _valid_pairing(dispatch: str, predictor: str) -> bool:
    return not (predictor == "none" and dispatch in NEEDS_LENGTHS)


def canonical(c: Candidate, prefer: PolicyChoice) -> Candidate:
    """The representative of ``c``'s equivalence class (see the module docstring): a
    predictor nothing reads is ``none`` (deployable, and the same run); any other choice
    that makes no difference takes ``prefer``'s value (the input spec's)."""
    p = c.policies
    one_instance = c.structure.num_instances == 1
    if not predictor_read(c):
        p = replace(p, predictor="none")
    if p.predictor == "none":
        p = replace(p, scheduling=prefer.scheduling if prefer.predictor == "none" else "fcfs")
    if one_instance:
        p = replace(p, dispatch=_any_dispatch(prefer.dispatch, p.predictor))
    return Candidate(c.structure, p)


def predictor_read(c: Candidate) -> bool:
    """Whether ``c``'s dispatch (moot on one instance) or scheduling reads predicted lengths."""
    one_instance = c.structure.num_instances == 1
    return reads_lengths(None if one_instance else c.policies.dispatch, c.policies.scheduling)


def _any_dispatch(prefer: str, predictor: str) -> str:
    """One instance: every dispatch is alike; ``prefer`` where it goes with ``predictor``."""
    if _valid_pairing(prefer, predictor):
        return prefer
    return min(d for d in DISPATCH.names() if _valid_pairing(d, predictor))


def enumerate_candidates(
    axes: SearchAxes,
    inv: Inventory,
    feasible_tp: dict[str, tuple[int, ...]],
    prefer: PolicyChoice,
) -> list[Candidate]:
    policies = enumerate_policies(axes)
    structures = enumerate_structures(axes, inv, feasible_tp)
    return sorted({canonical(Candidate(s, p), prefer) for s in structures for p in policies})
