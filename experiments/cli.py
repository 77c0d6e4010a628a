"""The ``tandem`` command line."""

from __future__ import annotations

import argparse
import json
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path

from rich.console import Console
from rich.table import Table

from experiments.advise_cmd import add_advise_parser
from experiments.guards import LIVE_INSTALL_HINT, check_out_dir, missing_live_module
from experiments.serve_cmd import add_serve_parser
from experiments.specs import config_path
from policies.results import SUMMARY_METRICS, RunResult
from policies.spec import RunSpec, SpecError, load_spec

DEFAULT_SPEC = "streamrl-7b"

console = Console()


def _load(args: argparse.Namespace) -> RunSpec:
    return load_spec(config_path(args.spec), args.set)


def _out_dir(args: argparse.Namespace, spec: RunSpec) -> Path:
    """``--out``, or ``runs/NAME-MODE-TIME`` (``run.name`` is one directory name), checked
    writable before the run starts."""
    if args.out:
        return check_out_dir(args.out)
    name = f"{spec.run.name}-{spec.pipeline.mode}-{time.strftime('%Y%m%d-%H%M%S')}"
    return check_out_dir(Path("runs") / name)


def print_summary(result: RunResult, out: Path) -> None:
    table = Table(title=f"{result.spec.run.name} · {result.spec.pipeline.mode}")
    table.add_column("metric")
    table.add_column("value", justify="right")
    for key in SUMMARY_METRICS:
        value = result.metrics.get(key)
        table.add_row(key, "—" if value is None else f"{value:.4g}")
    console.print(table)
    if "sim_wall_s" in result.metrics:
        from sim.costs import describe_cost_model

        console.print(f"cost model: {describe_cost_model(result.spec)}")
    console.print(f"results in [bold]{out}[/bold]")


def cmd_run(args: argparse.Namespace) -> int:
    from experiments.plots import timeline
    from experiments.predictors import ranker_for

    spec = _load(args)
    out = _out_dir(args, spec)
    if args.live:
        from runtime.launcher import run_live

        force = {"force_new_spec": True} if args.force_new_spec else {}
        result = run_live(spec, out, ranker_for(spec, live=True), **force)
        # run_live saved the result (a resumed run keeps its original spec.yaml)
    else:
        from rich.progress import Progress

        from sim.simulator import Simulation

        with Progress(console=console, transient=True) as bar:
            task = bar.add_task("simulating", total=spec.run.iterations)
            sim = Simulation(spec, ranker=ranker_for(spec))
            result = sim.run(on_step=lambda _: bar.advance(task))
        result.save(out)
    timeline(result, out / "timeline.png")
    print_summary(result, out)
    return 0


def cmd_sweep(args: argparse.Namespace) -> int:
    from experiments.plots import sweep_summary
    from experiments.sweep import parse_grid, run_sweep

    spec = _load(args)
    axes = [parse_grid(g) for g in args.grid]
    out = check_out_dir(args.out)
    frame = run_sweep(spec, axes, out, workers=args.workers, point_timeout_s=args.point_timeout)
    failed = frame["error"].notna().sum()
    if failed < len(frame):
        sweep_summary(frame, [a.key for a in axes], out / "summary.png")
    console.print(f"{len(frame)} points, {failed} failed; results in [bold]{out}[/bold]")
    for _, row in frame[frame["error"].notna()].iterrows():
        console.print(f"[red]point {row['point']} failed[/red]: {row['error']}")
    if failed == len(frame) and frame["error"].str.startswith("SpecError").all():
        return 2
    return 1 if failed else 0


def cmd_advise(args: argparse.Namespace) -> int:
    from experiments.advise_cmd import run_advise

    spec = _load(args)
    check_out_dir(args.out)
    return run_advise(spec, args, console)


def cmd_bench(args: argparse.Namespace) -> int:
    if args.target == "sim":
        from experiments.bench import bench_sim

        spec = load_spec(
            config_path(args.spec or "streamrl-72b"),
            ["workload.max_output_tokens=20000", *args.set],
        )
        report = bench_sim(spec, iterations=args.iterations or 10)
    else:
        from experiments.bench_live import bench_live

        spec = load_spec(config_path(args.spec or "live-tiny"), args.set)
        report = bench_live(spec, steps=args.iterations, rounds=args.rounds)
    print(json.dumps(report))
    return 0


def cmd_model(args: argparse.Namespace) -> int:
    from runtime.model import ensure_tiny_model

    print(ensure_tiny_model(seed=args.seed))
    return 0


def cmd_calibrate(args: argparse.Namespace) -> int:
    from experiments.calibrate import calibrate, calibrate_from_vidur

    if args.source == "vidur":
        text = calibrate_from_vidur(Path(args.profile_dir), check_out_dir(args.out))
        console.print(text)
        console.print(
            f"efficiencies in [bold]{args.out}[/bold] (use sim.cost_model=roofline:{args.out})"
        )
        return 0
    fits = calibrate(Path(args.profile_dir), check_out_dir(args.out))
    table = Table(title="held-out error per operator")
    for col in ("operator", "model", "held-out MAPE"):
        table.add_column(col)
    for name, c in fits.items():
        table.add_row(name, "+".join(c.fit.bases), f"{c.fit.heldout_mape:.2%}")
    console.print(table)
    console.print(f"cost model in [bold]{args.out}[/bold] (use sim.cost_model=profiled:{args.out})")
    return 0


def cmd_profile(args: argparse.Namespace) -> int:
    from rich.progress import Progress

    from runtime.profiler import ProfilePlan, profile_runtime

    spec = _load(args)
    check_out_dir(args.out)
    plan = ProfilePlan()
    with Progress(console=console) as bar:
        task = bar.add_task("profiling", total=plan.num_measurements)
        out = profile_runtime(
            spec, Path(args.out), plan, lambda what: bar.update(task, advance=1, description=what)
        )
    console.print(f"profile in [bold]{out}[/bold] (next: tandem calibrate {out} --out DIR)")
    return 0


def cmd_fidelity(args: argparse.Namespace) -> int:
    from experiments.fidelity import FidelityPlan, load_cases, run_fidelity, write_report

    if args.report_only:
        report = write_report(load_cases(Path(args.out)), Path(args.out))
        console.print(report.markdown())
        console.print(f"fidelity report rewritten in [bold]{args.out}[/bold]")
        return 0
    if not args.modes:
        raise ValueError("--modes is required (unless --report-only)")
    if bool(args.profile) == bool(args.cost_model):
        raise ValueError("give exactly one of --profile PROFILE_DIR and --cost-model DIR")
    plan = FidelityPlan(
        modes=tuple(args.modes.split(",")),
        dispatches=tuple(args.dispatch.split(",")) if args.dispatch else (None,),
        profile_dir=Path(args.profile) if args.profile else None,
        cost_model_dir=Path(args.cost_model) if args.cost_model else None,
        repeats=args.repeats,
    )
    spec = _load(args)
    report = run_fidelity(spec, plan, check_out_dir(args.out), console)
    console.print(report.markdown())
    console.print(f"fidelity report in [bold]{args.out}[/bold]")
    return 0


def cmd_policy_effects(args: argparse.Namespace) -> int:
    from experiments.policy_effects import run_policy_effects

    text = run_policy_effects(
        Path(args.cost_model), Path(args.out), range(args.seeds), args.requests
    )
    console.print(text)
    console.print(f"report in [bold]{args.out}[/bold]")
    return 0


def cmd_scheduler_trace(args: argparse.Namespace) -> int:
    from experiments.scheduler_fidelity import run_scheduler_trace
    from runtime.model import ensure_tiny_model

    for c in run_scheduler_trace(str(ensure_tiny_model(0)), Path(args.out), args.seed):
        errors = ", ".join(f"{k} {v:.1%}" for k, v in c.relative_errors().items())
        console.print(
            f"{c.case}: steps {c.vllm_steps} vLLM / {c.sim_steps} sim, preemptions "
            f"{c.vllm_preemptions} / {c.sim_preemptions}, mean running {c.vllm_mean_running:.2f}"
            f" / {c.sim_mean_running:.2f} ({errors}; identical steps: {c.identical})"
        )
    console.print(f"report in [bold]{args.out}[/bold]")
    return 0


def cmd_reproduce(args: argparse.Namespace) -> int:
    from experiments.reproduce import reproduce

    out = check_out_dir(args.out or f"runs/reproduce-{args.study}{'-quick' if args.quick else ''}")
    start = time.perf_counter()
    report = reproduce(args.study, out, args.quick, args.workers, console)
    console.print(f"report in [bold]{report}[/bold] ({time.perf_counter() - start:.0f} s)")
    return 0


def cmd_ranker(args: argparse.Namespace) -> int:
    from experiments import predictors

    if args.action == "fit":
        console.print(
            predictors.fit_command(Path(args.trace), Path(args.out), args.model, args.before)
        )
        return 0
    json_path = Path(args.json) if args.json else None
    report = predictors.eval_command(Path(args.model_file), Path(args.trace), json_path)
    console.print(predictors.eval_table(report))
    console.print(f"metrics in [bold]{report['json_path']}[/bold]")
    return 0


def _with_spec(p: argparse.ArgumentParser, default: str | None) -> None:
    p.add_argument(
        "spec",
        nargs="?" if default else None,
        default=default,
        help=f"spec YAML or shipped config name (default: {default})",
    )
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a spec key, e.g. pipeline.mode=stream-sync",
    )


def _add_sim_commands(sub: argparse._SubParsersAction) -> None:
    """run, sweep, advise, bench."""
    run = sub.add_parser("run", help="simulate (or, with --live, really run) one spec")
    _with_spec(run, DEFAULT_SPEC)
    run.add_argument("--out", help="result directory (default: runs/NAME-MODE-TIME)")
    run.add_argument("--live", action="store_true", help="real vLLM servers and torch trainer")
    run.add_argument(
        "--force-new-spec",
        action="store_true",
        help="live resume: go on although the spec changes training (kept as spec.resumed-N.yaml)",
    )
    run.set_defaults(func=cmd_run)

    sweep = sub.add_parser("sweep", help="simulate every combination of a grid")
    _with_spec(sweep, None)
    sweep.add_argument("--grid", action="append", required=True, metavar="KEY=V1,V2")
    sweep.add_argument("--workers", type=int, default=2)
    sweep.add_argument(
        "--point-timeout",
        type=float,
        default=None,
        metavar="S",
        help="seconds a point may take before it is stopped and recorded as failed",
    )
    sweep.add_argument(
        "--out", required=True, help="results; a second run resumes (skips done points)"
    )
    sweep.set_defaults(func=cmd_sweep)

    add_advise_parser(sub, _with_spec, cmd_advise)

    bench = sub.add_parser("bench", help="benchmarks; the last line printed is JSON")
    bench.add_argument("target", choices=["sim", "live"])
    bench.add_argument("spec", nargs="?", default=None)
    bench.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    bench.add_argument(
        "--iterations",
        type=int,
        default=None,
        help="iterations per mode (default: 10 sim, 20 live)",
    )
    bench.add_argument(
        "--rounds", type=int, default=3, help="live: rounds of every mode (seeds run.seed + r)"
    )
    bench.set_defaults(func=cmd_bench)


def _add_live_commands(sub: argparse._SubParsersAction) -> None:
    """serve, calibrate, profile, fidelity, model."""
    add_serve_parser(sub)

    calib = sub.add_parser("calibrate", help="fit the simulator's cost model to a profile")
    calib.add_argument(
        "profile_dir", help="a `tandem profile` directory, or Vidur's profiling data"
    )
    calib.add_argument(
        "--from", dest="source", choices=["profile", "vidur"], default="profile",
        help="profile: the live runtime's (cost_model.json); vidur: the GEMM efficiencies of "
        "the roofline from Vidur's data/profiling/compute CSVs (efficiency.json)",
    )  # fmt: skip
    calib.add_argument("--out", required=True, help="directory for the fit and its plots")
    calib.set_defaults(func=cmd_calibrate)

    prof = sub.add_parser("profile", help="measure the live runtime's operators (for calibrate)")
    _with_spec(prof, "live-tiny")
    prof.add_argument("--out", required=True, help="profile directory (CSV tables, profile.json)")
    prof.set_defaults(func=cmd_profile)

    fid = sub.add_parser("fidelity", help="run a spec live and in the calibrated sim; compare")
    _with_spec(fid, "live-tiny")
    fid.add_argument("--modes", metavar="M1,M2", help="pipeline modes")
    fid.add_argument("--dispatch", default=None, metavar="D1,D2", help="dispatch policies")
    fid.add_argument("--profile", help="profile directory (calibrated into OUT/cost-model)")
    fid.add_argument("--cost-model", help="directory of an existing cost_model.json")
    fid.add_argument(
        "--repeats", type=int, default=1, help="live runs per case (seeds run.seed + r); medians"
    )
    fid.add_argument("--out", required=True, help="report directory")
    fid.add_argument(
        "--report-only", action="store_true", help="rewrite the report of the cases in --out"
    )
    fid.set_defaults(func=cmd_fidelity)

    trace = sub.add_parser(
        "scheduler-trace", help="the simulator's engine against real vLLM, step by step"
    )
    trace.add_argument("--out", required=True, help="report directory")
    trace.add_argument("--seed", type=int, default=0, help="seed of the trace")
    trace.set_defaults(func=cmd_scheduler_trace)

    effects = sub.add_parser(
        "policy-effects", help="dispatch and instance-count savings, live and in the sim"
    )
    effects.add_argument("--cost-model", required=True, help="a `tandem calibrate` directory")
    effects.add_argument("--out", required=True, help="report directory")
    effects.add_argument("--seeds", type=int, default=3, help="paired seeds (workloads)")
    effects.add_argument("--requests", type=int, default=96, help="requests per workload")
    effects.set_defaults(func=cmd_policy_effects)

    model = sub.add_parser("model", help="the embedded tiny model")
    model.add_argument("action", choices=["path"])
    model.add_argument("--seed", type=int, default=0)
    model.set_defaults(func=cmd_model)


def _add_study_commands(sub: argparse._SubParsersAction) -> None:
    """reproduce, ranker."""
    repro = sub.add_parser("reproduce", help="reproduce a paper's throughput study as a report")
    repro.add_argument("study", choices=["streamrl", "pipelinerl"])
    repro.add_argument("--quick", action="store_true", help="fewer iterations and points (≤ 60 s)")
    repro.add_argument("--out", help="report directory (default: runs/reproduce-STUDY)")
    repro.add_argument("--workers", type=int, default=2, help="parallel simulation processes")
    repro.set_defaults(func=cmd_reproduce)

    ranker = sub.add_parser("ranker", help="the output-length ranker: fit and evaluate")
    ranker_sub = ranker.add_subparsers(dest="action", required=True)
    fit = ranker_sub.add_parser("fit", help="fit a ranker on a trace (samples.parquet or CSV)")
    fit.add_argument(
        "trace", help="samples.parquet of a run, or CSV/parquet of prompt,output_tokens"
    )
    fit.add_argument("--out", required=True, help="model file to write")
    fit.add_argument("--model", choices=["hgb", "ridge"], default="hgb")
    fit.add_argument("--before", type=int, default=None, help="fit on iterations < this only")
    fit.set_defaults(func=cmd_ranker)
    evaluate = ranker_sub.add_parser("eval", help="recall, rank correlation, timings")
    evaluate.add_argument("model_file", metavar="MODEL")
    evaluate.add_argument("trace", metavar="TRACE")
    evaluate.add_argument("--json", help="metrics JSON to write (default: MODEL.eval.json)")
    evaluate.set_defaults(func=cmd_ranker)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tandem", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    _add_sim_commands(sub)
    _add_live_commands(sub)
    _add_study_commands(sub)
    return parser


def _terminate(signum: int, frame: object) -> None:
    """SIGTERM unwinds like Ctrl-C, so that every process the command started is stopped."""
    raise SystemExit(128 + signum)


def main(argv: list[str] | None = None) -> int:
    from runtime.errors import LiveRunError  # pure Python: present on any install

    args = build_parser().parse_args(argv)
    handler: Callable[[argparse.Namespace], int] = args.func
    previous = signal.signal(signal.SIGTERM, _terminate)
    try:
        return handler(args)
    except SpecError as err:
        console.print(f"[red]spec error[/red]: {err}")
        return 2
    except ValueError as err:  # user mistakes found while building the run
        console.print(f"[red]error[/red]: {err}")
        return 2
    except LiveRunError as err:  # a process of a live run died: one line naming it
        console.print(f"[red]error[/red]: {err}", soft_wrap=True)
        return 1
    except ModuleNotFoundError as err:
        module = missing_live_module(err)
        if module is None:
            raise
        console.print(
            f"[red]error[/red]: {args.command} needs the live runtime, and module {module!r} "
            f"is not installed; {LIVE_INSTALL_HINT}"
        )
        return 2
    except KeyboardInterrupt:
        console.print("[yellow]interrupted[/yellow]")
        return 130
    finally:
        signal.signal(signal.SIGTERM, previous)


if __name__ == "__main__":
    sys.exit(main())
