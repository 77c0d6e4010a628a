"""The cluster section of a run spec: generation pools, the trainer and the network.

Its own module, below :mod:`policies.spec`, so that allocation policies can take and
return a cluster without importing the spec (which lists their names).
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

MAX_GPUS = 16_384  # per pool: the balanced split tries every size (~8 s at this bound)
MAX_SEQS = 65_536  # max_num_seqs of one instance
MAX_TOKENS = 10_000_000  # any per-sample token count (prompt, output, context)


def count(default: Any, *, ge: int = 0, le: int | None = None, **kw: Any) -> Any:
    """A whole-number spec field: strict (``true`` or ``2.0`` is an error, not 1 or 2) and,
    with ``le``, bounded so that a typo of a few zeros fails at once instead of running."""
    return Field(default, strict=True, ge=ge, le=le, **kw)


class Section(BaseModel):
    """A spec section: unknown keys are errors, assignments are validated."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class GenerationPool(Section):
    """A set of identical generation instances in one datacenter."""

    hardware: str = "H800"
    num_gpus: int = count(16, ge=1, le=MAX_GPUS)
    tp: int = count(1, ge=1, le=MAX_GPUS, description="GPUs per instance (tensor parallelism)")
    datacenter: str = "dc0"
    max_num_seqs: int = count(256, ge=1, le=MAX_SEQS, description="vLLM max running sequences")

    @model_validator(mode="after")
    def _whole_instances(self) -> GenerationPool:
        if self.num_gpus % self.tp:
            raise ValueError(f"num_gpus ({self.num_gpus}) must be a multiple of tp ({self.tp})")
        return self

    @property
    def num_instances(self) -> int:
        return self.num_gpus // self.tp


class TrainerPool(Section):
    hardware: str = "H800"
    num_gpus: int = count(16, ge=1, le=MAX_GPUS)
    datacenter: str = "dc0"


class NetworkSection(Section):
    intra_dc_gbps: float = Field(1600.0, gt=0, description="per-node NIC bandwidth, Gbit/s")
    inter_dc_gbps: float = Field(80.0, gt=0, description="link between datacenters, Gbit/s")
    latency_s: float = Field(1e-4, ge=0, description="per-transfer latency, s")
    pcie_gb_per_s: float = Field(50.0, gt=0, description="host-device GB/s (context switch)")


class ClusterSection(Section):
    generation: list[GenerationPool] = Field(default_factory=lambda: [GenerationPool()])
    trainer: TrainerPool = Field(default_factory=TrainerPool)
    network: NetworkSection = Field(default_factory=NetworkSection)

    @model_validator(mode="after")
    def _nonempty(self) -> ClusterSection:
        if not self.generation:
            raise ValueError("generation needs at least one pool")
        return self
