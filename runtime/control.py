"""The generation server's control plane: weight group, in-flight weight updates, version.

The objects the HTTP handlers of :mod:`runtime.server` call. An update receives and loads
every tensor inside the vLLM worker (:class:`runtime.weight_sync.WeightReceiver`) between
two engine steps, running sequences keeping their KV cache, and sets the version. vLLM's
engine core runs such a call between steps; only an engine that overlaps steps (async
scheduling, a batch queue) is paused first with ``mode="keep", clear_cache=False`` and
resumed after (:func:`steps_overlap`): the pause and resume were two more round trips
to the engine per push, each leaving it idle (docs/live-throughput.md). Any failure resumes on the previous weights. New requests
are admitted between updates only and salted with the served weights (version and load
count), so prompt KV is shared within one load of weights (:mod:`runtime.prompt_cache`).

An update is verified before it is loaded: names, shapes and the served dtype against the
checkpoint (:func:`check_metas`), the sender's bucket digests against the metadata
(:func:`check_digests`), both before generation pauses; then the received bytes against
the digests inside the worker. The worker's receive has a deadline of
``COLLECTIVE_SHARE`` of the request's ``timeout_s``, so a stalled or dead sender frees
the worker (and closes the weight group) before the route answers; in-flight requests
then finish on the old weights.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from runtime.engine_watch import STALL_S, EngineWatch
from runtime.joining import JOIN_CONNECT_S, JoinUnderWay, check_resolves, join_limit_s
from runtime.prompt_cache import ServedWeights, VersionHistory, install_salting, prompt_version
from runtime.weight_sync import DTYPES, BucketDigest, ParamMeta, plan_buckets

COLLECTIVE_SHARE = 0.75  # the worker's receive deadline, as a share of the route's timeout
STATUS_OF_FAILURE = {"mismatch": 422, "timeout": 504, "no-group": 409}


class JoinFailed(RuntimeError):
    """The worker could not join the weight group (nothing listened, the trainer never
    came); the server stays usable, a later join may work."""


class UpdateRejected(ValueError):
    """A join or weight update refused or not loaded; names the body field (or tensor) at
    fault, or none where no field is (no weight group yet, a stuck worker).

    ``status``: the HTTP status to answer (400 metadata, 409 no group, 422 content,
    503 worker stuck, 504 sender stalled)."""

    def __init__(self, field: str | None, message: str, status: int = 400) -> None:
        super().__init__(message if field is None else f"{field}: {message}")
        self.field = field
        self.status = status


@dataclass(slots=True, frozen=True)
class UpdateResult:
    version: int
    num_tensors: int
    pause_s: float  # generation paused for this long
    # the worker's receive / check / load; the server's pause, rpc, resume (ms)
    stages_ms: dict[str, float]


def checkpoint_manifest(model_dir: str | Path) -> dict[str, tuple[tuple[int, ...], str]]:
    """Names, shapes and dtypes of the model's tensors in its safetensors checkpoint."""
    from safetensors import safe_open

    out: dict[str, tuple[tuple[int, ...], str]] = {}
    for path in sorted(Path(model_dir).glob("*.safetensors")):
        with safe_open(str(path), "pt") as f:
            for name in f.keys():  # noqa: SIM118 - safe_open is not a mapping
                piece = f.get_slice(name)
                out[name] = (tuple(piece.get_shape()), _dtype_name(piece.get_dtype()))
    return out


def _dtype_name(st_dtype: str) -> str:
    return {"F32": "float32", "F16": "float16", "BF16": "bfloat16"}.get(st_dtype, st_dtype)


def check_metas(
    metas: list[ParamMeta], manifest: dict[str, tuple[tuple[int, ...], str]],
    served_dtype: str = "float32",
) -> None:  # fmt: skip
    """Raise :class:`UpdateRejected` naming the first parameter that does not fit."""
    seen: set[str] = set()
    for i, m in enumerate(metas):
        where = f"params[{i}]"
        if m.name not in manifest:
            raise UpdateRejected(f"{where}.name", f"unknown parameter {m.name!r}")
        if m.name in seen:
            raise UpdateRejected(f"{where}.name", f"parameter {m.name!r} listed twice")
        seen.add(m.name)
        if m.shape != manifest[m.name][0]:
            raise UpdateRejected(
                f"{where}.shape", f"{list(m.shape)} != {list(manifest[m.name][0])}"
            )
        if m.dtype not in DTYPES:
            raise UpdateRejected(f"{where}.dtype", f"must be one of {', '.join(DTYPES)}")
        if m.dtype != served_dtype:
            raise UpdateRejected(
                f"{where}.dtype",
                f"{m.name!r} is {m.dtype}, the served model is {served_dtype}: send {served_dtype}",
            )
    missing = [name for name in manifest if name not in seen]
    if missing:  # a model that differs from the served one would leave these as they were
        raise UpdateRejected(
            "params",
            f"{len(missing)} of the served model's {len(manifest)} parameters missing (first "
            f"{missing[0]!r}): the sender's model is not the one served",
        )


def check_digests(metas: list[ParamMeta], digests: list[BucketDigest]) -> None:
    """The sender's buckets against those the metadata makes: dtype, tensor count and
    bytes of each; raises :class:`UpdateRejected` naming the first tensor they disagree on."""
    if not digests:
        raise UpdateRejected(
            "buckets", "required: the sizes and content hash of each bucket the sender broadcasts"
        )
    planned = plan_buckets(metas)
    for k, (b, d) in enumerate(zip(planned, digests)):
        first = f"params[{b.first}] {metas[b.first].name!r}"
        if d.dtype != b.dtype:
            raise UpdateRejected(f"buckets[{k}].dtype", f"{d.dtype}, but {first} is {b.dtype}")
        if d.num_tensors != b.count:
            i = b.first + min(d.num_tensors, b.count)
            name = metas[i].name if i < len(metas) else "(none)"
            raise UpdateRejected(
                f"buckets[{k}].num_tensors",
                f"the sender packs {d.num_tensors} tensors from {first}, params list {b.count}; "
                f"first tensor not matched: params[{i}] {name!r}",
            )
        expected = b.numel * DTYPES[b.dtype].itemsize
        if d.num_bytes != expected:
            raise UpdateRejected(
                f"buckets[{k}].num_bytes",
                f"{d.num_bytes} != {expected}, the bytes of params[{b.first}..{b.first + b.count - 1}]"
                f" (from {metas[b.first].name!r})",
            )
    if len(digests) != len(planned):
        k = min(len(digests), len(planned))
        name = metas[planned[k].first].name if k < len(planned) else "(none)"
        raise UpdateRejected(
            "buckets",
            f"{len(digests)} buckets declared, the params make {len(planned)}; first tensor "
            f"not matched: {name!r}",
        )


def device_of(engine) -> str:
    """The device the engine's model runs on (vLLM's ``device_config``; ``cpu`` if unknown)."""
    config = getattr(getattr(engine, "vllm_config", None), "device_config", None)
    return str(getattr(config, "device_type", None) or "cpu")


def _rpc_timed_out(err: Exception, method: str) -> bool:
    """Whether ``collective_rpc`` failed for its own timeout: a ``TimeoutError`` here, or
    the one vLLM's multiprocess executor raises in the engine core, which reaches this
    process as a plain ``Exception`` with its text ("RPC call to <method> timed out.")."""
    return isinstance(err, TimeoutError) or f"RPC call to {method} timed out" in str(err)


def steps_overlap(engine) -> bool:
    """Whether ``engine`` (vLLM's AsyncLLM) may have a model step in flight while its
    engine core handles a utility call; unknown counts as yes."""
    batches = getattr(getattr(engine, "vllm_config", None), "max_concurrent_batches", None)
    return not isinstance(batches, int) or batches > 1


BUSY_GRACE_S = 10.0  # past an update's or a join's own timeout: the engine is not busy, stuck


class ServerControl:
    """Holds the engine client, the served weight version and the update lock."""

    def __init__(
        self, engine, manifest: dict[str, tuple[tuple[int, ...], str]],
        served_dtype: str = "float32", bind_host: str | None = None, stall_s: float = STALL_S,
        join_connect_s: float = JOIN_CONNECT_S,
    ) -> None:  # fmt: skip
        """``join_connect_s``: a join's master must answer within this (runtime.joining)."""
        self.engine = engine
        self.join_connect_s = join_connect_s
        self.manifest = manifest
        self.served_dtype = served_dtype
        self.bind_host = bind_host  # where the worker's gloo sockets listen
        self.stuck: str | None = None  # why the worker cannot take calls any more
        self.version = 0
        self.num_updates = 0
        self.last_pause_s: float | None = None
        self.history = VersionHistory()
        self._lock = asyncio.Lock()
        self.server_id = secrets.token_hex(8)  # /health: two URLs, one id: one server
        self.joining: JoinUnderWay | None = None  # a join taken and not finished
        self._busy_until = 0.0  # monotonic end of an update's or a join's allowed time
        self._not_updating = asyncio.Event()  # cleared while an update is loaded
        self._not_updating.set()
        self.pauses = steps_overlap(engine)  # else updates run between steps unpaused
        self.watch = EngineWatch(engine, stall_s)  # does the engine still step?
        self.device = device_of(engine)
        self.backends = ("gloo", "nccl") if self.device == "cuda" else ("gloo",)

    def salt_requests(self) -> None:
        """Salt every request the engine admits with the served version (any route)."""
        install_salting(self.engine, self.admit)

    async def admit(self) -> ServedWeights:
        """The weights to salt a new request with, once no update is being loaded: the
        count of loads, not the version alone, tells two loads of one version apart."""
        await self._not_updating.wait()
        return ServedWeights(self.version, self.num_updates)

    def prompt_version(self, salted: int, out) -> int:
        """The (oldest) version a finished request's prompt KV was computed with, from
        when vLLM first scheduled it (``out.metrics``, if the engine logs stats)."""
        scheduled_ts = getattr(getattr(out, "metrics", None), "scheduled_ts", 0.0)
        scheduled = self.history.version_at(scheduled_ts) if scheduled_ts else None
        return prompt_version(salted, scheduled, getattr(out, "num_cached_tokens", None))

    async def check_join(self, host: str, port: int, backend: str) -> None:
        """An :class:`UpdateRejected` (400) naming the field of a join that cannot work: a
        backend this server's device cannot run (``nccl`` on a CPU server was accepted and
        failed after 8.4 s), a ``master_addr`` that does not resolve."""
        if backend not in self.backends:
            raise UpdateRejected(
                "backend", f"{backend!r} cannot run on this server's {self.device} device: "
                f"use {' or '.join(map(repr, self.backends))}",
            )  # fmt: skip
        try:
            await check_resolves(host, port)
        except ValueError as err:
            raise UpdateRejected("master_addr", str(err)) from None

    async def join_group(
        self, host: str, port: int, rank: int, world_size: int, backend: str, timeout_s: float,
        owner: str | None = None,
    ) -> None:  # fmt: skip
        """Join (or re-create) the weight group: the worker gives up if the master does not
        answer within ``join_connect_s`` (at most ``timeout_s``), or if the group has not
        formed within ``timeout_s`` more (runtime.joining).

        A second join while one is under way is refused (409) naming the first and when it
        ends: queued behind the first, it kept the group from forming (the first waits for
        every rank), and the engine then hung in the second's group set-up, serving nothing
        (a server listed twice). ``owner``: the run that asks (runtime.lease), for /health."""
        if self.joining is not None:
            raise UpdateRejected(
                "rank", f"this server is busy joining a weight group as {self.joining.describe()}"
                ": it takes one join at a time (a join whose caller went away runs to its end "
                "too), and a server joins a run's group once", 409,
            )  # fmt: skip
        connect_s = min(self.join_connect_s, timeout_s)
        args = (host, port, rank, world_size, backend, timeout_s, self.bind_host, connect_s)
        limit_s = join_limit_s(timeout_s, connect_s)
        # an update loading now holds the worker first: this join may end that much later
        waits_s = max(0.0, self._busy_until - time.monotonic())
        self.joining = JoinUnderWay(rank, world_size, owner, time.monotonic() + waits_s + limit_s)
        try:
            async with self._lock:  # never while an update is receiving
                self._busy_until = time.monotonic() + limit_s + BUSY_GRACE_S
                self.joining = replace(self.joining, ends_at=time.monotonic() + limit_s)
                per_worker = await self._rpc("tandem_join", limit_s, args)
        finally:
            self.joining = None
            self._busy_until = 0.0
            self.watch.touch()  # the engine stepped nothing while it joined
        # the worker returns why it could not join (a timeout of gloo's own, say): this
        # server is still usable, unlike one whose worker never returned (_rpc)
        failures = [a["failure"] for a in per_worker if isinstance(a, dict) and a.get("failure")]
        if failures:
            raise JoinFailed(failures[0])

    def condition(self) -> tuple[str, float | None]:
        """``/health``'s status: ``ok``; ``stuck`` (a worker call timed out), ``dead`` (the
        engine core died) or ``stalled`` (with its seconds), each a 503."""
        if self.stuck:
            return "stuck", None
        if getattr(self.engine, "errored", False):
            return "dead", None
        stalled = self.stalled_for()
        return ("ok" if stalled is None else "stalled"), stalled

    def stalled_for(self) -> float | None:
        """Seconds the engine has held requests without a step (:mod:`runtime.engine_watch`);
        None while it steps, holds none, or loads an update or joins a group within that
        call's time (a call past it hangs: a stopped engine never answers a pause)."""
        if time.monotonic() < self._busy_until:
            return None
        return self.watch.stalled_for()

    async def update(
        self, version: int, metas: list[ParamMeta], digests: list[BucketDigest], timeout_s: float
    ) -> UpdateResult:
        check_metas(metas, self.manifest, self.served_dtype)
        check_digests(metas, digests)
        wire = [(m.name, m.shape, m.dtype) for m in metas]
        async with self._lock:
            start = time.perf_counter()
            self._busy_until = time.monotonic() + timeout_s + BUSY_GRACE_S
            self._not_updating.clear()
            try:
                if self.pauses:
                    await self._pause()
                paused = time.perf_counter()
                stages = await self._receive(version, wire, digests, timeout_s)
                received = time.perf_counter()
            finally:
                if self.pauses:
                    await self.engine.resume_generation()
                self._not_updating.set()
                self._busy_until = 0.0
                self.watch.touch()  # the engine stepped nothing while it loaded
                pause_s = time.perf_counter() - start
        self.last_pause_s = pause_s  # a loaded update's only (/health pairs it with num_updates)
        stages = {
            **stages,
            "pause_ms": (paused - start) * 1e3,  # the engine's step in flight finishing
            "rpc_ms": (received - paused) * 1e3,  # to the worker, its stages and back
            "resume_ms": (start + pause_s - received) * 1e3,
        }
        return UpdateResult(version, len(metas), pause_s, stages)

    async def _receive(
        self, version: int, wire: list, digests: list[BucketDigest], timeout_s: float
    ) -> dict[str, float]:
        """Receive, verify and load inside the worker; the new version serves from now on."""
        args = (wire, [asdict(d) for d in digests], timeout_s * COLLECTIVE_SHARE)
        per_worker = await self._rpc("tandem_receive", timeout_s, args)
        for answer in per_worker:
            failure = answer.get("failure")
            if failure:
                status = STATUS_OF_FAILURE.get(failure["kind"], 422)
                raise UpdateRejected(failure["field"], failure["message"], status)
        self.version = version
        self.num_updates += 1
        # from when the worker had loaded it (its clock: CLOCK_MONOTONIC, shared by the
        # processes); no step ran between its receive and then
        loaded = [a.pop("loaded_at", None) for a in per_worker]
        self.history.served(version, min([t for t in loaded if t] or [time.monotonic()]))
        return per_worker[0] if per_worker else {}

    async def _rpc(self, method: str, timeout_s: float, args: tuple) -> list:
        """``collective_rpc`` that never leaves a late answer behind: the worker's own
        deadlines are shorter, so a timeout here means the worker is stuck for good.

        Only the call's own timeout counts: the worker's errors (gloo's "The client socket
        has timed out", say) are raised as they are, the server still usable. The wait is
        bounded here too (the in-process executor has no RPC timeout of its own)."""
        if self.stuck:
            raise UpdateRejected(None, self.stuck, 503)
        start = time.monotonic()
        try:
            async with asyncio.timeout(timeout_s):
                return await self.engine.collective_rpc(method, timeout=timeout_s, args=args)
        except Exception as err:
            if not _rpc_timed_out(err, method):
                raise
            waited_s = time.monotonic() - start
            self.stuck = (
                f"the model worker did not return from {method} within {waited_s:.1f} s "
                f"(the call's limit: {timeout_s:g} s)"
            )
            raise UpdateRejected(None, self.stuck, 503) from None

    async def _pause(self) -> None:
        """``pause_generation(mode="keep", clear_cache=False)`` without its trailing sleep.

        ``AsyncLLM.pause_generation`` sleeps 20 ms after the engine has paused, only so
        that outputs already produced reach their callers first (not needed for
        correctness, says vLLM); the engine-core call alone pauses the scheduler.
        """
        core = getattr(self.engine, "engine_core", None)
        if core is not None and hasattr(core, "pause_scheduler_async"):
            await core.pause_scheduler_async(mode="keep", clear_cache=False)
        else:
            await self.engine.pause_generation(mode="keep", clear_cache=False)

    async def checksums(self) -> dict[str, tuple[float, float]]:
        per_worker = await self.engine.collective_rpc("tandem_checksums")
        return per_worker[0] if per_worker else {}
