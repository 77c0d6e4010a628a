"""A command's errors as one line each and an exit code: the ``tandem`` command line's
last layer (:func:`run_handler`). A user's mistake (a spec key, a path, a missing extra)
is one line, never a traceback, and says the user's text as typed (escaped: ``[x]`` is not
markup to rich); a failed command leaves no empty ``--out`` of its own."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path

from rich.console import Console
from rich.markup import escape

from experiments.guards import LIVE_INSTALL_HINT, missing_live_module
from experiments.stop_signal import SigtermUnwinds
from policies.spec import SpecError
from runtime.errors import MissingExtra

Command = Callable[[argparse.Namespace], int]  # a command: its arguments -> exit code


def run_handler(
    handler: Command, args: argparse.Namespace, stop: SigtermUnwinds, console: Console
) -> int:
    """The command's exit code; a failed command leaves no empty ``--out`` of its own."""
    out = getattr(args, "out", None)
    missing = _missing_dirs(Path(out)) if out is not None else []
    code = 1  # an error no handler below names
    try:
        code = _handle(handler, args, stop, console)
        return code
    finally:
        if code != 0:
            _remove_empty(missing)


def _missing_dirs(out: Path) -> list[Path]:
    """``out`` and those of its parents that do not exist yet, deepest first."""
    return [p for p in (out, *out.parents) if not p.exists()]


def _remove_empty(dirs: list[Path]) -> None:
    """Remove ``dirs`` (deepest first) while they are empty directories."""
    for path in dirs:
        try:
            path.rmdir()
        except FileNotFoundError:  # never made (the command failed before)
            continue
        except OSError:  # not empty, or a file: it, and so its parents, stay
            return


def _handle(
    handler: Command, args: argparse.Namespace, stop: SigtermUnwinds, console: Console
) -> int:
    from runtime.errors import LiveRunError  # pure Python: present on any install

    try:
        return handler(args)
    except SpecError as err:
        console.print(f"[red]spec error[/red]: {escape(str(err))}", soft_wrap=True)
        return 2
    except MissingExtra as err:  # an optional dependency the command asked for
        console.print(f"[red]error[/red]: {escape(str(err))}", soft_wrap=True)
        return 2
    except (ValueError, OSError) as err:  # user mistakes; a path it cannot read or write
        if isinstance(err, OSError) and err.filename is None:
            raise
        said = f"{err.filename}: {err.strerror}" if isinstance(err, OSError) else str(err)
        console.print(f"[red]error[/red]: {escape(said)}", soft_wrap=True)  # one line, to grep
        return 2
    except LiveRunError as err:  # a process of a live run died: one line naming it
        console.print(f"[red]error[/red]: {escape(str(err))}", soft_wrap=True)
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
    except KeyboardInterrupt as err:  # Ctrl-C, or SIGTERM
        how = getattr(err, "how_to_go_on", None)  # a live run's (runtime.errors)
        line = f"; {escape(how)}" if how else ""
        console.print(f"[yellow]{stop.what()}[/yellow]{line}", soft_wrap=True)
        return stop.exit_code()
