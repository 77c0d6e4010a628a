"""The search: optimistic best-first over the candidates, on three levels of cost.

1. **Estimate** (no simulation): :mod:`experiments.advise_estimate` prices every
   structure from the cost model alone.
2. **Short run** (rung 0): two units of the schedule, extrapolated to the full run
   (:mod:`experiments.advise_eval`).
3. **Full run**: the spec's own ``run.iterations``; only these values are ever reported.

Every candidate carries an optimistic value ``U``: its full-run value once known; else
its short value times ``rho[mode]``, the largest full/short ratio seen in its mode (the
best short run of a mode with no such pair yet goes on to a full run first); else its estimate times ``rho`` and a learned factor.
The factor comes from ``log(short / estimate) = s[structure] + b[policy]`` fitted to the
short runs so far: ``b`` is what a policy choice costs relative to the best one (among
policies the runs connect through shared structures; counted only beyond ``POLICY_Z``
standard errors), ``s`` how close a structure comes to its estimate. An unrun candidate
gets its policy's ``b`` and ``max(0, highest s seen in its mode)`` plus the model's
largest residual: the
estimate is treated as an upper bound (it ignores dispatch skew, prefill and weight
pushes), raised where a run ever beat it. A mode or policy with no short run yet has
``U = inf`` and is explored first (highest estimate first).

Each step runs the candidate with the highest ``U`` one level further; but a short run
whose own value beats the best full run goes on to its full run first (the incumbent stays
current, which prunes more and leaves a good answer when the budget ends the search). The search stops
when no candidate's ``U`` exceeds the best full-run value (the best is then optimal as far
as the model's observed errors go), or when the budget runs out; candidates whose ``U``
is below the best at that point count as ruled out, the rest as not covered.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, wait
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np
from scipy.sparse import coo_matrix
from scipy.sparse.csgraph import connected_components

from experiments.advise_eval import Evaluation, short_iterations
from experiments.advise_space import Candidate

PRIOR_RHO = 1.1  # full / short before any pair is seen
RHO_MARGIN = 1.005
MIN_LOG_MARGIN = math.log(1.02)
POLICY_Z = 2.0  # standard errors a policy's fitted cost must clear before it prunes
BACKFIT_SWEEPS = 200
GRACE_S = 10.0  # past the deadline, for runs started before it


class Evaluator(Protocol):
    workers: int

    def submit(self, c: Candidate, iterations: int) -> Future[Evaluation]: ...


@dataclass(frozen=True, slots=True)
class SearchConfig:
    objective: str
    full_iterations: int
    deadline_s: float  # time.monotonic() value
    first: tuple[Candidate, ...] = ()  # run in full before anything else (the input spec)


@dataclass(slots=True)
class Progress:
    num_candidates: int
    num_resolved: int
    num_short: int
    num_full: int
    best: Candidate | None
    best_value: float | None


@dataclass(slots=True)
class SearchResult:
    candidates: list[Candidate]
    evaluations: list[Evaluation]
    best: Candidate | None
    best_value: float | None
    num_ruled_out: int
    num_open: int  # could still beat the best but were not run (budget)
    finished: bool  # stopped because nothing could beat the best, not by the budget
    wall_s: float
    full_values: dict[Candidate, float] = field(default_factory=dict)

    @property
    def num_short(self) -> int:
        return sum(1 for e in self.evaluations if e.iterations < self.full_iterations)

    @property
    def num_full(self) -> int:
        return len(self.evaluations) - self.num_short

    @property
    def full_iterations(self) -> int:
        return max((e.iterations for e in self.evaluations), default=0)

    @property
    def coverage(self) -> float:
        """Share of the space either run in full or ruled out by its optimistic value."""
        done = len(self.full_values) + self.num_ruled_out
        return done / len(self.candidates) if self.candidates else 1.0


class SearchState:
    """Per candidate: estimate, short and full values, flags; all as numpy arrays."""

    def __init__(self, candidates: Sequence[Candidate], estimates: Sequence[float]) -> None:
        self.candidates = list(candidates)
        self.index = {c: i for i, c in enumerate(self.candidates)}
        n = len(self.candidates)
        self.estimate = np.asarray(estimates, float)
        self.short = np.full(n, np.nan)
        self.full = np.full(n, np.nan)
        self.failed = np.zeros(n, bool)
        self.in_flight = np.zeros(n, bool)
        modes = sorted({c.structure.mode_variant for c in self.candidates})
        policies = sorted({c.policies.key for c in self.candidates})
        self.mode_idx = np.array([modes.index(c.structure.mode_variant) for c in self.candidates])
        self.policy_idx = np.array([policies.index(c.policies.key) for c in self.candidates])
        self.num_modes, self.num_policies = len(modes), len(policies)
        structures = {
            st: k for k, st in enumerate(dict.fromkeys(c.structure for c in self.candidates))
        }
        self.structure_idx = np.array([structures[c.structure] for c in self.candidates])
        self.num_structures = len(structures)
        self.structure_mode = np.zeros(self.num_structures, int)
        self.structure_mode[self.structure_idx] = self.mode_idx

    def best(self) -> tuple[int | None, float]:
        if np.all(np.isnan(self.full)):
            return None, -math.inf
        i = int(np.nanargmax(self.full))
        return i, float(self.full[i])

    def upper(self) -> np.ndarray:
        """``U`` of every candidate (see the module docstring)."""
        rho = self._rho()[self.mode_idx]
        ceiling, effect, known_mode, known_policy = self._fit()
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            pred = self.estimate * np.exp(ceiling[self.mode_idx] + effect[self.policy_idx]) * rho
        known = known_mode[self.mode_idx] & known_policy[self.policy_idx]
        u = np.where(known, pred, np.inf)
        u = np.where(np.isnan(self.short), u, self.short * rho)
        u[self._scouts()] = np.inf
        u = np.where(np.isnan(self.full), u, self.full)
        return np.where(self.failed, -np.inf, u)

    def _scouts(self) -> np.ndarray:
        """Per mode with no full run after a short one yet, its best short run: it goes on to
        a full run, so that the mode's own full/short ratio is known."""
        paired = ~np.isnan(self.short) & ~np.isnan(self.full)
        have = np.bincount(self.mode_idx[paired], minlength=self.num_modes) > 0
        out = []
        for m in np.flatnonzero(~have):
            open_ = np.flatnonzero((self.mode_idx == m) & ~np.isnan(self.short) & ~self.failed)
            if open_.size:
                out.append(open_[np.argmax(self.short[open_])])
        return np.array(out, int)

    def _rho(self) -> np.ndarray:
        pairs = ~np.isnan(self.short) & ~np.isnan(self.full) & (self.short > 0)
        ratios = self.full[pairs] / self.short[pairs]
        default = float(ratios.max()) * RHO_MARGIN if ratios.size else PRIOR_RHO
        rho = np.full(self.num_modes, default)
        for m in np.unique(self.mode_idx[pairs]):
            rho[m] = float(ratios[self.mode_idx[pairs] == m].max()) * RHO_MARGIN
        return rho

    def _fit(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """``log(short / estimate) = s[structure] + b[policy]`` by least squares, ``b`` shifted
        so the best policy of each connected part of the runs has 0. Returns per mode the
        ceiling ``max(0, max s)`` over its structures run so far plus the largest residual
        (the model's worst miss, at least ``MIN_LOG_MARGIN``), and per policy its cost
        ``min(0, b + POLICY_Z standard errors)``."""
        obs = np.flatnonzero(~np.isnan(self.short) & (self.short > 0) & (self.estimate > 0))
        ceiling = np.zeros(self.num_modes)
        effect = np.zeros(self.num_policies)
        known_mode = np.bincount(self.mode_idx[obs], minlength=self.num_modes) > 0
        known_policy = np.bincount(self.policy_idx[obs], minlength=self.num_policies) > 0
        if not obs.size:
            return ceiling, effect, known_mode, known_policy
        struct = self.structure_idx[obs]
        policy = self.policy_idx[obs]
        y = np.log(self.short[obs] / self.estimate[obs])
        s_effect, b = _two_way_fit(y, struct, policy, self.num_structures, self.num_policies)
        residual = y - s_effect[struct] - b[policy]
        margin = max(MIN_LOG_MARGIN, float(residual.max()))
        # b is known only up to a constant within each connected part of the runs' policy-
        # structure graph: each part's best policy is its 0
        part = _parts(struct, policy, self.num_structures, self.num_policies)
        shift = np.full(part.max() + 1, -np.inf)
        np.maximum.at(shift, part[: self.num_policies][known_policy], b[known_policy])
        seen = np.bincount(struct, minlength=self.num_structures) > 0
        # a policy's cost counts only beyond its own uncertainty (Z standard errors): a
        # policy seen in few runs, or values the model does not fit, prune nothing by policy
        dof = (
            seen.sum()
            + known_policy.sum()
            - np.unique(part[np.flatnonzero(np.r_[known_policy, seen])]).size
        )
        sigma = math.sqrt((residual**2).sum() / (y.size - dof)) if y.size > dof else math.inf
        n_policy = np.maximum(np.bincount(policy, minlength=self.num_policies), 1)
        slack = POLICY_Z * sigma / np.sqrt(n_policy)
        effect = np.where(
            known_policy, np.minimum(0.0, b - shift[part[: self.num_policies]] + slack), 0.0
        )
        modes = self.structure_mode
        s_effect = np.where(seen, s_effect + shift[part[self.num_policies :]], -np.inf)
        for m in np.unique(modes[seen]):
            ceiling[m] = max(0.0, float(s_effect[modes == m].max())) + margin
        return ceiling, effect, known_mode, known_policy


def _parts(
    structures: np.ndarray, policies: np.ndarray, num_structures: int, num_policies: int
) -> np.ndarray:
    """Connected part of every policy (first ``num_policies``) and structure (the rest) in
    the graph whose edges are the runs (a policy and a structure run together)."""
    n = num_policies + num_structures
    edges = coo_matrix(
        (np.ones(len(policies)), (policies, num_policies + structures)), shape=(n, n)
    )
    return connected_components(edges, directed=False)[1]


def _two_way_fit(
    y: np.ndarray, rows: np.ndarray, cols: np.ndarray, num_rows: int, num_cols: int
) -> tuple[np.ndarray, np.ndarray]:
    """Least squares of ``y = r[rows] + c[cols]`` by alternating means (backfitting): each
    sweep is exact for one side given the other, so it converges to a least-squares fit."""
    r, c = np.zeros(num_rows), np.zeros(num_cols)
    n_rows = np.maximum(np.bincount(rows, minlength=num_rows), 1)
    n_cols = np.maximum(np.bincount(cols, minlength=num_cols), 1)
    for _ in range(BACKFIT_SWEEPS):
        r = np.bincount(rows, y - c[cols], minlength=num_rows) / n_rows
        c_new = np.bincount(cols, y - r[rows], minlength=num_cols) / n_cols
        if np.abs(c_new - c).max() < 1e-9:
            return r, c_new
        c = c_new
    return r, c


def search(
    state: SearchState,
    evaluator: Evaluator,
    config: SearchConfig,
    on_progress: Callable[[Progress], None] | None = None,
) -> SearchResult:
    start = time.monotonic()
    runner = _Runner(state, evaluator, config, on_progress)
    finished = runner.run()
    return runner.result(finished, time.monotonic() - start)


class _Runner:
    def __init__(
        self,
        state: SearchState,
        evaluator: Evaluator,
        config: SearchConfig,
        on_progress: Callable[[Progress], None] | None,
    ) -> None:
        self.state = state
        self.evaluator = evaluator
        self.config = config
        self.on_progress = on_progress
        self.evaluations: list[Evaluation] = []
        self.futures: dict[Future[Evaluation], int] = {}
        self.first = [state.index[c] for c in config.first if c in state.index]
        self.first_set = set(self.first)
        self.s_per_iteration = 0.0  # running mean of simulated wall time per iteration

    def run(self) -> bool:
        """True when the search ran to its end, False when the budget stopped it."""
        while True:
            upper = self.state.upper()
            self._submit(upper)
            if not self.futures:
                return not self._open(upper).any()
            # a run was only started if it should end by the deadline: give it some grace
            left = self.config.deadline_s - time.monotonic() + GRACE_S
            done, _ = wait(list(self.futures), timeout=max(0.0, left), return_when=FIRST_COMPLETED)
            if not done:
                return False
            for future in done:
                self._record(self.futures.pop(future), future.result())

    def _open(self, upper: np.ndarray) -> np.ndarray:
        _, best = self.state.best()
        s = self.state
        return np.isnan(s.full) & ~s.failed & ~s.in_flight & (upper > best)

    def _submit(self, upper: np.ndarray) -> None:
        while len(self.futures) < self.evaluator.workers:
            i = self._next(upper)
            if i is None:
                return
            c = self.state.candidates[i]
            iterations = self._level(i)
            if time.monotonic() + iterations * self.s_per_iteration > self.config.deadline_s:
                return
            self.state.in_flight[i] = True
            self.futures[self.evaluator.submit(c, iterations)] = i

    def _next(self, upper: np.ndarray) -> int | None:
        while self.first:
            i = self.first.pop(0)
            if np.isnan(self.state.full[i]) and not self.state.in_flight[i]:
                return i
        open_ = self._open(upper)
        if not open_.any():
            return None
        incumbent = self._challenger(open_)
        if incumbent is not None:
            return incumbent
        key = np.where(open_, upper, -np.inf)
        top = np.flatnonzero(key == key.max())
        # ties (an unexplored policy or mode): a structure already run first, so that the
        # policy's effect is measured against the others, then the higher estimate
        s = self.state
        seen = np.isin(s.structure_idx[top], s.structure_idx[~np.isnan(s.short)])
        return int(top[np.lexsort((s.estimate[top], seen))[-1]])

    def _challenger(self, open_: np.ndarray) -> int | None:
        """The best short run, if its own value already beats the best full run: it goes
        on at once, so the incumbent stays current (and prunes more) even when the budget
        ends the search early."""
        s = self.state
        shorts = np.where(open_ & ~np.isnan(s.short), s.short, -np.inf)
        j = int(np.argmax(shorts))
        return j if shorts[j] > s.best()[1] else None

    def _level(self, i: int) -> int:
        """Short run first, unless it has one already or is to run in full first."""
        s = self.state
        short = short_iterations(s.candidates[i], self.config.full_iterations)
        if short and np.isnan(s.short[i]) and i not in self.first_set:
            return short
        return self.config.full_iterations

    def _record(self, i: int, e: Evaluation) -> None:
        s = self.state
        s.in_flight[i] = False
        self.evaluations.append(e)
        n = len(self.evaluations)
        self.s_per_iteration += (e.wall_s / max(1, e.iterations) - self.s_per_iteration) / n
        value = e.value(self.config.objective, self.config.full_iterations)
        if value is None:
            s.failed[i] = True
        elif e.iterations >= self.config.full_iterations:
            s.full[i] = value
            if not short_iterations(e.candidate, self.config.full_iterations):
                s.short[i] = value  # no shorter run exists: the full one stands in for it
        else:
            s.short[i] = value
        if self.on_progress is not None:
            self.on_progress(self._progress())

    def _progress(self) -> Progress:
        s = self.state
        i, best = s.best()
        upper = s.upper()
        resolved = int((~np.isnan(s.full) | s.failed | (upper <= best)).sum())
        return Progress(
            num_candidates=len(s.candidates),
            num_resolved=resolved,
            num_short=sum(
                1 for e in self.evaluations if e.iterations < self.config.full_iterations
            ),
            num_full=sum(
                1 for e in self.evaluations if e.iterations >= self.config.full_iterations
            ),
            best=None if i is None else s.candidates[i],
            best_value=None if i is None else best,
        )

    def result(self, finished: bool, wall_s: float) -> SearchResult:
        s = self.state
        i, best = s.best()
        upper = s.upper()
        not_full = np.isnan(s.full) & ~s.failed
        ruled_out = int((not_full & (upper <= best)).sum())
        full = {s.candidates[j]: float(s.full[j]) for j in np.flatnonzero(~np.isnan(s.full))}
        return SearchResult(
            candidates=s.candidates,
            evaluations=self.evaluations,
            best=None if i is None else s.candidates[i],
            best_value=None if i is None else best,
            num_ruled_out=ruled_out + int(s.failed.sum()),
            num_open=int((not_full & (upper > best)).sum()),
            finished=finished,
            wall_s=wall_s,
            full_values=full,
        )
