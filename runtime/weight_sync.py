"""Weight broadcast between the trainer (rank 0) and vLLM workers (ranks 1..N).

A second process group beside vLLM's own, built directly from a ``TCPStore``
(``ProcessGroupGloo`` on CPU, ``ProcessGroupNCCL`` on GPU) without touching the default
group. Tensors travel in checkpoint layout (Hugging Face names and shapes), one
broadcast each, in the order the update request lists them.

:class:`WeightReceiver` is a vLLM ``worker_extension_cls``: its methods run inside the
worker through ``collective_rpc``. It receives every tensor into fresh buffers first and
loads them only when all arrived and are finite, so a failed update leaves the previous
weights serving.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import timedelta

import torch

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


@dataclass(slots=True, frozen=True)
class ParamMeta:
    name: str
    shape: tuple[int, ...]
    dtype: str  # a key of DTYPES


def tensor_checksum(t: torch.Tensor) -> tuple[float, float]:
    """(sum, sum of squares) in float64: equal tensors give equal checksums."""
    x = t.detach().to("cpu", torch.float64)
    return float(x.sum()), float((x * x).sum())


def make_group(
    host: str, port: int, rank: int, world_size: int, backend: str, timeout_s: float
) -> torch.distributed.ProcessGroup:
    """Join (rank 0: host) the weight group; blocks until every rank has joined."""
    timeout = timedelta(seconds=timeout_s)
    store = torch.distributed.TCPStore(
        host, port, world_size, is_master=(rank == 0), timeout=timeout, wait_for_workers=False
    )
    if backend == "nccl":
        return torch.distributed.ProcessGroupNCCL(store, rank, world_size)
    if backend != "gloo":
        raise ValueError(f"backend must be 'gloo' or 'nccl', not {backend!r}")
    return torch.distributed.ProcessGroupGloo(store, rank, world_size, timeout)


def broadcast(group: torch.distributed.ProcessGroup, tensor: torch.Tensor) -> None:
    opts = torch.distributed.BroadcastOptions()
    opts.rootRank = 0
    group.broadcast([tensor], opts).wait()


class WeightSender:
    """The trainer side: rank 0 of the weight group."""

    def __init__(self) -> None:
        self._group: torch.distributed.ProcessGroup | None = None
        self.device = torch.device("cpu")

    def join(self, host: str, port: int, world_size: int, backend: str, timeout_s: float) -> None:
        self._group = make_group(host, port, 0, world_size, backend, timeout_s)
        self.device = torch.device("cuda" if backend == "nccl" else "cpu")

    @property
    def joined(self) -> bool:
        return self._group is not None

    def send(self, tensors: Iterable[torch.Tensor]) -> None:
        if self._group is None:
            raise RuntimeError("join the weight group before sending")
        for t in tensors:
            broadcast(self._group, t.detach().to(self.device).contiguous())


def params_meta(named: Iterable[tuple[str, torch.Tensor]]) -> list[ParamMeta]:
    return [ParamMeta(n, tuple(t.shape), str(t.dtype).removeprefix("torch.")) for n, t in named]


class WeightReceiver:
    """vLLM worker extension: join the weight group, receive and load a weight version."""

    def tandem_join(
        self, host: str, port: int, rank: int, world_size: int, backend: str, timeout_s: float
    ) -> bool:
        self.tandem_group = make_group(host, port, rank, world_size, backend, timeout_s)
        return True

    def _tandem_device(self) -> torch.device:
        return torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")

    def tandem_receive(self, metas: Sequence[tuple[str, tuple[int, ...], str]]) -> dict:
        """Receive every tensor, then load them all; returns checksums of what was loaded."""
        group = getattr(self, "tandem_group", None)
        if group is None:
            raise RuntimeError("no weight group: call /init_process_group first")
        device = self._tandem_device()
        items = []
        for name, shape, dtype in metas:
            buf = torch.empty(tuple(shape), dtype=DTYPES[dtype], device=device)
            broadcast(group, buf)
            items.append((name, buf))
        bad = [n for n, t in items if not bool(torch.isfinite(t).all())]
        if bad:
            raise ValueError(f"non-finite weights received for {bad[:3]}; update not loaded")
        self.model_runner.reload_weights(weights_iterator=iter(items))
        self.tandem_loaded = {n: tensor_checksum(t) for n, t in items}
        return self.tandem_loaded

    def tandem_checksums(self) -> dict:
        return dict(getattr(self, "tandem_loaded", {}))
