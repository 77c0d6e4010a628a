"""The CLI's file tools: ``spec show`` / ``spec keys``, ``export`` and ``trace``.

Their handlers import what they need when they run, so building the parser stays fast.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from experiments.arg_types import non_negative_int, path_text
from experiments.specs import config_path
from policies.spec import load_spec


def cmd_spec(args: argparse.Namespace, console: Console, err_console: Console) -> int:
    if args.action == "show":
        spec = load_spec(config_path(args.spec), args.set)
        # soft_wrap: a long value stays on its line, so `spec show > my.yaml` is valid YAML
        console.print(spec.to_yaml(), end="", markup=False, highlight=False, soft_wrap=True)
        return 0
    from experiments.spec_keys import spec_keys

    keys = spec_keys()
    if args.format == "json":
        rows = [
            {"key": k.key, "type": k.type, "default": k.default, "description": k.description}
            for k in keys
        ]
        console.print_json(json.dumps(rows))
        return 0
    if not console.is_terminal:  # piped: one key a line, unwrapped, tab-separated (cut -f1)
        for k in keys:  # written past rich, which would turn the tabs into spaces
            cells = (k.key, k.type, json.dumps(k.default), k.description or "")
            console.file.write("\t".join(cells) + "\n")
        return 0
    table = Table(title="spec keys (set any with --set KEY=VALUE)")
    for col in ("key", "type", "default", "description"):
        table.add_column(col, overflow="fold")
    for k in keys:
        table.add_row(k.key, k.type, json.dumps(k.default), k.description or "")
    console.print(table)
    return 0


def cmd_export(args: argparse.Namespace, console: Console, err_console: Console) -> int:
    from runtime.export import export_policy

    info = export_policy(Path(args.run_dir), Path(args.out), args.step, args.dtype)
    console.print(
        f"step {info.step} (weight version {info.version}) of {info.run_dir} exported to "
        f"[bold]{info.out_dir}[/bold] (transformers: AutoModelForCausalLM.from_pretrained; "
        f"tandem serve {info.out_dir})"
    )
    return 0


def cmd_trace(args: argparse.Namespace, console: Console, err_console: Console) -> int:
    from experiments.guards import check_out_file
    from policies.results import RunResult, write_atomic

    default = Path(args.run_dir) / "trace.json"
    out = check_out_file(Path(args.out) if args.out else default, [], default=default)
    result = RunResult.load(Path(args.run_dir))
    write_atomic(out, result.trace_json())
    console.print(f"trace in [bold]{out}[/bold] (open it at https://ui.perfetto.dev)")
    return 0


def add_tool_commands(
    sub: Any,
    with_spec: Callable[[argparse.ArgumentParser, str | None], None],
    handler: Callable[[Callable[..., int]], Callable[[argparse.Namespace], int]],
) -> None:
    """``spec``, ``export`` and ``trace``; ``handler`` gives a command the CLI's consoles."""
    spec = sub.add_parser("spec", help="show a resolved spec, or list every spec key")
    actions = spec.add_subparsers(dest="action", required=True, metavar="ACTION")
    show = actions.add_parser("show", help="print the resolved spec (defaults and --set applied)")
    with_spec(show, None)
    show.set_defaults(func=handler(cmd_spec))
    keys = actions.add_parser("keys", help="every spec key with its type, default, description")
    keys.add_argument("--format", choices=["table", "json"], default="table", help="output format")
    keys.set_defaults(func=handler(cmd_spec))

    export = sub.add_parser(
        "export", help="a live run's trained policy as a Hugging Face model directory"
    )
    export.add_argument("run_dir", help="directory of a live run (holds checkpoints/)")
    export.add_argument(
        "--out", type=path_text, required=True, help="model directory to write (new or empty)"
    )
    export.add_argument(
        "--step",
        type=non_negative_int,
        default=None,
        help="global optimizer step to export, as in steps.json (default: the last "
        "checkpoint; earlier ones are kept as set by live.keep_checkpoints)",
    )
    export.add_argument(
        "--dtype",
        choices=["auto", "float32", "bfloat16", "float16"],
        default="auto",
        help="weight dtype (default auto: the base model config's)",
    )
    export.set_defaults(func=handler(cmd_export))

    trace = sub.add_parser("trace", help="(re)write a run's trace.json for Perfetto / Chrome")
    trace.add_argument("run_dir", help="a run directory (events.parquet, samples.parquet)")
    trace.add_argument(
        "--out", type=path_text, default=None, help="trace file (default: RUN_DIR/trace.json)"
    )
    trace.set_defaults(func=handler(cmd_trace))
