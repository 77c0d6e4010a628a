"""The CLI's live-runtime commands: ``serve``, ``calibrate``, ``profile``, ``fidelity``,
``scheduler-trace``, ``policy-effects``, ``model``. Heavy imports (vLLM, torch) happen inside the handlers."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from experiments.arg_types import path_text, positive_int, positive_ints
from experiments.guards import check_out_dir
from experiments.progress import RunProgress
from experiments.serve_cmd import add_serve_parser
from experiments.specs import config_path
from policies.logs import run_log
from policies.spec import RunSpec, load_spec

if TYPE_CHECKING:
    from sim.tables import Hardware

Handler = Callable[[argparse.Namespace, Console, Console], int]  # (args, stdout, stderr)


def _spec_of(args: argparse.Namespace) -> RunSpec:
    return load_spec(config_path(args.spec), args.set)


def cmd_model(args: argparse.Namespace, console: Console, err_console: Console) -> int:
    from runtime.model import ensure_tiny_model

    with RunProgress(err_console, "tiny model", transient=True) as bar:

        def building(step: int, total: int, loss: float) -> None:
            bar.set_total(total)
            bar.advance(f"warm-start loss {loss:.3f}")

        path = ensure_tiny_model(seed=args.seed, on_progress=building)
    print(path)  # alone on stdout: $(tandem model path)
    return 0


def cmd_calibrate(args: argparse.Namespace, console: Console, err_console: Console) -> int:
    from experiments.calibrate import calibrate, calibrate_from_vidur

    if args.source == "vidur":
        if args.spec or args.set:
            raise ValueError("--spec and --set are for a profile's GPUs, not --from vidur")
        console.print(calibrate_from_vidur(Path(args.profile_dir), check_out_dir(args.out)))
        console.print(
            f"efficiencies in [bold]{args.out}[/bold] (use sim.cost_model=roofline:"
            f"{Path(args.out).resolve()})"
        )
        return 0
    hardware = _hardware_of(args)
    fits = calibrate(
        Path(args.profile_dir),
        check_out_dir(args.out),
        note=lambda text: console.print(f"[yellow]note[/yellow]: {escape(text)}", soft_wrap=True),
        hardware=hardware,
    )
    table = Table(title="held-out error per operator")
    for col in ("operator", "model", "held-out MAPE"):
        table.add_column(col)
    for name, c in fits.items():
        table.add_row(name, "+".join(c.fit.bases), f"{c.fit.heldout_mape:.2%}")
    console.print(table)
    out = Path(args.out).resolve()
    console.print(f"cost model in [bold]{out}[/bold] (use sim.cost_model=profiled:{out})")
    return 0


def _hardware_of(args: argparse.Namespace) -> dict[str, Hardware] | None:
    """calibrate's known GPUs: hardware.csv with the rows of ``--spec`` / ``--set``'s
    ``sim.hardware`` (None: hardware.csv alone)."""
    from sim.tables import hardware_of

    if not (args.spec or args.set):
        return None
    return hardware_of(load_spec(config_path(args.spec) if args.spec else None, args.set))


def cmd_profile(args: argparse.Namespace, console: Console, err_console: Console) -> int:
    from runtime.profiler import ProfilePlan, check_profile_spec, profile_runtime

    spec = _spec_of(args)
    plan = ProfilePlan()
    if args.batch_sizes:
        plan = plan.with_batch_sizes(args.batch_sizes)
    check_profile_spec(spec, plan)  # before run_log makes --out
    check_out_dir(args.out)
    with run_log(args.out), RunProgress(err_console, "profile", plan.num_measurements) as bar:
        out = profile_runtime(spec, Path(args.out), plan, bar.advance)
    console.print(f"profile in [bold]{out}[/bold] (next: tandem calibrate {out} --out DIR)")
    return 0


def cmd_fidelity(args: argparse.Namespace, console: Console, err_console: Console) -> int:
    from experiments.fidelity import FidelityPlan, load_cases, run_fidelity, write_report
    from experiments.fidelity_plan import check_fidelity

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
    spec = _spec_of(args)
    check_fidelity(spec, plan, Path(args.out))  # before run_log makes --out
    total = plan.repeats * len(plan.modes) * len(plan.dispatches) * spec.run.iterations
    with run_log(args.out), RunProgress(err_console, "fidelity", total) as bar:
        report = run_fidelity(spec, plan, Path(args.out), console, on_step=bar.on_step)
    console.print(report.markdown())
    console.print(f"fidelity report in [bold]{args.out}[/bold]")
    return 0


def add_live_commands(
    sub: Any,
    with_spec: Callable[[argparse.ArgumentParser, str | None], None],
    bind: Callable[[Handler], Callable[[argparse.Namespace], int]],
) -> None:
    """serve, calibrate, profile, fidelity, model; ``bind`` gives a handler the CLI's consoles."""
    add_serve_parser(sub)

    _add_calibrate_parser(sub, bind)

    prof = sub.add_parser("profile", help="measure the live runtime's operators (for calibrate)")
    with_spec(prof, "live-tiny")
    prof.add_argument(
        "--out", type=path_text, required=True, help="profile directory (CSV tables, profile.json)"
    )
    prof.add_argument(
        "--batch-sizes", type=positive_ints, metavar="B1,B2,...",
        help="decode batches to measure (default 1,3,10,20,40,64); calibrated runs whose "
        "max_num_seqs exceeds the largest extrapolate the fit. Each must be <= the spec's "
        "cluster.generation.0.max_num_seqs",
    )  # fmt: skip
    prof.set_defaults(func=bind(cmd_profile))

    fid = sub.add_parser("fidelity", help="run a spec live and in the calibrated sim; compare")
    with_spec(fid, "live-tiny")
    fid.add_argument("--modes", metavar="M1,M2", help="pipeline modes")
    fid.add_argument("--dispatch", default=None, metavar="D1,D2", help="dispatch policies")
    fid.add_argument("--profile", help="profile directory (calibrated into OUT/cost-model)")
    fid.add_argument("--cost-model", help="directory of an existing cost_model.json")
    fid.add_argument(
        "--repeats",
        type=positive_int,
        default=1,
        help="live runs per case (seeds run.seed + r); medians",
    )
    fid.add_argument("--out", type=path_text, required=True, help="report directory")
    fid.add_argument(
        "--report-only", action="store_true", help="rewrite the report of the cases in --out"
    )
    fid.set_defaults(func=bind(cmd_fidelity))

    add_engine_commands(sub, bind)

    model = sub.add_parser("model", help="the embedded tiny model")
    model.add_argument(
        "action", choices=["path"], help="path: build (if not cached) and print its directory"
    )
    model.add_argument("--seed", type=int, default=0, help="initialisation seed (default 0)")
    model.set_defaults(func=bind(cmd_model))


def _add_calibrate_parser(
    sub: Any, bind: Callable[[Handler], Callable[[argparse.Namespace], int]]
) -> None:
    calib = sub.add_parser("calibrate", help="fit the simulator's cost model to a profile")
    calib.add_argument(
        "profile_dir", help="a `tandem profile` directory, or Vidur's profiling data"
    )
    calib.add_argument(
        "--from", dest="source", choices=["profile", "vidur"], default="profile",
        help="profile: the live runtime's (cost_model.json); vidur: the GEMM efficiencies of "
        "the roofline from Vidur's data/profiling/compute CSVs (efficiency.json)",
    )  # fmt: skip
    calib.add_argument(
        "--out", type=path_text, required=True, help="directory for the fit and its plots"
    )
    calib.add_argument(
        "--spec",
        help="the spec you will run the cost model with: its sim.hardware rows name GPUs "
        "hardware.csv does not list, which the profile may then name (only sim.hardware is read)",
    )
    calib.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE",
        help="override a key of --spec (default: the defaults), e.g. 'sim.hardware=[{name: "
        "MYGPU, bf16_dense_tflops: 600, hbm_gb: 96, hbm_tb_per_s: 4, nvlink_gb_per_s: 600}]'",
    )  # fmt: skip
    calib.set_defaults(func=bind(cmd_calibrate))


def cmd_policy_effects(args: argparse.Namespace, console: Console, err_console: Console) -> int:
    from experiments.policy_effects import num_live_runs, run_policy_effects

    out = check_out_dir(args.out)
    with RunProgress(err_console, "policy-effects", num_live_runs(args.seeds)) as bar:
        text = run_policy_effects(
            Path(args.cost_model), out, range(args.seeds), args.requests, bar.advance
        )
    console.print(text)
    console.print(f"report in [bold]{out}[/bold]")
    return 0


def cmd_scheduler_trace(args: argparse.Namespace, console: Console, err_console: Console) -> int:
    from experiments.scheduler_fidelity import run_scheduler_trace
    from runtime.model import ensure_tiny_model

    def on_case(case: str, index: int, count: int) -> None:
        console.print(
            f"case {index + 1}/{count}, {case}: vLLM's engine records its steps (a minute or "
            "two on a CPU), then the simulated engine replays the trace"
        )

    out = check_out_dir(args.out)
    for c in run_scheduler_trace(str(ensure_tiny_model(0)), out, args.seed, on_case):
        errors = ", ".join(f"{k} {v:.1%}" for k, v in c.relative_errors().items())
        console.print(
            f"{c.case}: steps {c.vllm_steps} vLLM / {c.sim_steps} sim, preemptions "
            f"{c.vllm_preemptions} / {c.sim_preemptions}, mean running {c.vllm_mean_running:.2f}"
            f" / {c.sim_mean_running:.2f} ({errors}; identical steps: {c.identical})"
        )
    console.print(f"report in [bold]{out}[/bold]")
    return 0


def add_engine_commands(
    sub: Any, bind: Callable[[Handler], Callable[[argparse.Namespace], int]]
) -> None:
    """scheduler-trace, policy-effects: the simulated engine against real vLLM."""
    trace = sub.add_parser(
        "scheduler-trace", help="the simulator's engine against real vLLM, step by step"
    )
    trace.add_argument("--out", type=path_text, required=True, help="report directory")
    trace.add_argument("--seed", type=int, default=0, help="seed of the trace")
    trace.set_defaults(func=bind(cmd_scheduler_trace))

    effects = sub.add_parser(
        "policy-effects", help="dispatch and instance-count savings, live and in the sim"
    )
    effects.add_argument("--cost-model", required=True, help="a `tandem calibrate` directory")
    effects.add_argument("--out", type=path_text, required=True, help="report directory")
    effects.add_argument("--seeds", type=positive_int, default=3, help="paired seeds (workloads)")
    effects.add_argument("--requests", type=positive_int, default=96, help="requests per workload")
    effects.set_defaults(func=bind(cmd_policy_effects))
