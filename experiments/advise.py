"""``tandem advise``: search the configuration space with the simulator; hand back a spec.

Pipeline mode and lag, the generation/training split (and which datacenter trains when
the spec has several GPU groups), tensor parallelism, ``max_num_seqs``, dispatch,
scheduling and length predictor (:mod:`experiments.advise_space`) are searched by
optimistic best-first search over cost-model estimates, short runs and full runs
(:mod:`experiments.advise_search`), in the sweep's kind of worker processes. The input
spec is always run in full first. What is left of the budget after the search
(:data:`ATTRIBUTION_SHARE` of it is kept) prices each change the advice makes, one at a
time, from both ends: on the input spec alone, and reverted on the advice.

Only configurations inside the space (:mod:`experiments.advise_bounds`: the staleness
bound and every ``--axis``) are ever the advice; a pricing run outside it is shown, not
chosen.

Writes to ``--out`` (:mod:`experiments.advise_report`): ``best.yaml`` (a complete spec for
``tandem run``), ``input.yaml`` (the resolved input spec), ``pareto.csv``, ``pareto.png``,
``evaluations.csv`` (every simulation), ``advice.md`` and ``status.json``. Stopped by
Ctrl-C or SIGTERM, :func:`advise` raises :class:`experiments.advise_partial.AdviseInterrupted`
with the simulations so far.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from enum import StrEnum

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn
from rich.progress import Progress as Bar

from experiments.advise_eval import Evaluation, PoolEvaluator
from experiments.advise_partial import AdviseInterrupted, NoFullRun, PartialAdvice, Recorded
from experiments.advise_plan import Space, SpaceOptions, plan_space
from experiments.advise_search import (
    Evaluator,
    Progress,
    SearchConfig,
    SearchResult,
    SearchState,
    search,
)
from experiments.advise_space import Candidate, candidate_spec, canonical
from policies.spec import RunSpec

ATTRIBUTION_SHARE = 0.15  # of the budget, kept for pricing each change
MAX_SETTLE_ROUNDS = 3  # a pricing run that beats the advice replaces it, this many times
GRACE_S = 10.0  # past the budget, for runs started before it
DIMENSIONS = ("mode", "tp", "placement", "max_num_seqs", "dispatch", "scheduling", "predictor")


@dataclass(frozen=True, slots=True)
class AdviseOptions:
    space: SpaceOptions = SpaceOptions()
    budget_s: float = 60.0
    workers: int = 2

    def __post_init__(self) -> None:
        if self.budget_s <= 0:
            raise ValueError(f"--budget-s must be positive, got {self.budget_s}")
        if self.workers < 1:
            raise ValueError(f"--workers must be at least 1, got {self.workers}")


class Unpriced(StrEnum):
    """Why one end of a change has no figure."""

    NOT_RUNNABLE = "not runnable that way"  # e.g. a split not whole instances at that tp
    NO_BUDGET = "not measured: the budget ran out"
    FAILED = "its run failed"
    NO_VALUE = "its run has no value for the objective"


@dataclass(frozen=True, slots=True)
class Change:
    """One dimension the advice changes, priced by full runs from both ends."""

    dimension: str
    before: str
    after: str
    alone: float | None  # the input spec with only this change
    reverted: float | None  # the advice with only this change undone
    alone_why: Unpriced | None = None  # why ``alone`` is None
    reverted_why: Unpriced | None = None  # why ``reverted`` is None


@dataclass(slots=True)
class Advice:
    space: Space
    result: SearchResult
    input_value: float | None
    best: Candidate
    best_value: float
    changes: list[Change]
    evaluations: list[Evaluation]
    objective: str
    budget_s: float
    wall_s: float

    @property
    def best_spec(self) -> RunSpec:
        return candidate_spec(self.space.base, self.best)

    @property
    def num_simulations(self) -> int:
        return len(self.evaluations)


def advise(
    base: RunSpec,
    options: AdviseOptions,
    console: Console | None = None,
    evaluator: Evaluator | None = None,
) -> Advice:
    """Search; price the changes; return the advice (nothing is written here)."""
    start = time.monotonic()
    space = plan_space(base, options.space)
    own = evaluator is None
    given: Evaluator = evaluator if evaluator is not None else PoolEvaluator(base, options.workers)
    pool = Recorded(given)  # what has run, should Ctrl-C or SIGTERM stop it part-way
    objective = options.space.objective
    try:
        result = _search(space, pool, options, start, console)
        extra = _run_input_outside(space, pool) if space.input_outside else []
        if result.best is None:
            partial = _partial(space, pool.evaluations, options, time.monotonic() - start)
            raise NoFullRun(
                f"--budget-s {options.budget_s:g}: no candidate finished a full run within it; "
                "raise it",
                replace(partial, budget_ran_out=True),
            )
        evaluations = [*result.evaluations, *extra]
        best, changes = _settle(space, pool, objective, evaluations, start + options.budget_s)
    except KeyboardInterrupt as err:
        partial = _partial(space, pool.evaluations, options, time.monotonic() - start)
        raise AdviseInterrupted(str(err), partial) from err
    finally:
        if own:
            given.close()  # type: ignore[attr-defined]
    return Advice(
        space=space,
        result=result,
        input_value=_input_value(space, evaluations, objective),
        best=best,
        best_value=full_values(space, evaluations, objective)[best],
        changes=changes,
        evaluations=evaluations,
        objective=options.space.objective,
        budget_s=options.budget_s,
        wall_s=time.monotonic() - start,
    )


def _search(
    space: Space, pool: Evaluator, options: AdviseOptions, start: float, console: Console | None
) -> SearchResult:
    state = SearchState(space.candidates, space.estimates)
    deadline = start + options.budget_s * (1 - ATTRIBUTION_SHARE)
    first = () if space.input is None or space.input_outside else (space.input,)
    config = SearchConfig(options.space.objective, space.base.run.iterations, deadline, first)
    with _progress_bar(console, len(space.candidates)) as update:
        return search(state, pool, config, update)


class _progress_bar:
    """A rich progress bar over the candidates resolved, with the best so far."""

    def __init__(self, console: Console | None, total: int) -> None:
        self._bar = Bar(
            TextColumn("[bold]advise[/bold] {task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=console,
            disable=console is None,
            transient=False,
        )
        self._task = self._bar.add_task("starting", total=total)

    def __enter__(self) -> Callable[[Progress], None]:
        self._bar.__enter__()
        return self._update

    def __exit__(self, *exc: object) -> None:
        self._bar.__exit__(None, None, None)

    def _update(self, p: Progress) -> None:
        best = "—" if p.best_value is None else f"{p.best_value:.4g}"
        text = f"best {best} · {p.num_short} short + {p.num_full} full runs"
        self._bar.update(self._task, completed=p.num_resolved, description=text)


def _run_input_outside(space: Space, pool: Evaluator) -> list[Evaluation]:
    """The input spec, run in full although the constraints exclude it (for comparison)."""
    if space.input is None:
        return []
    return [pool.submit(space.input, space.base.run.iterations).result()]


def _partial(
    space: Space, evaluations: list[Evaluation], options: AdviseOptions, wall_s: float
) -> PartialAdvice:
    """The simulations so far, and the best full run inside the space among them."""
    objective = options.space.objective
    values = full_values(space, evaluations, objective)
    best = best_full(space, evaluations, objective) if values else None
    return PartialAdvice(
        space, list(evaluations), best, values.get(best) if best is not None else None,
        _input_value(space, evaluations, objective), objective, options.budget_s, wall_s,
    )  # fmt: skip


def _input_value(space: Space, evaluations: list[Evaluation], objective: str) -> float | None:
    full = space.base.run.iterations
    for e in evaluations:
        if e.candidate == space.input and e.iterations >= full:
            return e.value(objective, full)
    return None


# -- what each change buys ---------------------------------------------------------------------


def dimension_value(c: Candidate, dimension: str, space: Space) -> str:
    cols = c.columns(space.inventory)
    if dimension == "mode":
        return c.structure.mode_variant
    return str(cols[dimension])


def swap(target: Candidate, source: Candidate, dimension: str) -> Candidate:
    """``target`` with ``source``'s value of one dimension."""
    s, src = target.structure, source.structure
    if dimension == "mode":
        return replace(target, structure=replace(s, mode=src.mode, lag=src.lag))
    if dimension in ("tp", "max_num_seqs"):
        return replace(target, structure=replace(s, **{dimension: getattr(src, dimension)}))
    if dimension == "placement":
        placed = replace(
            s,
            trainer_group=src.trainer_group,
            trainer_gpus=src.trainer_gpus,
            generation_gpus=src.generation_gpus,
        )
        return replace(target, structure=placed)
    field = "predictor" if dimension == "predictor" else dimension
    return replace(
        target, policies=replace(target.policies, **{field: getattr(source.policies, field)})
    )


def full_values(
    space: Space, evaluations: list[Evaluation], objective: str
) -> dict[Candidate, float]:
    """The objective of every full run inside the space (within the staleness bound and every
    ``--axis``; a pricing run may carry a value outside it: never the advice)."""
    full = space.base.run.iterations
    out: dict[Candidate, float] = {}
    for e in evaluations:
        value = e.value(objective, full) if e.iterations >= full else None
        if value is not None and space.bounds.admits(e.candidate):
            out.setdefault(e.candidate, value)
    return out


def best_full(space: Space, evaluations: list[Evaluation], objective: str) -> Candidate:
    """The best full run; of exact ties, the one changing the fewest dimensions of the
    input spec (the simulator cannot tell them apart)."""
    values = full_values(space, evaluations, objective)
    top = max(values.values())
    ties = [c for c, v in values.items() if v == top]
    if space.input is None:
        return ties[0]
    return min(ties, key=lambda c: _num_changes(space, c))


def _settle(
    space: Space, pool: Evaluator, objective: str, evaluations: list[Evaluation], deadline: float
) -> tuple[Candidate, list[Change]]:
    """The best full run and what each of its changes buys. Pricing runs configurations the
    search did not; one that beats the best becomes the advice and is priced in turn."""
    best = best_full(space, evaluations, objective)
    for _ in range(MAX_SETTLE_ROUNDS):
        changes = _attribute(space, best, evaluations, pool, objective, deadline)
        better = best_full(space, evaluations, objective)
        if better == best:
            return best, changes
        best = better
    return best, _attribute(space, best, evaluations, pool, objective, deadline)


def _num_changes(space: Space, c: Candidate) -> int:
    assert space.input is not None
    return sum(
        dimension_value(space.input, d, space) != dimension_value(c, d, space) for d in DIMENSIONS
    )


def _attribute(
    space: Space,
    best: Candidate,
    evaluations: list[Evaluation],
    pool: Evaluator,
    objective: str,
    deadline: float,
) -> list[Change]:
    """Price every changed dimension (full runs; ``evaluations`` gains the new ones)."""
    if space.input is None:
        return []
    full = space.base.run.iterations
    known = {e.candidate: e for e in evaluations if e.iterations >= full}
    dims = [
        d for d in DIMENSIONS
        if dimension_value(space.input, d, space) != dimension_value(best, d, space)
    ]  # fmt: skip
    wanted = {(d, end): canonical(swap(*pair, d), space.prefer) for d in dims for end, pair in
              (("alone", (space.input, best)), ("reverted", (best, space.input)))}  # fmt: skip
    walls = [e.wall_s for e in known.values()]
    expected_s = sum(walls) / len(walls) if walls else 0.0
    missing = [c for c in wanted.values() if c not in known]
    runs = _run_missing(space, pool, missing, deadline, expected_s)
    new = [e for e in runs if e.ok]
    evaluations.extend(new)
    known.update({e.candidate: e for e in new})
    failed = {e.candidate for e in runs if not e.ok}
    priced = {k: _price(space, c, known, failed, objective) for k, c in wanted.items()}
    return [
        Change(d, dimension_value(space.input, d, space), dimension_value(best, d, space),
               priced[(d, "alone")][0], priced[(d, "reverted")][0],
               priced[(d, "alone")][1], priced[(d, "reverted")][1])
        for d in dims
    ]  # fmt: skip


def _price(
    space: Space,
    c: Candidate,
    known: dict[Candidate, Evaluation],
    failed: set[Candidate],
    objective: str,
) -> tuple[float | None, Unpriced | None]:
    """``c``'s full-run value, or None and why there is none."""
    if c in known:
        value = known[c].value(objective, space.base.run.iterations)
        return (value, None) if value is not None else (None, Unpriced.NO_VALUE)
    if not _runnable(space, c):
        return None, Unpriced.NOT_RUNNABLE
    return None, Unpriced.FAILED if c in failed else Unpriced.NO_BUDGET


def _runnable(space: Space, c: Candidate) -> bool:
    try:
        candidate_spec(space.base, c)
    except ValueError:  # e.g. a split that is not whole instances at the other tp
        return False
    return True


def _run_missing(
    space: Space, pool: Evaluator, missing: list[Candidate], deadline: float, expected_s: float
) -> list[Evaluation]:
    """Full runs of ``missing`` expected to end by ``deadline`` (others are left out),
    failed ones included."""
    full = space.base.run.iterations
    runnable = [c for c in dict.fromkeys(missing) if _runnable(space, c)]
    now = time.monotonic()  # they queue: the k-th starts after k / workers runs
    fits = [
        c for k, c in enumerate(runnable) if now + (k // pool.workers + 1) * expected_s < deadline
    ]
    futures = [pool.submit(c, full) for c in fits]
    out = []
    for future in futures:
        try:
            e = future.result(timeout=max(0.0, deadline + GRACE_S - time.monotonic()))
        except TimeoutError:
            continue
        out.append(e)
    return out
