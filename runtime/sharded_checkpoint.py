"""Sharded checkpoints of :class:`runtime.sharded_trainer.ShardedTrainer`: a directory.

Every rank writes its own shards of the model and the optimizer with
``torch.distributed.checkpoint`` (DCP: one ``__<rank>_0.distcp`` file each, plus the
``.metadata`` rank 0 writes), so the directory must be on a file system every rank sees.
Rank 0 adds ``tandem.pt`` (:data:`INFO_FILE`): the weight version, the world size that
wrote it and the caller's data position, as plain values.

A save goes to the sibling ``.<name>.tmp``; when every rank has finished, rank 0 publishes
it (:func:`runtime.checkpoints.publish_dir`), so a crash at any point leaves the last good
checkpoint readable and a stray temporary directory is simply overwritten by the next
save. DCP reshards on load: a checkpoint written by M ranks loads on any other number.
:func:`full_state_dict_from_dcp` reads the full model state dict in one process, with no
process group (``tandem export``).
"""

from __future__ import annotations

import io
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp

from policies.results import write_atomic
from runtime.checkpoints import publish_dir, readable

INFO_FILE = "tandem.pt"


@dataclass(slots=True, frozen=True)
class ShardedCheckpointInfo:
    version: int  # optimizer steps taken (the weight version of the checkpoint)
    world_size: int  # ranks that wrote it
    data: Any  # the caller's data position (plain values: DataPosition.to_dict())


def _tmp_dir(path: Path) -> Path:
    return path.with_name(f".{path.name}.tmp")


def save_dcp(path: Path, state: dict[str, Any], info: ShardedCheckpointInfo, rank: int) -> None:
    """Collective: every rank writes its shards of ``state``; rank 0 publishes ``path``."""
    tmp = _tmp_dir(path)
    if rank == 0:
        shutil.rmtree(tmp, ignore_errors=True)  # a save that crashed half-way
        tmp.parent.mkdir(parents=True, exist_ok=True)
    dist.barrier()
    dcp.save(state, checkpoint_id=tmp)
    if rank == 0:
        buf = io.BytesIO()
        torch.save(asdict(info), buf)
        write_atomic(tmp / INFO_FILE, buf.getvalue())
    dist.barrier()  # every shard is written
    if rank == 0:
        publish_dir(tmp, path)
    dist.barrier()  # no rank goes on (and, say, reads it) before it is in place


def read_info(path: Path) -> ShardedCheckpointInfo:
    source = _existing(path)
    return ShardedCheckpointInfo(**torch.load(source / INFO_FILE, weights_only=True))


def load_dcp(path: Path, state: dict[str, Any]) -> ShardedCheckpointInfo:
    """Collective: fill ``state`` (sharded tensors, as ``get_state_dict`` made them) from
    ``path``, resharded to this world size; its info."""
    source = _existing(path)
    dcp.load(state, checkpoint_id=source)
    return read_info(source)


def full_state_dict_from_dcp(path: Path) -> dict[str, torch.Tensor]:
    """The full (unsharded) model state dict of a sharded checkpoint, in this process
    (no process group; Hugging Face names, on the CPU)."""
    from torch.distributed.checkpoint.default_planner import _EmptyStateDictLoadPlanner
    from torch.distributed.checkpoint.state_dict_loader import _load_state_dict

    state: dict[str, Any] = {}
    _load_state_dict(
        state,
        storage_reader=dcp.FileSystemReader(_existing(path)),
        planner=_EmptyStateDictLoadPlanner(keys={"model"}),
        no_dist=True,
    )
    return state["model"]


def load_full_checkpoint(path: Path) -> dict[str, Any]:
    """A sharded checkpoint as ``Trainer.save_checkpoint`` would have written it, less the
    optimizer: ``version``, ``model`` (full state dict) and ``data``."""
    info = read_info(path)
    return {"version": info.version, "model": full_state_dict_from_dcp(path), "data": info.data}


def _existing(path: Path) -> Path:
    source = readable(Path(path))
    if source is None:
        raise FileNotFoundError(f"no sharded checkpoint at {path}")
    return source
