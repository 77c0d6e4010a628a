"""What a calibrated cost model was measured on, and whether a run may be priced with it.

A profile (``tandem profile``, or one written by hand: docs/fidelity.md) measures one
machine: a generation instance of one hardware kind at one tensor-parallel size, and a
trainer of some GPUs of one kind. :class:`ProfiledSetup` reads that configuration from
the profile's ``profile.json`` (kept as the cost model's ``source``);
:func:`check_profile_source` refuses a run the model cannot price: another model, other
generation hardware, another tensor-parallel size, other trainer hardware. Trainer GPU
counts and cross-datacenter links it scales (``policies.calibrated``).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from policies.spec import RunSpec

log = logging.getLogger(__name__)


@dataclass(slots=True, frozen=True)
class ProfiledSetup:
    """The configuration a profile measured; None where ``profile.json`` does not say.

    Read from ``hardware.kind`` / ``hardware.tp`` (generation) and ``trainer.hardware`` /
    ``trainer.num_gpus``; a ``tandem profile`` written before those keys records its whole
    spec, whose ``cluster`` says the same."""

    model: str | None
    generation_hardware: str | None
    generation_tp: int | None
    trainer_hardware: str | None
    trainer_num_gpus: int | None

    @classmethod
    def of(cls, source: dict[str, Any]) -> ProfiledSetup:
        hardware = _section(source, "hardware")
        trainer = _section(source, "trainer")
        cluster = _section(_section(source, "spec"), "cluster")
        pools = cluster.get("generation") or [{}]
        pool = pools[0] if isinstance(pools, list) and isinstance(pools[0], dict) else {}
        spec_trainer = _section(cluster, "trainer")
        return cls(
            model=_section(source, "model").get("name"),
            generation_hardware=hardware.get("kind", pool.get("hardware")),
            generation_tp=_int(hardware.get("tp", pool.get("tp"))),
            trainer_hardware=trainer.get("hardware", spec_trainer.get("hardware")),
            trainer_num_gpus=_int(trainer.get("num_gpus", spec_trainer.get("num_gpus"))),
        )

    def unknown_keys(self) -> list[str]:
        """The ``profile.json`` keys of the configuration that it does not record."""
        keys = {
            "model.name": self.model,
            "hardware.kind": self.generation_hardware,
            "hardware.tp": self.generation_tp,
            "trainer.hardware": self.trainer_hardware,
            "trainer.num_gpus": self.trainer_num_gpus,
        }
        return [key for key, value in keys.items() if value is None]


def _section(data: object, key: str) -> dict[str, Any]:
    value = data.get(key) if isinstance(data, dict) else None
    return value if isinstance(value, dict) else {}


def _int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


@dataclass(slots=True, frozen=True)
class ProfileTarget:
    """What a run prices with a profile: its model, its generation pools' hardware and
    tensor-parallel sizes (rows of ``cluster.generation``) and its trainer's hardware;
    ``key`` is the spec key that named the profile, for errors."""

    model: str
    hardware: tuple[str, ...]
    tps: tuple[int, ...] = ()  # per row of cluster.generation
    trainer_hardware: str | None = None
    max_num_seqs: tuple[int, ...] = ()  # per row of cluster.generation

    key: str = "sim.cost_model"

    @classmethod
    def of(cls, spec: RunSpec, key: str) -> ProfileTarget:
        pools = spec.cluster.generation
        hardware = tuple(dict.fromkeys(pool.hardware for pool in pools))
        tps = tuple(pool.tp for pool in pools)
        seqs = tuple(pool.max_num_seqs for pool in pools)
        return cls(spec.model.name, hardware, tps, spec.cluster.trainer.hardware, seqs, key)


def check_profile_source(source: dict[str, Any], path: Path, target: ProfileTarget) -> None:
    """Refuse what a profile cannot price: another model or generation hardware (a 2-core
    CPU pricing a 7B model on H800), another tensor-parallel size, other trainer hardware.
    What the profile does not record is not checked, and a warning says so."""
    setup = ProfiledSetup.of(source)
    if setup.model is not None and setup.model != target.model:
        raise ValueError(
            f"{target.key}: {path} was profiled on model {setup.model!r}, the spec runs "
            f"{target.model!r}; calibrate on this model or use a roofline cost model"
        )
    kind = setup.generation_hardware
    other = [h for h in target.hardware if kind is not None and not _same(h, kind)]
    if other:
        raise ValueError(
            f"{target.key}: {path} was profiled on hardware {kind!r}, the spec generates on "
            f"{', '.join(map(repr, other))}; calibrate on that hardware or use a roofline model"
        )
    _check_tp(setup, path, target)
    _check_trainer(setup, path, target)
    unknown = setup.unknown_keys()
    if unknown:
        log.warning(
            "%s: %s does not record the profiled %s (profile.json keys): that part of the "
            "run is priced as measured and not checked against the spec; add the key(s) to "
            "profile.json and run tandem calibrate again",
            target.key, path, ", ".join(unknown),
        )  # fmt: skip


def _same(a: str, b: str) -> bool:
    return a.lower() == str(b).lower()


def _check_tp(setup: ProfiledSetup, path: Path, target: ProfileTarget) -> None:
    if setup.generation_tp is None:
        return
    for i, tp in enumerate(target.tps):
        if tp != setup.generation_tp:
            raise ValueError(
                f"cluster.generation.{i}.tp: {tp}, but the cost model {path} was profiled at "
                f"tp {setup.generation_tp}; a calibrated model prices only the profiled "
                "tensor-parallel size (profile at this tp, or use a roofline cost model)"
            )


def _check_trainer(setup: ProfiledSetup, path: Path, target: ProfileTarget) -> None:
    profiled = setup.trainer_hardware
    if profiled is None or target.trainer_hardware is None:
        return
    if not _same(target.trainer_hardware, profiled):
        raise ValueError(
            f"cluster.trainer.hardware: {target.trainer_hardware!r}, but the cost model "
            f"{path} was profiled with a {profiled!r} trainer; a calibrated model scales "
            "training over GPU counts, not across hardware (profile that trainer, or use a "
            "roofline cost model)"
        )
