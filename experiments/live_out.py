"""What ``tandem run --live`` does with the run directory it is given (``--out``).

* A run that already trained every step of the spec is not run again: its saved results
  are shown as they are, none of them (plots included) written again
  (:func:`finished_live_run`).
* A resumed run's progress bar counts the whole run, the steps before its checkpoint
  and the samples they trained already done (:func:`live_done_before`).
* A run refused before it started (``runtime.errors.StartRefused``: an attached server
  that would not serve it) leaves no ``run.log`` of its own (:func:`nothing_left_if_refused`),
  as a spec the CLI refuses leaves nothing: the same command later runs as into a fresh
  directory.
"""

from __future__ import annotations

import argparse
import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from policies.logs import RUN_LOG
from policies.results import RunResult
from policies.spec import RunSpec
from runtime.errors import StartRefused


def finished_live_run(args: argparse.Namespace, spec: RunSpec) -> RunResult | None:
    """The saved result of the live run in ``args.out`` if it trained every step of
    ``spec``, else None (a run to start or to resume). A spec its resume would refuse
    (``runtime.run_dir.RunDir.check``) is refused here, before anything is written."""
    if not args.live or args.out is None:
        return None
    from runtime.run_dir import RunDir

    run_dir = RunDir(Path(args.out), args.ray)
    run_dir.check(spec, args.force_new_spec)
    return RunResult.load(run_dir.path) if run_dir.finished(spec) else None


@dataclass(frozen=True, slots=True)
class DoneBefore:
    """What a run finds done before it starts: a resumed live run's checkpointed part."""

    num_steps: int = 0
    num_samples: int = 0  # trained by those steps


def live_done_before(args: argparse.Namespace, spec: RunSpec, out: Path) -> DoneBefore:
    """The steps of ``spec`` done before this run starts, those a live run into ``out``
    resumes after, and the samples they trained (none for a fresh or a simulated run)."""
    if not args.live:
        return DoneBefore()
    from runtime.run_dir import RunDir

    run_dir = RunDir(out, args.ray)
    num_steps = min(run_dir.checkpointed_steps(), spec.run.iterations)
    return DoneBefore(num_steps, run_dir.checkpointed_samples() if num_steps else 0)


@contextlib.contextmanager
def nothing_left_if_refused(out: Path, made_out: bool) -> Iterator[None]:
    """While a run into ``out`` starts: if it is refused before it started
    (:class:`StartRefused`), the ``run.log`` this command began goes (one there before
    stays), and so does ``out`` if this command made it (``made_out``) and it is empty.
    The refusal itself is the console's one line."""
    log, had_log = out / RUN_LOG, (out / RUN_LOG).exists()
    try:
        yield
    except StartRefused:
        if not had_log:
            log.unlink(missing_ok=True)
        if made_out:
            with contextlib.suppress(OSError):  # not empty: it stays
                out.rmdir()
        raise
