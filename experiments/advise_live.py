"""``tandem advise --live-check N``: run the advice's top N and the input spec live, with
paired seeds, and say whether the live order agrees with the predicted one.

Every configuration runs ``repeats`` times live on one shared generation server (as
``tandem fidelity`` does: started once, warmed up, checkpoints off), repeat ``r`` with
seed ``run.seed + r`` for all of them, the order of configurations rotated per repeat so
drift on the machine spreads over all of them. Each live run also gets its sim twin (the
calibrated sim replaying that run's lengths, :func:`experiments.fidelity.simulate_twin`).
Live runs and twins rank with the spec's ranker (a file of ``policies.ranker_path``, as
``tandem run`` does: :func:`experiments.runs.run_live_ranked`), and record its source and
quality in their metrics.json.

The predicted order is the search's (full simulated runs of the spec as given); the
report sets it against the order of the live medians, against every seed's own live
order, and against the twins' order, with each configuration's live spread.
"""

from __future__ import annotations

import io
import itertools
import secrets
import statistics
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
from rich.console import Console

from experiments.advise import Advice
from experiments.advise_space import Candidate, candidate_spec
from experiments.arg_types import path_text
from experiments.fidelity_plan import NO_CHECKPOINTS
from policies.results import write_atomic
from policies.spec import RunSpec

THROUGHPUT = "throughput_samples_per_s"


@dataclass(frozen=True, slots=True)
class LivePlan:
    top: int = 3
    repeats: int = 3

    def __post_init__(self) -> None:
        if self.top < 1 or self.repeats < 1:
            raise ValueError("--live-check and --live-repeats must be at least 1")


@dataclass(slots=True)
class LiveCheck:
    names: list[str]  # configurations, in predicted order (best first)
    predicted: dict[str, float]
    live: dict[str, list[float]] = field(default_factory=dict)  # per repeat
    twin: dict[str, list[float]] = field(default_factory=dict)

    def median(self, name: str) -> float:
        return float(statistics.median(self.live[name]))

    def live_order(self) -> list[str]:
        return sorted(self.names, key=lambda n: -self.median(n))

    def seed_orders(self) -> list[list[str]]:
        repeats = min(len(v) for v in self.live.values())
        return [sorted(self.names, key=lambda n: -self.live[n][r]) for r in range(repeats)]

    def twin_order(self) -> list[str]:
        return sorted(self.names, key=lambda n: -statistics.median(self.twin[n]))

    def agrees(self) -> bool:
        return self.live_order() == self.names

    def pair_agreement(self, order: list[str]) -> tuple[int, int]:
        """Pairs of configurations ``order`` ranks as the prediction does, of all pairs."""
        pairs = list(itertools.combinations(self.names, 2))  # predicted: first > second
        same = sum(1 for a, b in pairs if order.index(a) < order.index(b))
        return same, len(pairs)

    def summary(self) -> str:
        same, total = self.pair_agreement(self.live_order())
        verdict = "agrees with" if self.agrees() else "differs from"
        return (
            f"live check: the live order {verdict} the predicted order "
            f"({same}/{total} pairs alike by medians over {len(self.seed_orders())} seeds)"
        )


def picks(advice: Advice, top: int) -> list[tuple[str, Candidate, float]]:
    """The top ``top`` full runs with distinct simulated values and the input, best first.
    An exact tie in the sim cannot be ordered, so of tied runs one stands for all: the
    input or the advice when either is among them. A pricing run outside the space is none."""
    full = advice.space.base.run.iterations
    values: dict[Candidate, float] = {}
    for e in advice.evaluations:
        value = e.value(advice.objective, full) if e.iterations >= full else None
        inside = advice.space.bounds.admits(e.candidate) or e.candidate == advice.space.input
        if value is not None and inside:
            values.setdefault(e.candidate, value)
    preferred = [c for c in (advice.space.input, advice.best) if c in values]
    by_value: dict[float, Candidate] = {}
    for c in [*preferred, *sorted(values, key=lambda c: -values[c])]:
        by_value.setdefault(values[c], c)
    ranked = sorted(by_value.items(), key=lambda kv: -kv[0])
    chosen = ranked[:top]
    the_input = advice.space.input
    if the_input in values and values[the_input] not in dict(chosen):
        chosen.append((values[the_input], the_input))
    out = []
    for rank, (value, c) in enumerate(chosen, 1):
        tag = " (input)" if c == the_input else " (advice)" if c == advice.best else ""
        out.append((f"#{rank} {c.label(advice.space.inventory)}{tag}", c, value))
    return out


def live_spec(base: RunSpec, c: Candidate, url: str, token: str, repeat: int) -> RunSpec:
    data = candidate_spec(base, c).model_dump(mode="json")
    data["run"]["seed"] = base.run.seed + repeat
    data["live"] |= {"server_urls": [url], "token": token, "checkpoint_every": NO_CHECKPOINTS}
    return RunSpec.model_validate(data)


def _cost_model_dir(base: RunSpec) -> Path:
    if not base.sim.cost_model.startswith("profiled:"):
        raise ValueError(
            "the live check compares with the calibrated sim: set sim.cost_model=profiled:DIR "
            "(tandem profile + tandem calibrate, docs/fidelity.md)"
        )
    return Path(base.sim.cost_model.removeprefix("profiled:"))


def check_live_spec(base: RunSpec) -> Path:
    """What the live check needs of the input spec, checked before the search (it ran
    the whole search, then refused); returns the calibrated cost model's directory. A
    ranker file is checked for the sim: the live runs' twins rank with it too."""
    from experiments.ranker_source import check_ranker_path

    if base.live.num_servers != 1 or base.live.server_urls:
        raise ValueError("the live check starts one server itself: live.num_servers must be 1")
    check_ranker_path(base, live=False)
    return _cost_model_dir(base)


def live_check(
    advice: Advice, plan: LivePlan, out: Path, console: Console | None = None
) -> LiveCheck:
    base = advice.space.base
    cost_dir = check_live_spec(base)
    chosen = picks(advice, plan.top)
    if len({c.structure.max_num_seqs for _, c, _ in chosen}) != 1:
        raise ValueError("the live check shares one server: restrict with --axis max_num_seqs=N")
    check = LiveCheck([n for n, _, _ in chosen], {n: v for n, _, v in chosen})
    out.mkdir(parents=True, exist_ok=True)
    _run_all(base, chosen, plan.repeats, out, cost_dir, check, console)
    write_live_report(check, out)
    return check


def _run_all(base, chosen, repeats, out, cost_dir, check, console) -> None:  # noqa: ANN001
    from experiments.fidelity import simulate_twin
    from experiments.runs import run_live_ranked
    from runtime.live_run import model_dir_for
    from runtime.procs import free_port, split_cores, start_server, stop_server, wait_healthy
    from runtime.profile_bursts import warm_up_server

    token, live = secrets.token_hex(8), base.live
    mns = chosen[0][1].structure.max_num_seqs
    server = start_server(
        0, model_dir_for(base), "127.0.0.1", free_port(), token, split_cores(1)[0],
        live.kv_cache_gib, live.max_model_len, mns, out / "logs",
    )  # fmt: skip
    try:
        wait_healthy(server, live.startup_timeout_s)
        warm_up_server(server.base_url, base)
        for r in range(repeats):
            for k in range(len(chosen)):
                name, c, _ = chosen[(k + r) % len(chosen)]
                spec = live_spec(base, c, server.base_url, token, r)
                case = out / "cases" / f"config-{check.names.index(name) + 1}" / f"repeat-{r}"
                result = run_live_ranked(spec, case / "live")
                twin = simulate_twin(result, case, cost_dir)
                check.live.setdefault(name, []).append(result.metrics[THROUGHPUT])
                check.twin.setdefault(name, []).append(twin.metrics[THROUGHPUT])
                if console is not None:
                    console.print(
                        f"{name} seed {spec.run.seed}: live {result.metrics[THROUGHPUT]:.3f}, twin {twin.metrics[THROUGHPUT]:.3f} samples/s"
                    )
    finally:
        stop_server(server)


def live_frame(check: LiveCheck) -> pd.DataFrame:
    rows = []
    for name in check.names:
        runs = check.live[name]
        med = check.median(name)
        rows.append({
            "configuration": name,
            "predicted": check.predicted[name],
            "live_median": med,
            "live_min": min(runs),
            "live_max": max(runs),
            "live_spread": (max(runs) - min(runs)) / med if med else None,
            "twin_median": statistics.median(check.twin[name]),
            "live_runs": " ".join(f"{v:.3f}" for v in runs),
        })  # fmt: skip
    return pd.DataFrame(rows)


def live_markdown(check: LiveCheck) -> str:
    frame = live_frame(check)
    lines = ["# advise live check", "", check.summary(), ""]
    lines += ["| configuration (predicted order) | predicted | live median | live min–max (spread) | twin median | live runs |",
              "|---|---:|---:|---:|---:|---|"]  # fmt: skip
    for r in frame.itertuples():
        lines.append(
            f"| {r.configuration} | {r.predicted:.4g} | {r.live_median:.4g} | "
            f"{r.live_min:.4g}–{r.live_max:.4g} ({r.live_spread:.0%}) | {r.twin_median:.4g} | {r.live_runs} |"
        )
    lines += ["", f"- live order by medians: {' > '.join(_short(n) for n in check.live_order())}"]
    for r, order in enumerate(check.seed_orders()):
        same, total = check.pair_agreement(order)
        lines.append(
            f"- seed +{r}: {' > '.join(_short(n) for n in order)} ({same}/{total} pairs as predicted)"
        )
    same, total = check.pair_agreement(check.twin_order())
    lines.append(
        f"- sim twins (live lengths replayed): {' > '.join(_short(n) for n in check.twin_order())} ({same}/{total} pairs as predicted)"
    )
    return "\n".join(lines) + "\n"


def _short(name: str) -> str:
    return name.split(" ", 1)[0]


def write_live_report(check: LiveCheck, out: Path) -> None:
    write_atomic(out / "live-check.csv", live_frame(check).to_csv(index=False).encode())
    write_atomic(out / "live-check.md", live_markdown(check).encode())


# -- the live tasks as a sim workload -------------------------------------------------------------


def write_task_trace(spec: RunSpec, out: Path, num_epochs: int = 3) -> Path:
    """The live tasks' prompts and lengths (scattered around each reference answer's, as
    :func:`experiments.predictors.task_trace` draws them) as a ``trace`` workload, so the
    sim's search sees the lengths the live runs will."""
    from experiments.predictors import task_trace

    w = spec.workload
    trace = task_trace(
        spec.run.seed, w.num_prompts, w.max_output_tokens, num_epochs, spec.algorithm.group_size
    )
    out.parent.mkdir(parents=True, exist_ok=True)
    buf = io.BytesIO()
    trace[["prompt_id", "iteration", "prompt_tokens", "output_tokens"]].to_parquet(buf, index=False)
    write_atomic(out, buf.getvalue())
    return out


def main(argv: list[str] | None = None) -> int:
    """``python -m experiments.advise_live trace SPEC --out PATH [--set ...]``."""
    import argparse

    from experiments.specs import config_path
    from policies.spec import load_spec

    parser = argparse.ArgumentParser(prog="python -m experiments.advise_live")
    parser.add_argument("action", choices=["trace"])
    parser.add_argument("spec")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument(
        "--out", type=path_text, required=True, help="trace file to write (.parquet)"
    )
    parser.add_argument("--epochs", type=int, default=3)
    args = parser.parse_args(argv)
    spec = load_spec(config_path(args.spec), args.set)
    print(f"wrote {write_task_trace(spec, Path(args.out), args.epochs)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
