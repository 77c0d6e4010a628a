"""The exhaustive grid ``tandem advise`` is benchmarked against, saved as a small fixture.

    nice -n 19 python -m experiments.advise_grid streamrl-7b   # ~10-15 min on one core

simulates every candidate of the benchmark space of a shipped StreamRL spec at 20K
tokens (the space ``advise`` searches with :data:`BENCH_AXES`), in full and as the short
run the search would make, and writes ``tests/fixtures/advise_grid/NAME.csv`` (one row
per candidate: its configuration and both runs' figures) and ``NAME.json`` (the space,
the command, and a fingerprint of the simulator).

The fingerprint is behavioural: a few candidates' full-run throughputs (the input spec,
the grid's best) to the last digit, plus the candidate set itself. :func:`check_fixture`
re-simulates them; when the simulator or the space changed, it fails with the command
that regenerates the fixture, since the grid's figures are then stale.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import io
import itertools
import json
import logging
import multiprocessing
import multiprocessing.context
import resource
import time
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from experiments.advise_eval import METRIC_KEYS, Evaluation, run_candidate, short_iterations
from experiments.advise_plan import Space, SpaceOptions, plan_space
from experiments.advise_space import Candidate, PolicyChoice, Structure
from experiments.arg_types import path_text
from policies.results import write_atomic
from policies.spec import RunSpec, load_spec

logger = logging.getLogger(__name__)

FIXTURES = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "advise_grid"
BENCH_SPECS = ("streamrl-7b", "streamrl-32b", "streamrl-72b")
BENCH_SETS = ("workload.max_output_tokens=20000",)
BENCH_AXES = ("max_num_seqs=256", "dispatch=least-loaded,skewness-aware", "predictor=oracle")
PROBE_REL_TOL = 1e-9
FIXTURE_METRICS = (
    "throughput_samples_per_s",
    "cost_normalized_throughput",
    "max_staleness",
    "num_samples_trained",
)  # what the replay and the benchmark read; the rest of a run's metrics stay out


class FixtureStale(RuntimeError):
    """The simulator or the space changed since the fixture was generated."""


def regenerate_command(name: str) -> str:
    return f"nice -n 19 python -m experiments.advise_grid {name}"


def bench_spec(name: str) -> RunSpec:
    from experiments.specs import config_path

    return load_spec(config_path(name), list(BENCH_SETS))


def bench_space(name: str) -> Space:
    return plan_space(bench_spec(name), SpaceOptions(axes=BENCH_AXES))


# -- candidate <-> row -------------------------------------------------------------------------


def candidate_key(c: Candidate) -> dict[str, Any]:
    s, p = c.structure, c.policies
    return {
        "mode": s.mode,
        "lag": -1 if s.lag is None else s.lag,
        "tp": s.tp,
        "trainer_group": s.trainer_group,
        "trainer_gpus": s.trainer_gpus,
        "generation_gpus": "+".join(str(n) for n in s.generation_gpus),
        "max_num_seqs": s.max_num_seqs,
        "dispatch": p.dispatch,
        "scheduling": p.scheduling,
        "predictor": p.predictor,
    }


def candidate_of(row: dict[str, Any]) -> Candidate:
    lag = int(row["lag"])
    gens = tuple(int(n) for n in str(row["generation_gpus"]).split("+"))
    structure = Structure(
        str(row["mode"]), None if lag < 0 else lag, int(row["tp"]), int(row["trainer_group"]),
        int(row["trainer_gpus"]), gens, int(row["max_num_seqs"]),
    )  # fmt: skip
    return Candidate(structure, PolicyChoice(row["dispatch"], row["scheduling"], row["predictor"]))


def space_digest(candidates: tuple[Candidate, ...] | list[Candidate]) -> str:
    text = json.dumps([candidate_key(c) for c in sorted(candidates)], sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


# -- generation ------------------------------------------------------------------------------


def grid_row(c: Candidate, full: Evaluation, short: Evaluation | None) -> dict[str, Any]:
    row: dict[str, Any] = candidate_key(c)
    for prefix, e in (("full_", full), ("short_", short)):
        if e is not None:
            kept = {
                k: v for k, v in e.to_row().items() if k not in METRIC_KEYS or k in FIXTURE_METRICS
            }
            row.update({prefix + k: v for k, v in kept.items()})
    row.pop("full_step_end_s")  # only a short run's step ends are read (to extrapolate it)
    return row


def _grid_row(base: RunSpec, c: Candidate) -> dict[str, Any]:
    """One candidate's row: its full run, and the short run the search would make."""
    full_iterations = base.run.iterations
    iters = short_iterations(c, full_iterations)
    short = run_candidate(base, c, iters) if iters else None
    return grid_row(c, run_candidate(base, c, full_iterations), short)


def generate(name: str, out: Path, log: bool = True, workers: int = 1) -> Path:
    """Simulate every candidate of ``name``'s space (in ``workers`` processes; the rows
    keep the space's order) and write its fixture."""
    space = bench_space(name)
    rows: list[dict[str, Any]] = []
    cpu0 = time.process_time() + _children_cpu_s()
    with contextlib.ExitStack() as stack:
        if workers > 1:
            pool = stack.enter_context(ProcessPoolExecutor(workers, mp_context=_spawn()))
            made = pool.map(_grid_row, itertools.repeat(space.base), space.candidates)
        else:
            made = (_grid_row(space.base, c) for c in space.candidates)
        for n, row in enumerate(made, 1):
            rows.append(row)
            if log and (n % 25 == 0 or n == len(space.candidates)):
                cpu_s = time.process_time() + _children_cpu_s() - cpu0
                logger.info("%s: %d/%d (%.0f s cpu)", name, n, len(space.candidates), cpu_s)
    cpu_s = time.process_time() + _children_cpu_s() - cpu0
    frame = pd.DataFrame(rows)
    meta = _meta(name, space, frame, cpu_s)
    out.mkdir(parents=True, exist_ok=True)
    write_atomic(out / f"{name}.csv", frame.to_csv(index=False).encode())
    write_atomic(out / f"{name}.json", (json.dumps(meta, indent=1) + "\n").encode())
    return out / f"{name}.csv"


def _children_cpu_s() -> float:
    """CPU seconds of this process's finished children (a pool's, once it has shut down)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _spawn() -> multiprocessing.context.BaseContext:
    return multiprocessing.get_context("spawn")


def _meta(name: str, space: Space, frame: pd.DataFrame, cpu_s: float) -> dict[str, Any]:
    value = frame["full_throughput_samples_per_s"]
    best = frame.loc[value.idxmax()]
    probes = [candidate_of(best.to_dict())]
    if space.input is not None and not space.input_outside:  # outside: not on the grid
        probes.append(space.input)
    return {
        "spec": name,
        "sets": list(BENCH_SETS),
        "axes": list(BENCH_AXES),
        "objective": "throughput",
        "full_iterations": space.base.run.iterations,
        "num_candidates": len(space.candidates),
        "space_digest": space_digest(space.candidates),
        "best": {
            **candidate_key(probes[0]),
            "throughput_samples_per_s": float(best["full_throughput_samples_per_s"]),
        },
        "probes": [
            {**candidate_key(p), "throughput_samples_per_s": _full_value(frame, p)} for p in probes
        ],
        "command": regenerate_command(name),
        "cpu_s": round(cpu_s, 1),
        "generated": time.strftime("%Y-%m-%d %H:%M:%S"),
    }


def _full_value(frame: pd.DataFrame, c: Candidate) -> float:
    key = candidate_key(c)
    mask = pd.Series(True, index=frame.index)
    for k, v in key.items():
        mask &= frame[k].astype(str) == str(v)
    return float(frame.loc[mask, "full_throughput_samples_per_s"].iloc[0])


# -- reading and checking -----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Fixture:
    name: str
    meta: dict[str, Any]
    frame: pd.DataFrame

    @property
    def best_value(self) -> float:
        return float(self.meta["best"]["throughput_samples_per_s"])

    def full_values(self) -> dict[Candidate, float]:
        return {
            candidate_of(r): float(r["full_throughput_samples_per_s"])
            for r in self.frame.to_dict("records")
        }


class ReplayEvaluator:
    """An evaluator answering from a fixture instead of simulating (for tests of the search:
    same values as the simulator gave, in no time)."""

    workers = 1

    def __init__(self, fixture: Fixture) -> None:
        self.rows = {candidate_of(r): r for r in fixture.frame.to_dict("records")}
        self.full_iterations = int(fixture.meta["full_iterations"])
        self.calls: list[tuple[Candidate, int]] = []

    def submit(self, c: Candidate, iterations: int) -> Future[Evaluation]:
        self.calls.append((c, iterations))
        future: Future[Evaluation] = Future()
        future.set_result(self._evaluation(c, iterations))
        return future

    def _evaluation(self, c: Candidate, iterations: int) -> Evaluation:
        row = self.rows.get(c)
        if row is None:
            return Evaluation(c, iterations, {}, (), 0.0, "not in the fixture")
        prefix = "full_" if iterations >= self.full_iterations else "short_"
        metrics = {k: _number(row.get(prefix + k)) for k in METRIC_KEYS}
        ends = tuple(json.loads(row.get(prefix + "step_end_s") or "[]"))
        error = row.get(prefix + "error")
        return Evaluation(
            c, iterations, metrics, ends, 0.0, error if isinstance(error, str) else None
        )


def _number(value: Any) -> float | None:
    return None if value is None or pd.isna(value) else float(value)


def load_fixture(name: str, root: Path = FIXTURES) -> Fixture:
    csv, meta = root / f"{name}.csv", root / f"{name}.json"
    if not csv.exists() or not meta.exists():
        raise FileNotFoundError(
            f"no grid fixture for {name} in {root}; generate it with: {regenerate_command(name)}"
        )
    frame = pd.read_csv(io.StringIO(csv.read_text()), keep_default_na=True)
    return Fixture(name, json.loads(meta.read_text()), frame)


def check_fixture(fixture: Fixture) -> Space:
    """Raise :class:`FixtureStale` unless the space and the probes' throughputs are unchanged."""
    name = fixture.name
    space = bench_space(name)
    if space_digest(space.candidates) != fixture.meta["space_digest"]:
        raise FixtureStale(
            f"the benchmark space of {name} changed since its grid fixture was generated "
            f"({len(space.candidates)} candidates now, {fixture.meta['num_candidates']} then); "
            f"regenerate the fixture with: {regenerate_command(name)}"
        )
    for probe in fixture.meta["probes"]:
        c = candidate_of(probe)
        now = run_candidate(space.base, c, fixture.meta["full_iterations"]).metrics.get(
            "throughput_samples_per_s"
        )
        then = float(probe["throughput_samples_per_s"])
        if now is None or abs(now - then) > PROBE_REL_TOL * abs(then):
            raise FixtureStale(
                f"the simulator changed since the grid fixture of {name} was generated "
                f"({c.label(space.inventory)}: {then!r} samples/s then, {now!r} now); "
                f"regenerate the fixture with: {regenerate_command(name)}"
            )
    return space


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m experiments.advise_grid", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("names", nargs="+", choices=BENCH_SPECS)
    parser.add_argument("--out", type=path_text, default=str(FIXTURES), help="fixture directory")
    parser.add_argument("--workers", type=int, default=1, help="simulation processes")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    for name in args.names:
        print(f"wrote {generate(name, Path(args.out), workers=args.workers)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
