"""The learned ranker in runs: traces of the sim workload and of the live tasks, and the
simulated end effect of ranker-driven dispatch.

* ``ranker_for(spec, live)`` — the one place every entry point gets the ranker behind
  ``policies.length_predictor: ranker``: a file of ``policies.ranker_path``, or built in
  (live: empty, learning online; sim: fitted on held-out draws). It lives in
  :mod:`experiments.ranker_source` and is re-exported here.
* ``task_trace(...)`` — the live tasks (``runtime.tasks``) seen for several epochs, with
  lengths scattered around the reference answer's (``ranker.traces``), until live traces
  exist.
* ``python -m experiments.predictors sim-eval`` — generation time per batch under
  random+fcfs, skewness-aware+lpt with the ranker, and with the oracle (docs/ranker.md).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from rich.table import Table

from experiments.arg_types import path_text
from experiments.ranker_source import ranker_for, sim_ranker, workload_trace
from experiments.specs import config_path
from policies.protocols import LengthPredictor
from policies.results import iteration_windows, write_atomic
from policies.rng import RngStreams
from policies.spec import RunSpec, load_spec
from ranker.evaluate import as_json, heldout_prompts_report, rank_metrics, score, timings
from ranker.features import FeatureSpec
from ranker.online import RankerPredictor
from ranker.traces import TRACE_COLUMNS, normalize, read_trace, repeated_prompt_trace

__all__ = ["ranker_for", "sim_ranker", "workload_trace"]  # re-exported for the entry points


def task_trace(
    seed: int,
    num_prompts: int,
    max_output_tokens: int,
    num_epochs: int = 3,
    group_size: int = 4,
) -> pd.DataFrame:
    """The live tasks over ``num_epochs`` epochs, lengths around the reference answer's."""
    from runtime.tasks import TaskSet

    tasks = TaskSet(seed, num_prompts, max_output_tokens)
    prompts = [(p.prompt_id, p.text, p.expected_output_tokens) for p in tasks.prompts]
    rng = RngStreams(seed).get("ranker-task-trace")
    return repeated_prompt_trace(prompts, num_epochs, group_size, max_output_tokens, rng)


def attach_task_prompts(trace: pd.DataFrame, run_dir: Path) -> pd.DataFrame:
    """Fill in the prompt text of a live run's samples from ``runtime.tasks`` by prompt id."""
    if trace["prompt"].notna().any() or not (run_dir / "spec.yaml").exists():
        return trace
    metrics = run_dir / "metrics.json"
    if not metrics.exists() or "live_wall_s" not in json.loads(metrics.read_text()):
        return trace  # a sim run: its prompts have no text
    from runtime.tasks import task_set

    tasks = task_set(load_spec(run_dir / "spec.yaml", []))
    out = trace.copy()
    out["prompt"] = [tasks[int(i)].text for i in out["prompt_id"]]
    return normalize(out)


# -- tandem ranker fit / eval -------------------------------------------------------------


def load_trace(path: Path) -> pd.DataFrame:
    """A trace file, with a live run's prompt text reconstructed when it lacks it."""
    return attach_task_prompts(read_trace(path), path.parent)


def fit_command(
    trace_path: Path, out: Path, model: str, before_iteration: int | None, use_text: bool = True
) -> str:
    """``tandem ranker fit``; ``use_text=False`` leaves the prompt-text features out (a
    model for the simulator, whose prompts have no text)."""
    trace = load_trace(trace_path)
    if before_iteration is not None:
        trace = rows_before(trace, trace_path, before_iteration)
    ranker = RankerPredictor(model, FeatureSpec(use_text=use_text))
    t0 = time.perf_counter()
    ranker.fit_trace(trace)
    fit_s = time.perf_counter() - t0
    ranker.save(out)
    return f"fitted {model} on {len(trace)} rows in {fit_s:.2f} s; saved {out}"


def rows_before(trace: pd.DataFrame, trace_path: Path, before_iteration: int) -> pd.DataFrame:
    """The rows of iterations before ``before_iteration`` (``--before``); refused if none."""
    kept = trace[trace["iteration"] < before_iteration].reset_index(drop=True)
    if kept.empty:
        first, last = int(trace["iteration"].min()), int(trace["iteration"].max())
        raise ValueError(
            f"--before {before_iteration}: trace {trace_path} has iterations {first} to "
            f"{last}, none before {before_iteration}: nothing to fit on"
        )
    return kept


def eval_report(ranker: RankerPredictor, trace: pd.DataFrame) -> dict[str, Any]:
    """Later-epoch and held-out-prompt metrics (ranker and baseline) and timings."""
    assert ranker.fitted is not None
    later = trace[trace["iteration"] > ranker.fitted.max_train_iteration].reset_index(drop=True)
    in_sample = later.empty
    test = trace if in_sample else later
    return {
        "model": ranker.model_name,
        "later_epoch": {"in_sample": in_sample, **score(ranker, test, online=True)},
        "heldout_prompts": heldout_prompts_report(trace, ranker.model_name, ranker.spec),
        "timings": timings(trace, ranker.model_name),
    }


def eval_json_path(model_path: Path) -> Path:
    """``tandem ranker eval``'s default metrics file: ``<model file name>.eval.json``, the
    whole name kept (``a.v1`` and ``a.v2`` must not both write ``a.eval.json``)."""
    return model_path.with_name(f"{model_path.name}.eval.json")


def eval_command(model_path: Path, trace_path: Path, json_path: Path | None) -> dict[str, Any]:
    ranker = RankerPredictor.load(model_path)
    report = as_json(eval_report(ranker, load_trace(trace_path)))
    json_path = json_path or eval_json_path(model_path)
    write_atomic(json_path, json.dumps(report, indent=2, allow_nan=False).encode())
    report["json_path"] = str(json_path)
    return report


def eval_table(report: dict[str, Any]) -> Table:
    later, heldout = report["later_epoch"], report["heldout_prompts"]
    title = "later epoch" + (" (in-sample: no later iteration)" if later["in_sample"] else "")
    table = Table(title=f"ranker {report['model']}: {title} · held-out prompts")
    table.add_column("metric")
    for name in (
        "later: ranker",
        "later: prompt length",
        "held-out: ranker",
        "held-out: prompt length",
    ):
        table.add_column(name, justify="right")
    columns = [later["ranker"], later["baseline"], heldout["ranker"], heldout["baseline"]]
    for key in ("recall_20", "recall_10", "recall_5", "spearman", "kendall", "num_samples"):
        table.add_row(key, *("n/a" if c[key] is None else f"{c[key]:.4g}" for c in columns))
    t = report["timings"]
    table.add_row("fit_s", f"{t['fit_s']:.2f}", "", "", "")
    table.add_row("predict_s", f"{t['predict_s']:.2f}", "", "", "")
    table.caption = f"fit_s, predict_s: wall seconds on {_timed_rows(t)}"
    return table


def _timed_rows(t: dict[str, Any]) -> str:
    """What the timings ran on: the trace's rows, or a resample of them."""
    num, trace = t["num_rows"], t.get("trace_rows", t["num_rows"])
    if trace < num:
        return f"{num} rows resampled (with repeats) from the trace's {trace}"
    return f"{num} of the trace's {trace} rows"


# -- the end effect in the sim ------------------------------------------------------------


def generation_time_s(spec: RunSpec, ranker: LengthPredictor | None, from_iteration: int) -> float:
    """Mean per-iteration generation time (first dispatch to last finish) from an iteration."""
    from sim.simulator import Simulation

    result = Simulation(spec, ranker=ranker).run()
    windows = iteration_windows(result.samples)
    spans = [hi - lo for it, (lo, hi) in windows.items() if it >= from_iteration]
    return float(np.mean(spans))


def _with_policies(spec: RunSpec, **policies: str) -> RunSpec:
    return spec.model_copy(update={"policies": spec.policies.model_copy(update=policies)})


def sim_eval(spec: RunSpec, fit_iterations: int, model: str = "hgb") -> dict[str, object]:
    """The three generation times on iterations from ``fit_iterations`` on, and the recall."""
    ranker = sim_ranker(spec, fit_iterations, model)
    baseline = _with_policies(spec, dispatch="random", scheduling="fcfs", length_predictor="none")
    learned = _with_policies(spec, length_predictor="ranker")
    oracle = _with_policies(spec, length_predictor="oracle")
    times = {
        "random_fcfs_s": generation_time_s(baseline, None, fit_iterations),
        "ranker_s": generation_time_s(learned, ranker, fit_iterations),
        "oracle_s": generation_time_s(oracle, None, fit_iterations),
    }
    gain = times["random_fcfs_s"] - times["oracle_s"]
    recovered = (times["random_fcfs_s"] - times["ranker_s"]) / gain if gain > 0 else float("nan")
    test = workload_trace(spec, spec.run.iterations)
    test = test[test["iteration"] >= fit_iterations].reset_index(drop=True)
    metrics = rank_metrics(test["output_tokens"].to_numpy(float), ranker.predict_tokens(test))
    return {"times": times, "share_of_oracle_gain": recovered, "ranker": as_json(metrics)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m experiments.predictors")
    sub = parser.add_subparsers(dest="command", required=True)
    sim = sub.add_parser("sim-eval", help="generation time: random+fcfs vs ranker vs oracle")
    sim.add_argument("spec", nargs="?", default="streamrl-7b")
    sim.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    sim.add_argument("--fit-iterations", type=int, default=8)
    sim.add_argument("--model", choices=["hgb", "ridge"], default="hgb")
    tasks = sub.add_parser("task-trace", help="write a task trace parquet (reference lengths)")
    tasks.add_argument("--out", type=path_text, required=True)
    tasks.add_argument("--seed", type=int, default=0)
    tasks.add_argument("--num-prompts", type=int, default=2000)
    tasks.add_argument("--max-output-tokens", type=int, default=128)
    tasks.add_argument("--epochs", type=int, default=3)
    tasks.add_argument("--group-size", type=int, default=4)
    args = parser.parse_args(argv)
    if args.command == "sim-eval":
        spec = load_spec(config_path(args.spec), args.set)
        print(json.dumps(sim_eval(spec, args.fit_iterations, args.model), indent=2))
    else:
        trace = task_trace(
            args.seed, args.num_prompts, args.max_output_tokens, args.epochs, args.group_size
        )
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        trace[TRACE_COLUMNS].to_parquet(args.out)
        print(f"{len(trace)} rows in {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
