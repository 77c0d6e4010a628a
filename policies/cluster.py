"""The cluster section of a run spec: generation pools, the trainer and the network.

Its own module, below :mod:`policies.spec`, so that allocation policies can take and
return a cluster without importing the spec (which lists their names).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

MAX_GPUS = 16_384  # per pool: the balanced split tries every size (~15 s at this bound)
MAX_SEQS = 65_536  # max_num_seqs of one instance
MAX_TOKENS = 10_000_000  # any per-sample token count (prompt, output, context)
MAX_ITERATIONS = 1_000_000  # optimizer steps of a run


def count(default: Any, *, ge: int = 0, le: int | None = None, **kw: Any) -> Any:
    """A whole-number spec field: strict (``true`` or ``2.0`` is an error, not 1 or 2) and,
    with ``le``, bounded so that a typo of a few zeros fails at once instead of running."""
    return Field(default, strict=True, ge=ge, le=le, **kw)


class Section(BaseModel):
    """A spec section: unknown keys are errors, assignments are validated."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class GenerationPool(Section):
    """A set of identical generation instances in one datacenter."""

    hardware: str = Field("H800", description="row of hardware.csv (sim cost model)")
    num_gpus: int = count(16, ge=1, le=MAX_GPUS, description="GPUs of the pool")
    tp: int = count(1, ge=1, le=MAX_GPUS, description="GPUs per instance (tensor parallelism)")
    datacenter: str = Field("dc0", description="datacenter name (cross-datacenter links)")
    # vLLM's engine arguments, with its names; defaults: vLLM's OpenAI server on an
    # 80 GB Hopper GPU (the hardware of the shipped configs); on the CPU vLLM uses
    # block_size 128 and 2048 batched tokens (live-tiny.yaml sets them)
    max_num_seqs: int = count(256, ge=1, le=MAX_SEQS, description="vLLM max running sequences")
    max_num_batched_tokens: int = count(
        8192,
        ge=1,
        le=MAX_TOKENS,
        description="vLLM token budget of one engine step (chunked prefill)",
    )
    block_size: int = count(16, ge=1, le=4096, description="vLLM KV-cache block, tokens")
    enable_chunked_prefill: bool = Field(True, description="vLLM: split prefills over steps")
    enable_prefix_caching: bool = Field(
        True, description="vLLM: share KV blocks of equal prompt prefixes (one weight version)"
    )
    num_gpu_blocks_override: int | None = count(
        None,
        ge=1,
        le=MAX_TOKENS,
        description="vLLM: KV-cache blocks per instance (None: from free HBM)",
    )
    scheduling_policy: Literal["priority", "fcfs"] = Field(
        "priority",
        description="vLLM scheduling policy; tandem's servers run 'priority' "
        "(policies.scheduling sets the priorities; 'lpt' needs it)",
    )

    @model_validator(mode="after")
    def _whole_instances(self) -> GenerationPool:
        if self.num_gpus % self.tp:
            raise ValueError(f"num_gpus ({self.num_gpus}) must be a multiple of tp ({self.tp})")
        if self.max_num_batched_tokens < self.max_num_seqs:
            raise ValueError(
                f"max_num_batched_tokens ({self.max_num_batched_tokens}) must be at least "
                f"max_num_seqs ({self.max_num_seqs}), as vLLM requires"
            )
        return self

    @property
    def num_instances(self) -> int:
        return self.num_gpus // self.tp


class TrainerPool(Section):
    hardware: str = Field("H800", description="row of hardware.csv (sim cost model)")
    num_gpus: int = count(16, ge=1, le=MAX_GPUS, description="trainer GPUs")
    datacenter: str = Field("dc0", description="datacenter name (weight transfer source)")


class NetworkSection(Section):
    intra_dc_gbps: float = Field(1600.0, gt=0, description="per-node NIC bandwidth, Gbit/s")
    inter_dc_gbps: float = Field(80.0, gt=0, description="link between datacenters, Gbit/s")
    latency_s: float = Field(1e-4, ge=0, description="per-transfer latency, s")
    pcie_gb_per_s: float = Field(50.0, gt=0, description="host-device GB/s (context switch)")


class ClusterSection(Section):
    generation: list[GenerationPool] = Field(
        default_factory=lambda: [GenerationPool()], description="generation pools"
    )
    trainer: TrainerPool = Field(default_factory=TrainerPool)
    network: NetworkSection = Field(default_factory=NetworkSection)

    @model_validator(mode="after")
    def _nonempty(self) -> ClusterSection:
        if not self.generation:
            raise ValueError("generation needs at least one pool")
        return self


def check_name(name: str, known: list[str]) -> str:
    """``name`` if it is one of ``known`` (a registry's names), else a ValueError listing them."""
    if name not in known:
        raise ValueError(f"unknown name {name!r}; choose one of {', '.join(known)}")
    return name
