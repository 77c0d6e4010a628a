"""The ``tandem`` command line: RL for LLMs with disaggregated stream generation,
simulated (SimPy) or live (vLLM + torch). Every option has help: tandem COMMAND --help."""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from collections.abc import Callable
from pathlib import Path

from rich.console import Console
from rich.logging import RichHandler

from experiments.advise_cmd import ADVICE_FILES, add_advise_parser
from experiments.arg_types import path_text, positive_int, ray_address
from experiments.cli_errors import run_handler
from experiments.cli_live import Handler, add_live_commands
from experiments.cli_tools import add_tool_commands
from experiments.guards import (
    check_out_dir,
    check_out_file,
    check_run_out,
    fresh_dir,
    replaces_a_run,
)
from experiments.live_out import finished_live_run, live_done_before
from experiments.peers_cmd import add_peers_options
from experiments.progress import RunProgress
from experiments.run_cmd import run_into
from experiments.specs import config_path
from experiments.stop_signal import SigtermUnwinds
from experiments.summary_format import print_summary
from experiments.sweep_cmd import add_sweep_parser
from policies.logs import ConsoleLevel
from policies.results import RunResult
from policies.spec import RunSpec, SpecError, load_spec
from runtime.graceful_stop import StopRequests
from runtime.ray_session import require_ray

DEFAULT_SPEC = "streamrl-7b"
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")

console = Console()  # results: summaries, tables, JSON (stdout)
err_console = Console(stderr=True)  # progress and log messages (stderr)
log = logging.getLogger(__name__)


def version() -> str:
    """The installed distribution's version (pyproject.toml's)."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as dist_version

    try:
        return dist_version("tandem-rl")
    except PackageNotFoundError:
        return "unknown (not installed)"


def setup_logging(level: str) -> None:
    """Console messages at ``level`` and above (stderr, beside any progress bar); the
    root logger passes INFO on, so each run's ``run.log`` gets it whatever the level."""
    root = logging.getLogger()
    for h in [h for h in root.handlers if getattr(h, "_tandem_console", False)]:
        root.removeHandler(h)
    handler = RichHandler(console=err_console, show_path=False)
    handler.addFilter(ConsoleLevel(getattr(logging, level)))  # and notices (policies.logs)
    handler._tandem_console = True  # type: ignore[attr-defined]
    root.addHandler(handler)
    root.setLevel(min(getattr(logging, level), logging.INFO))


def _load(args: argparse.Namespace) -> RunSpec:
    return load_spec(config_path(args.spec), args.set)


def _out_dir(args: argparse.Namespace, spec: RunSpec) -> Path:
    """``--out``, or a new ``runs/NAME-MODE-TIME`` (``run.name`` is one directory name;
    ``-2``, ``-3``, … after it for runs started in the same second), checked writable."""
    if args.out:
        return check_out_dir(args.out)
    name = f"{spec.run.name}-{spec.pipeline.mode}-{time.strftime('%Y%m%d-%H%M%S')}"
    return check_out_dir(fresh_dir(Path("runs") / name))


def cmd_run(args: argparse.Namespace) -> int:
    from experiments.tracking import tracker_for

    spec = _load(args)
    if args.ray is not None and not args.live:
        raise SpecError("--ray places a live run: add --live")
    from experiments.runs import check_run

    # a refused run (a bad ranker file too) leaves no run directory behind; a simulated
    # run's warnings come from the run itself, once
    check_run(spec, args.live, args.ray)
    if (finished := finished_live_run(args, spec)) is not None:  # nothing to run or rewrite
        console.print(f"{args.out} holds this run, finished: nothing run again or rewritten")
        print_summary(finished, Path(args.out), console)
        return 0
    replace = args.out is not None and replaces_a_run(args, spec)
    out = _out_dir(args, spec)
    if replace:  # --overwrite: nothing of the earlier run stays beside this one
        RunResult.clear(out)
        (out / "run.log").unlink(missing_ok=True)
    tracker = tracker_for(spec, out)  # a missing tracking package stops the run here
    label = f"{spec.run.name} · {spec.pipeline.mode}"
    done = live_done_before(args, spec, out)  # a resumed run's bar counts the whole run
    progress = RunProgress(
        err_console, label, spec.run.iterations, transient=not args.live,
        completed=done.num_steps, completed_samples=done.num_samples,
    )  # fmt: skip
    with StopRequests(spec.live.stop_grace_s) as shutdown:
        result = run_into(args, spec, out, tracker, progress, shutdown)
        print_summary(result, out, console)
    return 0


def cmd_sweep(args: argparse.Namespace) -> int:
    from experiments.sweep_cmd import run_sweep_command

    if args.ray is not None:
        require_ray()  # a missing extra stops the sweep before any work
    return run_sweep_command(_load(args), args, console)


def cmd_advise(args: argparse.Namespace) -> int:
    from experiments.advise_cmd import run_advise

    spec = _load(args)
    out = Path(args.out)
    if check_run_out(out, spec, args.overwrite, ADVICE_FILES, "input.yaml"):
        for name in ADVICE_FILES:  # none of the earlier advice stays beside this one
            (out / name).unlink(missing_ok=True)
    check_out_dir(out)
    return run_advise(spec, args, console)


def cmd_bench(args: argparse.Namespace) -> int:
    if args.target == "peers":
        from experiments.peers_cmd import run_bench_peers

        report = run_bench_peers(args, console, err_console)  # prints its table first
    elif args.target == "sim":
        from experiments.bench import bench_sim

        spec = load_spec(
            config_path(args.spec or "streamrl-72b"),
            ["workload.max_output_tokens=20000", *args.set],
        )
        report = bench_sim(spec, iterations=args.iterations or 10)
    else:
        from experiments.bench_live import MODES, STEPS, bench_live

        spec = load_spec(config_path(args.spec or "live-tiny"), args.set)
        total = args.rounds * len(MODES) * (args.iterations or STEPS)
        with RunProgress(err_console, "bench live", total) as bar:
            report = bench_live(
                spec, steps=args.iterations, rounds=args.rounds, on_step=bar.on_step
            )
    print(json.dumps(report))
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

    trace = Path(args.trace)
    if args.action == "fit":
        out = check_out_file(Path(args.out), [trace])
        console.print(predictors.fit_command(trace, out, args.model, args.before, not args.no_text))
        return 0
    model = Path(args.model_file)
    json_path = Path(args.json) if args.json else predictors.eval_json_path(model)
    json_path = check_out_file(json_path, [model, trace], flag="--json")
    report = predictors.eval_command(model, trace, json_path)
    console.print(predictors.eval_table(report))
    console.print(f"metrics in [bold]{report['json_path']}[/bold]")
    return 0


def _with_spec(p: argparse.ArgumentParser, default: str | None) -> None:
    p.add_argument(
        "spec",
        nargs="?" if default else None,
        default=default,
        help="spec YAML or shipped config name"
        + (f" (default: {default})" if default else " (experiments/configs/)"),
    )
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a spec key, e.g. pipeline.mode=stream-sync (tandem spec keys lists them); "
        "the value is read as YAML, or taken as typed for a text key (run.name=007 stays 007)",
    )


def _add_sim_commands(sub: argparse._SubParsersAction) -> None:
    """run, sweep, advise, bench."""
    run = sub.add_parser("run", help="simulate (or, with --live, really run) one spec")
    _with_spec(run, DEFAULT_SPEC)
    run.add_argument(
        "--out", type=path_text, help="result directory (default: runs/NAME-MODE-TIME)"
    )
    run.add_argument("--live", action="store_true", help="real vLLM servers and torch trainer")
    run.add_argument(
        "--ray",
        nargs="?",
        const="local",
        type=ray_address,
        metavar="ADDRESS",
        help="with --live: place the cluster section on a Ray cluster (ADDRESS host:port or "
        "auto; without it, a local Ray on 127.0.0.1): servers and FSDP2 trainer ranks as actors",
    )
    run.add_argument(
        "--force-new-spec",
        action="store_true",
        help="live resume: go on although the spec changes training (kept as spec.resumed-N.yaml)",
    )
    run.add_argument(
        "--overwrite", action="store_true", help="replace the run --out holds of another spec"
    )
    run.set_defaults(func=cmd_run)

    add_sweep_parser(sub, _with_spec, cmd_sweep)
    add_advise_parser(sub, _with_spec, cmd_advise)

    bench = sub.add_parser("bench", help="benchmarks; the last line printed is JSON")
    bench.add_argument(
        "target",
        choices=["sim", "live", "peers"],
        help="sim: simulator speed; live: the pipeline modes; peers: tandem's modes against "
        "TRL's GRPOTrainer (extra: peers)",
    )
    bench.add_argument("spec", nargs="?", help="spec (default: streamrl-72b sim, live-tiny else)")
    bench.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE", help="override a spec key"
    )
    bench.add_argument(
        "--iterations",
        "--steps",
        type=positive_int,
        default=None,
        help="iterations per mode (default: 10 sim, 20 live and peers)",
    )
    bench.add_argument(
        "--rounds",
        type=positive_int,
        default=3,
        help="live, peers: rounds of every mode (seeds run.seed + r)",
    )
    add_peers_options(bench)
    bench.set_defaults(func=cmd_bench)


def _add_study_commands(sub: argparse._SubParsersAction) -> None:
    """reproduce, ranker."""
    repro = sub.add_parser("reproduce", help="reproduce a paper's throughput study as a report")
    repro.add_argument("study", choices=["streamrl", "pipelinerl"], help="the paper's study")
    repro.add_argument("--quick", action="store_true", help="fewer iterations and points (≤ 60 s)")
    repro.add_argument(
        "--out", type=path_text, help="report directory (default: runs/reproduce-STUDY, with --quick "
        "runs/reproduce-STUDY-quick)",
    )  # fmt: skip
    repro.add_argument(
        "--workers", type=positive_int, default=2, help="parallel simulation processes"
    )
    repro.set_defaults(func=cmd_reproduce)

    ranker = sub.add_parser("ranker", help="the output-length ranker: fit and evaluate")
    ranker_sub = ranker.add_subparsers(dest="action", required=True, metavar="ACTION")
    fit = ranker_sub.add_parser("fit", help="fit a ranker on a trace (samples.parquet or CSV)")
    fit.add_argument(
        "trace", help="samples.parquet of a run, or CSV/parquet of prompt,output_tokens"
    )
    fit.add_argument("--out", type=path_text, required=True, help="model file to write")
    fit.add_argument(
        "--model", choices=["hgb", "ridge"], default="hgb", help="regressor (default hgb)"
    )
    fit.add_argument("--before", type=int, default=None, help="fit on iterations < this only")
    fit.add_argument(
        "--no-text",
        action="store_true",
        help="leave the prompt-text features out: a model for simulated runs "
        "(policies.ranker_path), whose prompts have no text",
    )
    fit.set_defaults(func=cmd_ranker)
    evaluate = ranker_sub.add_parser("eval", help="recall, rank correlation, timings")
    evaluate.add_argument("model_file", metavar="MODEL", help="a model file of ranker fit")
    evaluate.add_argument("trace", metavar="TRACE", help="trace to score it on")
    evaluate.add_argument(
        "--json",
        help="metrics JSON to write (default: MODEL.eval.json, the model file's "
        "whole name followed by .eval.json)",
    )
    evaluate.set_defaults(func=cmd_ranker)


def _with_consoles(handler: Handler) -> Callable[[argparse.Namespace], int]:
    return lambda args: handler(args, console, err_console)


def _subparsers(parser: argparse.ArgumentParser) -> list[argparse.ArgumentParser]:
    """Every parser below ``parser`` (subcommands of subcommands too)."""
    out = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for child in dict.fromkeys(action.choices.values()):
                out += [child, *_subparsers(child)]
    return out


def _log_level_option(p: argparse.ArgumentParser, default: str | None) -> None:
    p.add_argument(
        "--log-level",
        type=str.upper,
        choices=LOG_LEVELS,
        default=argparse.SUPPRESS if default is None else default,
        help="console log level (default WARNING); run.log always gets INFO",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tandem", description=__doc__)
    parser.add_argument(
        "--version", action="version", version=f"tandem {version()}", help="print the version"
    )
    _log_level_option(parser, "WARNING")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _add_sim_commands(sub)
    add_live_commands(sub, _with_spec, _with_consoles)
    _add_study_commands(sub)
    add_tool_commands(sub, _with_spec, _with_consoles)
    for child in _subparsers(parser):  # also after the command: tandem run --log-level INFO
        _log_level_option(child, None)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    setup_logging(args.log_level)
    handler: Callable[[argparse.Namespace], int] = args.func
    with SigtermUnwinds() as stop:  # SIGTERM unwinds like Ctrl-C: every process is stopped
        return run_handler(handler, args, stop, console)


if __name__ == "__main__":
    sys.exit(main())
