"""``tandem export``: the trained policy of a live run as a Hugging Face model directory.

The trainer's checkpoints (``runtime.checkpoints``) hold its weights in checkpoint layout
(the Hugging Face names of the model it loaded): a ``.pt`` file, or the directory of a
sharded trainer (``last.dcp``: its shards are gathered here, in one process). Export puts them back into the run's
base model (``model.path``, or the embedded tiny model) and writes what ``transformers``
(``AutoModelForCausalLM.from_pretrained``), ``tandem serve`` and a stock vLLM load:
``config.json`` and ``model.safetensors`` (``save_pretrained``, safetensors), the base
model's tokenizer and generation files copied unchanged, and ``tandem_export.json``
saying which run, step and weight version it is. The directory is built beside ``--out``
and renamed into place, so a crash never leaves half a model there.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from policies.spec import load_spec
from runtime.checkpoints import CHECKPOINT_DIR, find_last, kept_checkpoints, readable
from runtime.hf_quiet import quiet_progress_bars
from runtime.run_dir import newest_spec

log = logging.getLogger(__name__)

EXPORT_INFO = "tandem_export.json"
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".h5", ".msgpack", ".ckpt")
DTYPES = ("auto", "float32", "bfloat16", "float16")


@dataclass(frozen=True, slots=True)
class ExportInfo:
    out_dir: str
    run_dir: str
    step: int  # the global optimizer step whose weights these are (steps.json numbering)
    version: int  # their weight version (step + 1)
    checkpoint: str
    base_model_dir: str
    dtype: str


def _load(path: Path) -> dict[str, Any]:
    """``version`` and ``model`` (the full state dict) of a ``.pt`` or sharded checkpoint."""
    import torch

    if path.suffix == ".dcp":  # a sharded trainer's directory
        from runtime.sharded_checkpoint import load_full_checkpoint

        return load_full_checkpoint(path)
    return torch.load(path, map_location="cpu", weights_only=True)


def find_checkpoint(run_dir: Path, step: int | None) -> tuple[Path, dict[str, Any]]:
    """The checkpoint of global ``step`` (None: the last one) and its contents."""
    last = find_last(run_dir)
    kept = kept_checkpoints(run_dir / CHECKPOINT_DIR)
    if step is not None and step in kept:
        return kept[step], _load(kept[step])
    if readable(last) is None:
        raise ValueError(
            f"{run_dir}: no {CHECKPOINT_DIR}/last.pt or last.dcp (export takes a live run's "
            "directory; checkpoints come every live.checkpoint_every steps)"
        )
    state = _load(last)
    if step is None or state["version"] == step + 1:
        return last, state
    raise ValueError(
        f"--step {step}: not kept in {run_dir / CHECKPOINT_DIR} (kept steps: "
        f"{', '.join(map(str, kept)) or 'none'}; {last.name} is step {state['version'] - 1}; "
        "live.keep_checkpoints sets how many are kept)"
    )


def _write_model(base_dir: str, weights: dict[str, Any], out: Path, dtype: str) -> str:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    quiet_progress_bars()  # no "Writing model shards" bar: the command says what it wrote
    config = AutoConfig.from_pretrained(base_dir)
    model = AutoModelForCausalLM.from_config(config)
    model.load_state_dict(weights, strict=True)
    if dtype == "auto":
        dtype = str(getattr(config, "dtype", None) or "float32").removeprefix("torch.")
    model = model.to(getattr(torch, dtype))
    model.save_pretrained(out, safe_serialization=True)
    return dtype


def _copy_tokenizer(base_dir: str, out: Path) -> list[str]:
    """Every file of the base directory but its weights and config (tokenizer,
    generation config, chat template), unchanged."""
    copied = []
    for path in sorted(Path(base_dir).iterdir()):
        weights = path.name.endswith(WEIGHT_SUFFIXES) or path.name.endswith(".index.json")
        if path.is_file() and not weights and path.name != "config.json":
            shutil.copyfile(path, out / path.name)
            copied.append(path.name)
    return copied


def _readable(folder: Path) -> None:
    """Modes of a published directory (mkdtemp makes it private)."""
    folder.chmod(0o755)
    for path in folder.iterdir():
        path.chmod(0o644)


def _temp_beside(out: Path) -> Path:
    """A new private directory beside ``out``, renamed to it once complete; a ``ValueError``
    naming ``--out`` where its parent cannot be written (not the temporary name)."""
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        return Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}.export-"))
    except OSError as err:
        raise ValueError(f"--out {out}: cannot write in {out.parent}: {err.strerror}") from None


def export_policy(
    run_dir: str | Path, out_dir: str | Path, step: int | None = None, dtype: str = "auto"
) -> ExportInfo:
    """Write the policy of ``run_dir`` after global ``step`` (None: its last checkpoint) as
    a Hugging Face model directory ``out_dir`` (which must not exist, or be empty)."""
    from runtime.live_run import model_dir_for

    run, out = Path(run_dir), Path(out_dir)
    if dtype not in DTYPES:
        raise ValueError(f"--dtype {dtype!r}: choose one of {', '.join(DTYPES)}")
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ValueError(f"--out {out}: exists and is not an empty directory")
    if not (run / "spec.yaml").is_file():
        raise ValueError(f"{run}: not a run directory (no spec.yaml); give a live run's directory")
    spec = load_spec(newest_spec(run))  # the spec the run last ran (its model.path)
    ckpt, state = find_checkpoint(run, step)
    # a kept step's own file: last.pt moves on if the run is resumed
    ckpt = kept_checkpoints(run / CHECKPOINT_DIR).get(state["version"] - 1, ckpt)
    base = model_dir_for(spec)
    tmp = _temp_beside(out)
    try:
        written = _write_model(base, state["model"], tmp, dtype)
        _copy_tokenizer(base, tmp)
        info = ExportInfo(
            str(out.resolve()), str(run.resolve()), state["version"] - 1, state["version"],
            str(ckpt.resolve()), base, written,
        )  # fmt: skip
        (tmp / EXPORT_INFO).write_text(json.dumps(asdict(info), indent=2) + "\n")
        _readable(tmp)
        if out.exists():
            out.rmdir()
        os.replace(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    log.info("exported step %d (version %d) of %s to %s", info.step, info.version, run, out)
    return info
