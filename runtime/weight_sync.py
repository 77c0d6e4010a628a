"""Weight broadcast between the trainer (rank 0) and vLLM workers (ranks 1..N).

A second process group beside vLLM's own, built directly from a ``TCPStore``
(``ProcessGroupGloo`` on CPU, ``ProcessGroupNCCL`` on GPU) without touching the default
group (:mod:`runtime.weight_group`: a server gives up on a master that does not answer
within seconds). Tensors travel in checkpoint layout (Hugging Face names and shapes) in the order
the update request lists them, packed into flat *buckets*: consecutive tensors of one
dtype, up to ``BUCKET_BYTES`` each, one broadcast per bucket (one in all for a small
model). Both sides derive the same buckets from the metadata (:func:`plan_buckets`) and
keep their flat buffers between updates, so an update costs no per-tensor allocation
and no per-tensor collective.

Updates are verified: the sender states, per bucket, its dtype, tensor count, byte count
and a content hash (:class:`BucketDigest`, BLAKE2b of the bytes it broadcasts), and the
receiver checks them against the metadata before pausing and against the bytes received
before loading. Receive buffers are filled with NaN first, so a tensor that never
arrived is named as such.

:class:`WeightReceiver` is a vLLM ``worker_extension_cls``: its methods run inside the
worker through ``collective_rpc``. It receives every bucket first and loads the weights
only when all arrived, match their digests and are finite, so a failed update leaves the
previous weights serving. Every receive has a deadline (below the HTTP route's, so the
worker is free again before the route answers): a sender that stalls or dies costs the
update, the group is closed and ``/init_process_group`` makes a new one. Failures come
back as a :class:`ReceiveFailure` value, never as an exception inside vLLM's worker. It
alternates between two sets of receive buffers, so the set last loaded is never
overwritten: per-tensor checksums of the served weights are computed from it on
request, not inside the pause.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from datetime import timedelta

import torch

from runtime.direct_load import load_into
from runtime.joining import JOIN_CONNECT_S
from runtime.weight_group import make_group, master_store

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
BUCKET_BYTES = 512 * 2**20  # at most this many bytes per broadcast


@dataclass(slots=True, frozen=True)
class ParamMeta:
    name: str
    shape: tuple[int, ...]
    dtype: str  # a key of DTYPES

    @property
    def numel(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n


@dataclass(slots=True, frozen=True)
class Bucket:
    """Tensors ``first .. first + count - 1`` of the update, packed flat in one dtype."""

    dtype: str
    first: int
    count: int
    numel: int


def plan_buckets(metas: Sequence[ParamMeta], max_bytes: int = BUCKET_BYTES) -> list[Bucket]:
    """Consecutive same-dtype tensors, each bucket at most ``max_bytes`` (or one tensor)."""
    out: list[Bucket] = []
    for i, m in enumerate(metas):
        size = DTYPES[m.dtype].itemsize
        last = out[-1] if out else None
        if last and last.dtype == m.dtype and (last.numel + m.numel) * size <= max_bytes:
            out[-1] = Bucket(m.dtype, last.first, last.count + 1, last.numel + m.numel)
        else:
            out.append(Bucket(m.dtype, i, 1, m.numel))
    return out


@dataclass(slots=True, frozen=True)
class BucketDigest:
    """What the sender states about one bucket it broadcasts (checked before loading)."""

    dtype: str
    num_tensors: int
    num_bytes: int
    blake2b: str  # hex digest (16 bytes) of the bucket's bytes


def content_hash(flat: torch.Tensor) -> str:
    """BLAKE2b (16-byte digest) of a flat tensor's bytes (a host copy if on a GPU)."""
    data = flat.detach().contiguous().view(torch.uint8).cpu().numpy()
    return hashlib.blake2b(memoryview(data), digest_size=16).hexdigest()


def bucket_digests(buckets: Sequence[Bucket], flats: Sequence[torch.Tensor]) -> list[BucketDigest]:
    return [
        BucketDigest(b.dtype, b.count, flat.numel() * flat.element_size(), content_hash(flat))
        for b, flat in zip(buckets, flats)
    ]


@dataclass(slots=True, frozen=True)
class ReceiveFailure:
    """Why an update was not loaded; ``field``: the request field or tensor at fault, if any."""

    kind: str  # "mismatch" (bad content), "timeout" (nothing or too little arrived), "no-group"
    field: str | None
    message: str

    def to_dict(self) -> dict:
        return asdict(self)


def tensor_checksum(t: torch.Tensor) -> tuple[float, float]:
    """(sum, sum of squares) in float64: equal tensors give equal checksums."""
    x = t.detach().to("cpu", torch.float64)
    return float(x.sum()), float((x * x).sum())


def start_broadcast(
    group: torch.distributed.ProcessGroup, tensor: torch.Tensor, timeout_s: float | None = None
) -> torch.distributed.Work:
    """Start a broadcast from rank 0 (the backend's own threads carry it); ``timeout_s``
    bounds this one collective (else the group's), raised by the work's ``wait``."""
    opts = torch.distributed.BroadcastOptions()
    opts.rootRank = 0
    if timeout_s is not None:
        opts.timeout = timedelta(seconds=max(timeout_s, 0.001))
    return group.broadcast([tensor], opts)


class FlatBuffers:
    """One flat tensor per bucket, reused while the layout stays the same."""

    def __init__(self) -> None:
        self._key: tuple | None = None
        self.flats: list[torch.Tensor] = []

    def get(self, buckets: list[Bucket], device: torch.device) -> list[torch.Tensor]:
        key = (tuple(buckets), str(device))
        if key != self._key:
            self.flats = [
                torch.empty(b.numel, dtype=DTYPES[b.dtype], device=device) for b in buckets
            ]
            self._key = key
        return self.flats


def unpack(
    metas: Sequence[ParamMeta], buckets: list[Bucket], flats: list[torch.Tensor]
) -> list[tuple[str, torch.Tensor]]:
    """(name, view into its bucket) for every tensor, in update order."""
    out = []
    for b, flat in zip(buckets, flats):
        offset = 0
        for m in metas[b.first : b.first + b.count]:
            out.append((m.name, flat[offset : offset + m.numel].view(m.shape)))
            offset += m.numel
    return out


class WeightSender:
    """The trainer side: rank 0 of the weight group."""

    def __init__(self) -> None:
        self._group: torch.distributed.ProcessGroup | None = None
        self._store: torch.distributed.TCPStore | None = None  # listening, not yet joined
        self.device = torch.device("cpu")
        self._buffers = FlatBuffers()

    def listen(self, host: str, port: int, world_size: int, timeout_s: float) -> None:
        """Open the group's store before the servers are asked to join, so that they reach
        it at once (they give up on a master that does not answer within seconds)."""
        self._store = None  # a store left by a join that never happened closes first
        self._store = master_store(host, port, world_size, timedelta(seconds=timeout_s))

    def join(self, host: str, port: int, world_size: int, backend: str, timeout_s: float) -> None:
        """Host the group (on the store :meth:`listen` opened, if it did) and wait for
        every rank."""
        self._group = None  # a new group replaces the old one (its sockets close)
        store, self._store = self._store, None
        self._group = make_group(host, port, 0, world_size, backend, timeout_s, store=store)
        self.device = torch.device("cuda" if backend == "nccl" else "cpu")

    def leave(self) -> None:
        """Drop the group (after a failed send: its peers may be gone or out of step)."""
        self._group = None

    @property
    def joined(self) -> bool:
        return self._group is not None

    def pack(self, named: Sequence[tuple[str, torch.Tensor]]) -> list[torch.Tensor]:
        """Copy the tensors into the flat buckets (before asking servers to pause)."""
        metas = params_meta(named)
        buckets = plan_buckets(metas)
        flats = self._buffers.get(buckets, self.device)
        with torch.no_grad():
            for (_, view), (_, t) in zip(unpack(metas, buckets, flats), named):
                view.copy_(t)
        return flats

    def digests(
        self, named: Sequence[tuple[str, torch.Tensor]], flats: Sequence[torch.Tensor]
    ) -> list[BucketDigest]:
        """What the update request states about each packed bucket (sizes, content hash)."""
        return bucket_digests(plan_buckets(params_meta(named)), flats)

    def send(self, flats: Sequence[torch.Tensor], timeout_s: float | None = None) -> None:
        for work in self.start(flats, timeout_s):
            work.wait()

    def start(
        self, flats: Sequence[torch.Tensor], timeout_s: float | None = None
    ) -> list[torch.distributed.Work]:
        """Start broadcasting every bucket; ``wait`` on what it returns (a stalled or dead
        peer raises there). ``flats`` must stay untouched until then."""
        if self._group is None:
            raise RuntimeError("join the weight group before sending")
        return [start_broadcast(self._group, flat, timeout_s) for flat in flats]


def params_meta(named: Sequence[tuple[str, torch.Tensor]]) -> list[ParamMeta]:
    return [ParamMeta(n, tuple(t.shape), str(t.dtype).removeprefix("torch.")) for n, t in named]


def _first_not_received(metas: Sequence[ParamMeta], bucket: Bucket, flat: torch.Tensor) -> int:
    """Index of the bucket's first tensor still holding some of the NaN fill (-1: none)."""
    offset = 0
    for i in range(bucket.first, bucket.first + bucket.count):
        n = metas[i].numel
        if n and bool(torch.isnan(flat[offset : offset + n]).any()):
            return i
        offset += n
    return -1


def _first_non_finite(metas: Sequence[ParamMeta], views: list[tuple[str, torch.Tensor]]) -> int:
    for i, (_, view) in enumerate(views):
        if not bool(torch.isfinite(view).all()):
            return i
    return -1


def verify(
    metas: Sequence[ParamMeta], buckets: list[Bucket], flats: list[torch.Tensor],
    digests: Sequence[BucketDigest],
) -> ReceiveFailure | None:  # fmt: skip
    """Received content against the sender's digests, then finiteness; names the first
    bad tensor (one never received, else the first of a bucket whose hash differs)."""
    for k, (bucket, flat, digest) in enumerate(zip(buckets, flats, digests)):
        if content_hash(flat) == digest.blake2b:
            continue
        lost = _first_not_received(metas, bucket, flat)
        if lost >= 0:
            return ReceiveFailure(
                "mismatch", f"params[{lost}]",
                f"tensor {metas[lost].name!r} was not received: the sender broadcast fewer "
                f"bytes than bucket {k} declares ({digest.num_bytes})",
            )  # fmt: skip
        first = metas[bucket.first].name
        return ReceiveFailure(
            "mismatch", f"buckets[{k}].blake2b",
            f"content of params[{bucket.first}..{bucket.first + bucket.count - 1}] (first "
            f"{first!r}) differs from what the sender hashed",
        )  # fmt: skip
    if all(bool(torch.isfinite(flat).all()) for flat in flats):
        return None
    bad = _first_non_finite(metas, unpack(metas, buckets, flats))
    return ReceiveFailure(
        "mismatch", f"params[{bad}]", f"tensor {metas[bad].name!r} holds non-finite values"
    )


class WeightReceiver:
    """vLLM worker extension: join the weight group, receive and load a weight version."""

    def tandem_join(
        self, host: str, port: int, rank: int, world_size: int, backend: str, timeout_s: float,
        bind_host: str | None = None, connect_s: float = JOIN_CONNECT_S,
    ) -> dict:  # fmt: skip
        """Join (or re-create) the weight group: ``{}``, else ``{"failure": why}``, not raised.
        A master that does not answer within ``connect_s`` fails it then
        (:func:`runtime.weight_group.connect_store`)."""
        self.tandem_group = None  # the previous group (if any) closes first
        try:
            group = make_group(
                host, port, rank, world_size, backend, timeout_s, bind_host, connect_s
            )
            self.tandem_group = group
        except Exception as err:  # noqa: BLE001 - the answer says why
            return {"failure": " ".join(f"{type(err).__name__}: {err}".split())}
        if not hasattr(self, "tandem_buffers"):
            self.tandem_buffers = (FlatBuffers(), FlatBuffers())  # receive into the one not loaded
            self.tandem_next = 0
        return {}

    def _tandem_device(self) -> torch.device:
        return torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")

    def tandem_receive(
        self, wire: Sequence[tuple[str, tuple[int, ...], str]], digests: Sequence[dict],
        timeout_s: float,
    ) -> dict:  # fmt: skip
        """Receive every bucket (within ``timeout_s`` in all), verify, then load.

        Returns the stages' durations (ms), or ``{"failure": ReceiveFailure}`` with the
        previous weights still loaded."""
        group = getattr(self, "tandem_group", None)
        if group is None:
            return {"failure": ReceiveFailure(
                "no-group", None, "no weight group: call /init_process_group first"
            ).to_dict()}  # fmt: skip
        t0 = time.perf_counter()
        metas = [ParamMeta(n, tuple(s), d) for n, s, d in wire]
        buckets = plan_buckets(metas)
        flats = self.tandem_buffers[self.tandem_next].get(buckets, self._tandem_device())
        failure = self._tandem_broadcasts(group, metas, buckets, flats, t0 + timeout_s)
        t1 = time.perf_counter()
        failure = failure or verify(metas, buckets, flats, [BucketDigest(**d) for d in digests])
        if failure is not None:
            return {"failure": failure.to_dict()}
        t2 = time.perf_counter()
        direct = load_into(self.model_runner, unpack(metas, buckets, flats))
        t3 = time.perf_counter()
        self.tandem_loaded = (metas, buckets, flats)  # never received into until replaced
        self.tandem_next = 1 - self.tandem_next
        return {
            "receive_ms": (t1 - t0) * 1e3,
            "check_ms": (t2 - t1) * 1e3,
            "load_ms": (t3 - t2) * 1e3,
            "direct_load": float(direct),  # 1: copied in place (runtime/direct_load.py)
            "loaded_at": time.monotonic(),  # steps scheduled after this use these weights
        }

    def _tandem_broadcasts(self, group, metas, buckets, flats, deadline: float):
        """Receive each bucket before ``deadline``; a stall or a broken peer closes the
        group (it may be out of step now) and comes back as a failure."""
        for k, flat in enumerate(flats):
            flat.fill_(float("nan"))  # what never arrives stays NaN
            try:
                start_broadcast(group, flat, deadline - time.perf_counter()).wait()
            except Exception as err:  # noqa: BLE001 - gloo raises RuntimeError for all
                self.tandem_group = None
                first = buckets[k].first
                return ReceiveFailure(
                    "timeout", f"params[{first}]",
                    f"bucket {k} (from {metas[first].name!r}) did not arrive: "
                    f"{str(err).splitlines()[0][-200:]}; the weight group is closed, "
                    "call /init_process_group again",
                )  # fmt: skip
        return None

    def tandem_checksums(self) -> dict:
        loaded = getattr(self, "tandem_loaded", None)
        if loaded is None:
            return {}
        return {n: tensor_checksum(t) for n, t in unpack(*loaded)}
