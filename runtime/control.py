"""The generation server's control plane: weight group, in-flight weight updates, version.

The objects the HTTP handlers of :mod:`runtime.server` call. An update pauses generation
with ``mode="keep", clear_cache=False`` (running sequences keep their KV cache), receives
and loads every tensor inside the vLLM worker (:class:`runtime.weight_sync.WeightReceiver`),
sets the version and resumes. Any failure resumes on the previous weights. New requests
are admitted between updates only and salted with the served version, so prompt KV is
shared within one weight version (:mod:`runtime.prompt_cache`).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from pathlib import Path

from runtime.prompt_cache import VersionHistory, install_salting, prompt_version
from runtime.weight_sync import DTYPES, ParamMeta


class UpdateRejected(ValueError):
    """A weight update whose metadata does not fit the served model; names the field."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field


@dataclass(slots=True, frozen=True)
class UpdateResult:
    version: int
    num_tensors: int
    pause_s: float  # generation paused for this long
    stages_ms: dict[str, float]  # the worker's receive / check / load durations


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


def check_metas(metas: list[ParamMeta], manifest: dict[str, tuple[tuple[int, ...], str]]) -> None:
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


class ServerControl:
    """Holds the engine client, the served weight version and the update lock."""

    def __init__(self, engine, manifest: dict[str, tuple[tuple[int, ...], str]]) -> None:
        self.engine = engine
        self.manifest = manifest
        self.version = 0
        self.num_updates = 0
        self.last_pause_s: float | None = None
        self.history = VersionHistory()
        self._lock = asyncio.Lock()
        self._not_updating = asyncio.Event()  # cleared while an update is loaded
        self._not_updating.set()

    def salt_requests(self) -> None:
        """Salt every request the engine admits with the served version (any route)."""
        install_salting(self.engine, self.admit)

    async def admit(self) -> int:
        """The version to salt a new request with, once no update is being loaded."""
        await self._not_updating.wait()
        return self.version

    def prompt_version(self, salted: int, out) -> int:
        """The (oldest) version a finished request's prompt KV was computed with, from
        when vLLM first scheduled it (``out.metrics``, if the engine logs stats)."""
        scheduled_ts = getattr(getattr(out, "metrics", None), "scheduled_ts", 0.0)
        scheduled = self.history.version_at(scheduled_ts) if scheduled_ts else None
        return prompt_version(salted, scheduled, getattr(out, "num_cached_tokens", None))

    async def join_group(
        self, host: str, port: int, rank: int, world_size: int, backend: str, timeout_s: float
    ) -> None:
        args = (host, port, rank, world_size, backend, timeout_s)
        await self.engine.collective_rpc("tandem_join", timeout=timeout_s + 5, args=args)

    async def update(self, version: int, metas: list[ParamMeta], timeout_s: float) -> UpdateResult:
        check_metas(metas, self.manifest)
        wire = [(m.name, m.shape, m.dtype) for m in metas]
        async with self._lock:
            start = time.perf_counter()
            self._not_updating.clear()
            try:
                await self._pause()
                stages = await self._receive(version, wire, timeout_s)
            finally:
                await self.engine.resume_generation()
                self._not_updating.set()
                self.last_pause_s = time.perf_counter() - start
        return UpdateResult(version, len(metas), self.last_pause_s, stages[0] if stages else {})

    async def _receive(self, version: int, wire: list, timeout_s: float) -> list:
        """Receive and load inside the worker; the new version serves from now on."""
        stages = await self.engine.collective_rpc("tandem_receive", timeout=timeout_s, args=(wire,))
        self.version = version
        self.num_updates += 1
        self.history.served(version, time.monotonic())  # nothing is scheduled while paused
        return stages

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
