"""The ``tandem bench peers`` command: parse, run :func:`experiments.bench_peers.bench_peers`,
print the table; the CLI prints the summary last, as one line of JSON."""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from experiments.arg_types import non_negative_int, path_text, share
from experiments.bench_peers import (
    DEFAULT_MODES,
    DEFAULT_ROUNDS,
    DEFAULT_STEPS,
    PeerBenchConfig,
    RoundResult,
    SystemRun,
    bench_peers,
)
from experiments.guards import check_out_dir
from experiments.peers_load import MAX_OTHER_SHARE
from experiments.peers_report import TABLE_HEADER, save, summarize, table_rows
from experiments.peers_trl import require_trl
from experiments.specs import config_path
from policies.modes import MODES
from policies.spec import RunSpec, load_spec, override_spec

DEFAULT_CONFIG = "live-tiny"
TABLE_WIDTH = 132  # the table's eight columns, unwrapped, also when stdout is a pipe


def resolved_spec(name: str | None, overrides: list[str]) -> RunSpec:
    """The spec, with ``model.path`` set to the one model directory every system loads."""
    from runtime.live_run import model_dir_for

    spec = load_spec(config_path(name or DEFAULT_CONFIG), overrides)
    return override_spec(spec, [f"model.path={model_dir_for(spec)}"])


def config_from_args(args: argparse.Namespace, spec: RunSpec) -> PeerBenchConfig:
    modes = tuple(args.modes or DEFAULT_MODES)
    unknown = [m for m in modes if m not in MODES.names()]
    if unknown:
        raise ValueError(f"--modes: unknown mode(s) {unknown}; known: {MODES.names()}")
    out = args.out or Path("runs") / f"bench-peers-{time.strftime('%Y%m%d-%H%M%S')}"
    return PeerBenchConfig(
        spec=spec, out_dir=check_out_dir(out), steps=args.iterations or DEFAULT_STEPS,
        rounds=args.rounds if args.rounds is not None else DEFAULT_ROUNDS, modes=modes,
        max_other_share=args.max_other_load, max_reruns=args.max_reruns,
    )  # fmt: skip


def run_bench_peers(
    args: argparse.Namespace, console: Console, err_console: Console
) -> dict[str, Any]:
    """Run the benchmark and print its table; the summary (the CLI prints it as JSON)."""
    require_trl()  # a missing extra stops the command before any work
    config = config_from_args(args, resolved_spec(args.spec, args.set))

    def progress(result: RoundResult, run: SystemRun) -> None:
        steady = run.rates.steady_samples_per_s
        err_console.print(
            f"round {result.attempt + 1} · {run.system}: {run.rates.samples_per_s:.0f} "
            f"samples/s ({'—' if steady is None else f'{steady:.0f}'} steady), "
            f"other load {run.load.other_share:.0%}" + (" [disturbed]" if run.disturbed else "")
        )

    results = bench_peers(config, on_run=progress)
    summary = summarize(config, results)
    save(config, results, summary)
    table = Table(title=f"bench peers · {summary['rounds_accepted']} accepted round(s), "
                        f"{config.steps} steps, median [min–max]")  # fmt: skip
    for name in TABLE_HEADER:
        table.add_column(name, justify="left" if name == "system" else "right")
    for row in table_rows(config, summary):
        table.add_row(*row)
    Console(file=console.file, width=max(console.width, TABLE_WIDTH)).print(table)
    for rejected in summary["rounds_rejected"]:
        console.print(f"round {rejected['round']} rejected: {rejected['reason']}")
    console.print(f"results in [bold]{config.out_dir}[/bold]")
    return summary


def add_peers_options(bench: argparse.ArgumentParser) -> None:
    """The options only ``bench peers`` takes (it shares --set, --rounds, --steps)."""
    bench.add_argument(
        "--modes", nargs="+", default=None, metavar="MODE",
        help=f"peers: tandem modes to compare with TRL (default: {' '.join(DEFAULT_MODES)})",
    )  # fmt: skip
    bench.add_argument("--out", type=path_text, default=None, help="peers: result directory "
                       "(default: runs/bench-peers-TIME)")  # fmt: skip
    bench.add_argument(
        "--max-other-load", type=share, default=MAX_OTHER_SHARE, metavar="SHARE",
        help="peers: reject a round in which other processes took more than this share of "
        f"the CPU during any run (default {MAX_OTHER_SHARE})",
    )  # fmt: skip
    bench.add_argument(
        "--max-reruns", type=non_negative_int, default=2,
        help="peers: rejected rounds run again, at most (default 2)",
    )  # fmt: skip
