"""Checks the CLI makes before any work: a writable output directory, the live runtime, Ray."""

from __future__ import annotations

import argparse
import contextlib
import os
from collections.abc import Sequence
from pathlib import Path

from policies.results import RESULT_FILES
from policies.spec import RunSpec, SpecError, load_spec, spec_changes

# modules of the live runtime (scripts/setup.sh --live); a simulator-only install lacks them
LIVE_MODULES = frozenset(
    {"torch", "vllm", "httpx", "fastapi", "starlette", "uvicorn", "transformers",
     "safetensors", "tokenizers"}
)  # fmt: skip
LIVE_INSTALL_HINT = "install the live runtime with: bash scripts/setup.sh --live"
RUN_FILES = frozenset({"spec.yaml", "run.log", *RESULT_FILES})  # a run directory's own files


def check_out_dir(out: str | Path, flag: str = "--out") -> Path:
    """Create ``out`` if needed and prove it writable, before the work that fills it.

    An ``--out`` that is a file, lies under a file or cannot be written (read-only,
    no permission) is a ``ValueError`` naming it, instead of a failure after the run."""
    path = Path(out)
    if path.exists() and not path.is_dir():
        raise ValueError(f"{flag} {path}: is a file, not a directory")
    for parent in path.parents:
        if parent.exists():
            if not parent.is_dir():
                raise ValueError(f"{flag} {path}: {parent} is a file, not a directory")
            break
    probe = path / f".tandem-write-check-{os.getpid()}"
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe.write_bytes(b"")
    except OSError as err:
        raise ValueError(f"{flag} {path}: cannot write there ({err.strerror or err})") from None
    finally:
        with contextlib.suppress(OSError):
            probe.unlink()
    return path


def check_run_out(
    out: Path,
    spec: RunSpec,
    overwrite: bool = False,
    files: frozenset[str] = frozenset(RESULT_FILES),
    saved_spec: str = "spec.yaml",
) -> bool:
    """Refuse a run into ``--out`` that holds another spec's results, before any work:
    they would be replaced and its ``run.log`` would mix two runs (seen: a 2-iteration run
    into a 12-iteration run's directory). A run of the same spec goes on (its results are
    replaced by the same run's), and so does one into a run that left no results (stopped
    or failed before them); ``overwrite`` (``--overwrite``) replaces another's. Returns
    whether ``out`` holds ``files`` to remove first (``overwrite``). ``files`` and
    ``saved_spec`` (where the earlier spec is) name another command's output (``tandem
    advise``). A live run that resumes its checkpoint is checked by ``runtime.run_dir``."""
    held = sorted(p.name for p in (out / name for name in files) if p.is_file())
    if not held:
        return False
    if overwrite:
        return True
    saved = out / saved_spec
    try:
        changes = (
            spec_changes(_as_given(load_spec(saved)), _as_given(spec)) if saved.is_file() else None
        )
    except (SpecError, ValueError, OSError) as err:
        changes = [f"its {saved_spec} does not load ({err})"]
    if changes == []:
        return False
    why = f"no {saved_spec}" if changes is None else "; ".join(changes[:5])
    more = f" and {len(changes) - 5} more" if changes and len(changes) > 5 else ""
    raise SpecError(
        f"--out {out} holds the results of another spec ({', '.join(held)}; {why}{more}): use another --out, "
        "or pass --overwrite to replace it"
    )


def replaces_a_run(args: argparse.Namespace, spec: RunSpec) -> bool:
    """``tandem run``'s :func:`check_run_out` of ``args.out``; a live run into its own
    checkpoint is a resume, which ``runtime.run_dir`` checks."""
    if args.live:
        from runtime.run_dir import RunDir

        if RunDir(Path(args.out), args.ray).checkpoint.exists():
            return False
    return check_run_out(Path(args.out), spec, args.overwrite)


def _as_given(spec: RunSpec) -> RunSpec:
    """``spec`` as its user gave it, as far as a run's saved spec tells: an allocation
    policy other than ``fixed`` writes the split it chose, so only the total GPUs count."""
    if spec.policies.allocation == "fixed":
        return spec
    cluster = spec.cluster
    total = sum(p.num_gpus for p in cluster.generation) + cluster.trainer.num_gpus
    pools = [p.model_copy(update={"num_gpus": 0}) for p in cluster.generation]
    pools[0] = pools[0].model_copy(update={"num_gpus": total})
    trainer = cluster.trainer.model_copy(update={"num_gpus": 0})
    split = cluster.model_copy(update={"generation": pools, "trainer": trainer})
    return spec.model_copy(update={"cluster": split})


def check_out_file(
    out: Path, inputs: Sequence[Path], flag: str = "--out", default: Path | None = None
) -> Path:
    """Refuse an output file that is one of the command's ``inputs`` or an existing file of
    a run directory (``tandem trace RUN --out RUN/metrics.json`` replaced the run's
    metrics), before any work; ``default`` is the command's own default output, which
    it may rewrite (``RUN/trace.json``)."""
    for source in inputs:
        if _same_file(out, source):
            raise ValueError(f"{flag} {out}: is the command's input {source}; write elsewhere")
    is_run_file = out.name in RUN_FILES and (out.parent / "spec.yaml").is_file()
    if out.is_file() and is_run_file and not (default and _same_file(out, default)):
        raise ValueError(f"{flag} {out}: would replace a result of run {out.parent}")
    return out


def _same_file(a: Path, b: Path) -> bool:
    """Whether ``a`` and ``b`` name one file (through links, ``..`` or a relative path)."""
    if a.exists() and b.exists():
        return os.path.samefile(a, b)
    return a.resolve() == b.resolve()


def fresh_dir(base: Path) -> Path:
    """A new directory ``base``, or ``base-2``, ``base-3``, … where that is taken: made
    here, so two runs started in the same second (whose default names are alike) never
    share one."""
    for n in range(1, 10_000):
        path = base if n == 1 else base.with_name(f"{base.name}-{n}")
        try:
            path.mkdir(parents=True)
        except FileExistsError:
            if path.parent.is_dir():
                continue
            raise ValueError(f"{path}: {path.parent} is not a directory; give --out") from None
        except OSError as err:
            raise ValueError(f"{path}: cannot write there ({err.strerror or err})") from None
        return path
    raise ValueError(f"{base}: 10 000 runs of this name already; give --out")


def missing_live_module(err: ModuleNotFoundError) -> str | None:
    """The live-runtime module an import failed on, or None for any other module."""
    root = (err.name or "").split(".")[0]
    return root if root in LIVE_MODULES else None
