"""A cost model calibrated on profiles of the real runtime (``tandem calibrate``).

Every operator is a non-negative linear combination of a few basis functions of its
inputs (chosen per operator by held-out error, see ``sim.calibration``). Decode time is
kept affine in context tokens so that exact fast-forward still applies.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from policies.protocols import Device
from sim.costs import DecodeLaw, to_seconds, to_ticks

COST_MODEL_FORMAT = "tandem-cost-model"
COST_MODEL_VERSION = 1

BASES = {
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


@dataclass(slots=True)
class CalibratedCostModel:
    fits: dict[str, OperatorFit]
    weight_bytes: float
    kv_capacity: int
    source: dict[str, Any]

    @classmethod
    def load(cls, path: Path) -> CalibratedCostModel:
        data = json.loads(path.read_text())
        if data.get("format") != COST_MODEL_FORMAT:
            raise ValueError(f"{path}: not a tandem cost model (format {data.get('format')!r})")
        missing = [op for op in OPERATORS if op not in data["operators"]]
        if missing:
            raise ValueError(f"{path}: missing operator(s) {', '.join(missing)}")
        present = OPERATORS + tuple(op for op in OPTIONAL_OPERATORS if op in data["operators"])
        fits = {op: OperatorFit.from_dict(data["operators"][op]) for op in present}
        return cls(
            fits,
            float(data["weight_bytes"]),
            int(data["kv_capacity_tokens"]),
            data.get("source", {}),
        )

    def decode_law(self, device: Device, n: int) -> DecodeLaw:
        return _law(self.fits["decode"], n)

    def contended_decode_law(self, device: Device, n: int) -> DecodeLaw | None:
        """Decode while the trainer computes: the idle law times the profiled
        ``decode_slowdown`` at batch ``n`` (on one host the two stages share caches and
        memory bandwidth; never faster than idle). None if not profiled."""
        fit = self.fits.get("decode_slowdown")
        if fit is None:
            return None
        factor = max(1.0, fit(n=n))
        law = _law(self.fits["decode"], n)
        return DecodeLaw(n=n, p0=round(law.p0 * factor), p1=round(law.p1 * factor), q0=0, q1=0)

    def decode_step_s(self, device: Device, batch_size: int, context_tokens: int) -> float:
        return to_seconds(self.decode_law(device, max(1, batch_size)).step(context_tokens))

    def prefill_s(self, device: Device, num_tokens: int) -> float:
        return self.fits["prefill"](tokens=num_tokens)

    def train_s(self, device: Device, num_tokens: int) -> float:
        return self.fits["forward"](tokens=num_tokens) + self.fits["backward"](tokens=num_tokens)

    def contended_train_s(self, device: Device, num_tokens: int) -> float | None:
        """Forward and backward while generation decodes on the same host: ``train_s``
        times the profiled ``train_slowdown`` (never faster). None if not profiled."""
        fit = self.fits.get("train_slowdown")
        if fit is None:
            return None
        return self.train_s(device, num_tokens) * max(1.0, fit(tokens=num_tokens))

    def optimizer_s(self, device: Device) -> float:
        return self.fits["optimizer"]()

    # The profile times a whole push from the trainer's side (``weight_transfer``: pack,
    # request, the server's pause, reply) and the server's pause inside it
    # (``weight_pause``: pause, receive, load, resume). The sim's transfer is the part
    # outside the pause — it can run in the background ahead of a barrier — and its load
    # is the pause; in flight the sim pauses for both, as the live push does.

    def weight_transfer_s(self, num_bytes: float, gbps: float, latency_s: float) -> float:
        push = self.fits["weight_transfer"](bytes=num_bytes)
        return max(0.0, push - self.fits["weight_pause"](bytes=num_bytes))

    def weight_load_s(self, device: Device) -> float:
        return self.fits["weight_pause"](bytes=self.weight_bytes)

    def kv_capacity_tokens(self, device: Device) -> int:
        return self.kv_capacity

    def context_switch_s(self, num_gpus: int, tp: int, pcie_gb_per_s: float) -> float:
        return 0.0  # the profiled runtime does not offload: colocated switches are free


def _law(fit: OperatorFit, n: int) -> DecodeLaw:
    p0 = fit.coef("1") + fit.coef("n") * n + fit.coef("n^2") * n * n
    return DecodeLaw(n=n, p0=to_ticks(p0), p1=to_ticks(fit.coef("ctx")), q0=0, q1=0)
