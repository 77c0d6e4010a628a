"""The cost model calibrated on profiles of the live runtime (``tandem calibrate``), in seconds.

Pure math over the saved ``cost_model.json``, so that both halves price work with it: the
simulator (through its tick adapter ``sim.calibrated``) and live skewness-aware dispatch
(``live.cost_model``). Every operator is a non-negative linear combination of a few basis
functions of its inputs (chosen per operator by held-out error, see ``sim.calibration``);
decode time is affine in context tokens, which keeps the simulator's fast-forward exact.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from policies.profile_source import ProfiledSetup, ProfileTarget, check_profile_source
from policies.protocols import Device

log = logging.getLogger(__name__)

__all__ = ["CalibratedCosts", "ProfileTarget", "ProfiledSetup", "cost_model_path"]

COST_MODEL_FORMAT = "tandem-cost-model"
COST_MODEL_VERSION = 1
COST_MODEL_FILE = "cost_model.json"  # inside a ``tandem calibrate --out`` directory

BASES: dict[str, Callable[[dict[str, float]], float]] = {
    "1": lambda x: 1.0,
    "n": lambda x: float(x["n"]),
    "n^2": lambda x: float(x["n"]) ** 2,
    "ctx": lambda x: float(x["ctx"]),
    "tokens": lambda x: float(x["tokens"]),
    "tokens^2": lambda x: float(x["tokens"]) ** 2,
    "bytes": lambda x: float(x["bytes"]),
}


@dataclass(slots=True, frozen=True)
class OperatorFit:
    """``time_s = Σ coef[b] · basis_b(inputs)``."""

    bases: tuple[str, ...]
    coefs: tuple[float, ...]
    heldout_mape: float

    def __call__(self, **inputs: float) -> float:
        return sum(c * BASES[b](inputs) for b, c in zip(self.bases, self.coefs))

    def coef(self, basis: str) -> float:
        return dict(zip(self.bases, self.coefs)).get(basis, 0.0)

    def to_dict(self) -> dict[str, Any]:
        return {
            "bases": list(self.bases),
            "coefs": list(self.coefs),
            "heldout_mape": self.heldout_mape,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> OperatorFit:
        unknown = set(d["bases"]) - set(BASES)
        if unknown:
            raise ValueError(f"cost model: unknown basis {sorted(unknown)}")
        return cls(tuple(d["bases"]), tuple(float(c) for c in d["coefs"]), float(d["heldout_mape"]))


OPERATORS = (
    "decode",
    "prefill",
    "forward",
    "backward",
    "optimizer",
    "weight_transfer",
    "weight_pause",
)
# measured by newer profiles only: how much slower decode runs while the trainer
# computes on the same host, and training while generation decodes
OPTIONAL_OPERATORS = ("decode_slowdown", "train_slowdown")


def cost_model_path(path: str | Path, key: str) -> Path:
    """The ``cost_model.json`` at ``path`` (the file, or a calibration directory holding
    it); ``key`` names the spec key that gave the path in the error if there is none."""
    path = Path(path)
    if path.is_dir():
        path = path / COST_MODEL_FILE
    if not path.exists():
        raise ValueError(f"{key}: cost model {path} does not exist{_calibrate_hint(path)}")
    return path


def _read_json(path: Path, prefix: str) -> dict[str, Any]:
    """The JSON object in ``path``; a ValueError starting with ``prefix`` (the spec key)
    and naming the file if it holds none (an empty file read "Expecting value: line 1")."""
    try:
        data = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ValueError(f"{prefix}{path}: not a tandem cost model (not JSON: {err})") from None
    if not isinstance(data, dict):
        raise ValueError(f"{prefix}{path}: not a tandem cost model (not a JSON object)")
    return data


def _measured_decode_batch(data: dict[str, Any]) -> int | None:
    """The largest decode batch behind a cost model: its ``measured_range`` (``tandem
    calibrate`` records it), else its profile's plan; None where neither says."""
    span = _dict(_dict(data.get("measured_range")).get("decode")).get("batch_size")
    if isinstance(span, list) and span and _positive(span[-1]):
        return int(span[-1])
    sizes = _dict(_dict(data.get("source")).get("plan")).get("batch_sizes")
    if isinstance(sizes, list) and sizes and all(_positive(b) for b in sizes):
        return int(max(sizes))
    return None


def _dict(value: object) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _positive(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and 0 < value < math.inf


def _calibrate_hint(path: Path) -> str:
    """What to run when ``path`` (a missing cost_model.json) sits in a profile directory."""
    folder = path.parent
    if path.name == COST_MODEL_FILE and (folder / "profile.json").is_file():
        out = folder.resolve() / "cost-model"
        return (
            f" ({folder} is an uncalibrated profile: run tandem calibrate {folder} --out "
            f"{out} first, then use profiled:{out})"
        )
    return ""


@dataclass(slots=True)
class CalibratedCosts:
    """The calibrated operators as a ``policies.protocols.CostModel`` (and more), in seconds.

    Generation is priced as measured: one instance of the profiled hardware at the profiled
    tensor-parallel size (``policies.profile_source`` refuses any other). Training scales
    from the profiled trainer's GPUs to the device's by data parallelism (below); a
    cross-datacenter link is priced by its bandwidth by the simulator, not here."""

    fits: dict[str, OperatorFit]
    weight_bytes: float
    kv_capacity: int
    source: dict[str, Any]
    path: Path | None = None  # the cost_model.json, for errors
    setup: ProfiledSetup = field(default_factory=lambda: ProfiledSetup.of({}))
    # the least time the profiled optimizer step spent on its sharded state (the simulator
    # bounds it from first principles: ``sim.trained_model``); 0: unknown, the whole step
    # is taken as a per-step cost
    optimizer_state_s: float = 0.0
    # the largest decode batch the profile measured (None: not recorded); beyond it the
    # decode fit extrapolates
    measured_decode_batch: int | None = None

    @classmethod
    def load(cls, path: Path, target: ProfileTarget | None = None) -> CalibratedCosts:
        """The cost model at ``path``; with a ``target``, refuse one profiled on another
        model, hardware, tensor-parallel size or trainer (``check_profile_source``)."""
        data = _read_json(Path(path), f"{target.key}: " if target is not None else "")
        if data.get("format") != COST_MODEL_FORMAT:
            raise ValueError(f"{path}: not a tandem cost model (format {data.get('format')!r})")
        missing = [op for op in OPERATORS if op not in data["operators"]]
        if missing:
            raise ValueError(f"{path}: missing operator(s) {', '.join(missing)}")
        present = OPERATORS + tuple(op for op in OPTIONAL_OPERATORS if op in data["operators"])
        fits = {op: OperatorFit.from_dict(data["operators"][op]) for op in present}
        source = data.get("source") or {}
        if target is not None:
            check_profile_source(source, Path(path), target)
        for key in ("weight_bytes", "kv_capacity_tokens"):
            if not _positive(data.get(key)):
                raise ValueError(f"{path}: {key} is {data.get(key)!r}, not a positive number")
        costs = cls(
            fits,
            float(data["weight_bytes"]),
            int(data["kv_capacity_tokens"]),
            source,
            Path(path),
            ProfiledSetup.of(source),
            measured_decode_batch=_measured_decode_batch(data),
        )
        if target is not None:
            costs.warn_extrapolated_batches(target)
        return costs

    def warn_extrapolated_batches(self, target: ProfileTarget) -> None:
        """A warning for each generation pool whose ``max_num_seqs`` exceeds the largest
        batch the profile measured: its steps are the decode fit extrapolated."""
        measured = self.measured_decode_batch
        for i, seqs in enumerate(target.max_num_seqs):
            if measured is None or seqs <= measured:
                continue
            rising = self.decode_fixed_s(seqs) / seqs > self.decode_fixed_s(measured) / measured
            log.warning(
                "cluster.generation.%d.max_num_seqs: %d, but %s measured decode at batches of "
                "at most %d: larger ones are priced by its fit (%s) extrapolated%s; profile "
                "them (tandem profile --batch-sizes ...,%d) to price them as measured",
                i, seqs, self.path, measured, "+".join(self.fits["decode"].bases),
                ", whose cost a token rises past the measured batches" if rising else "", seqs,
            )  # fmt: skip

    def training_share(self, device: Device) -> float:
        """The profiled trainer's GPUs over ``device``'s: the tokens (and optimizer state)
        one of ``device``'s GPUs holds per token one profiled GPU held, under perfectly
        balanced data parallelism with a fully sharded optimizer (as the roofline model
        assumes). 1 where the profile does not record its trainer (a warning said so).
        Only per-token and per-parameter work scales by it: a fitted fixed term is a cost
        every GPU pays at once (a forward or backward call, an optimizer step's overhead)."""
        profiled = self.setup.trainer_num_gpus
        return 1.0 if profiled is None else profiled / max(1, device.num_gpus)

    # -- decode ---------------------------------------------------------------------------

    def decode_fixed_s(self, n: int) -> float:
        """The part of a decode step of ``n`` sequences that does not grow with context."""
        fit = self.fits["decode"]
        return fit.coef("1") + fit.coef("n") * n + fit.coef("n^2") * n * n

    def decode_per_context_token_s(self) -> float:
        return self.fits["decode"].coef("ctx")

    def decode_slowdown(self, n: int) -> float | None:
        """How much slower decode of ``n`` sequences runs while the trainer computes on the
        same host (never faster); None if the profile did not measure it."""
        fit = self.fits.get("decode_slowdown")
        return None if fit is None else max(1.0, fit(n=n))

    def decode_step_s(self, device: Device, batch_size: int, context_tokens: int) -> float:
        n = max(1, batch_size)
        return self.decode_fixed_s(n) + self.decode_per_context_token_s() * context_tokens

    # -- prefill and training -------------------------------------------------------------

    def prefill_s(self, device: Device, num_tokens: int) -> float:
        """Prefill of ``num_tokens`` computed tokens (prefix-cache hits are not computed:
        the profile's prompts share no KV block, so it measured computed tokens)."""
        return self.fits["prefill"](tokens=num_tokens)

    def mixed_step_s(self, device: Device, work: Any) -> float:
        """A step with prefill tokens and decodes (``sim.ticks.StepWork``): the decode step
        plus what the prefill tokens add beyond a prefill's fixed cost."""
        prefill = self.prefill_s(device, work.num_prefill_tokens)
        if not work.num_decode:
            return prefill
        decode = self.decode_step_s(device, work.num_decode, work.decode_context_tokens)
        return decode + prefill - self.prefill_s(device, 0)

    def train_s(self, device: Device, num_tokens: int, num_micro_batches: int = 1) -> float:
        """Forward and backward of ``num_tokens`` on ``device``, each GPU running
        ``num_micro_batches`` micro-batches: the tokens one of the profiled trainer's GPUs
        would hold (``training_share``), cut into that many equal micro-batches, each priced
        as the profile measured one forward and one backward call. So a fit's fixed term
        (basis ``1``) is paid once per micro-batch, and its ``tokens^2`` term in the
        micro-batch's tokens; each of ``device``'s GPUs pays them in parallel."""
        k = max(1, num_micro_batches)
        tokens = num_tokens * self.training_share(device) / k
        return k * (self.fits["forward"](tokens=tokens) + self.fits["backward"](tokens=tokens))

    def contended_train_s(
        self, device: Device, num_tokens: int, num_micro_batches: int = 1
    ) -> float | None:
        """Forward and backward while generation decodes on the same host: ``train_s``
        times the profiled ``train_slowdown`` of one micro-batch (never faster). None if
        not profiled."""
        fit = self.fits.get("train_slowdown")
        if fit is None:
            return None
        k = max(1, num_micro_batches)
        tokens = num_tokens * self.training_share(device) / k
        return self.train_s(device, num_tokens, k) * max(1.0, fit(tokens=tokens))

    def optimizer_s(self, device: Device) -> float:
        """The profiled optimizer step on ``device``'s GPUs. The profile measured one
        trainer size, so its step (a constant fit) cannot tell the work on the sharded
        state, which spreads over the GPUs (``training_share``), from a per-step overhead
        that does not (kernel launches for every tensor, each GPU holding a shard of each):
        the part up to ``optimizer_state_s`` is taken as state work, the rest as overhead."""
        measured = self.fits["optimizer"]()
        state = min(measured, self.optimizer_state_s)
        return measured - state + state * self.training_share(device)

    # -- weights ----------------------------------------------------------------------------
    # The profile times a whole push from the trainer's side (``weight_transfer``: pack,
    # request, the server's pause, reply) and the server's pause inside it
    # (``weight_pause``: pause, receive, load, resume). The transfer is the part outside
    # the pause — it can run in the background ahead of a barrier — and the load is the
    # pause; in flight a server pauses for both, as the live push does.

    def weight_transfer_s(self, num_bytes: float, gbps: float, latency_s: float) -> float:
        """The measured push within the profiled datacenter (``gbps`` is not used: the
        simulator prices a cross-datacenter leg by the link's bandwidth on top)."""
        push = self.fits["weight_transfer"](bytes=num_bytes)
        return max(0.0, push - self.fits["weight_pause"](bytes=num_bytes))

    def weight_load_s(self, device: Device) -> float:
        return self.fits["weight_pause"](bytes=self.weight_bytes)

    def kv_capacity_tokens(self, device: Device) -> int:
        return self.kv_capacity

    def context_switch_s(self, num_gpus: int, tp: int, pcie_gb_per_s: float) -> float:
        return 0.0  # the profiled runtime does not offload: colocated switches are free
