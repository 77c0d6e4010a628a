"""The ``sim`` section of a run spec: the simulator's cost model and its efficiencies."""

from __future__ import annotations

import os

from pydantic import Field, field_validator

from policies.cluster import Section as _Section

# beyond these a figure is in the wrong unit (milliseconds as seconds, GB/s as TB/s)
MOST_STEP_OVERHEAD_S = 1.0
MOST_HBM_TB_PER_S = 100.0


class EfficiencySection(_Section):
    """Engine efficiencies of the roofline cost model (fractions of peak), per operator.

    * GEMMs (every linear layer of a step over ``rows`` tokens): ``2 · active params ·
      rows`` FLOPs at ``gemm_compute`` of peak, the weights streamed once at
      ``gemm_memory`` of peak HBM bandwidth, the two combined as a smooth maximum
      ``(t_c^p + t_m^p)^(1/p)``, ``p = gemm_overlap`` (1: they add; large: the roofline
      maximum). The three are fitted to Vidur's published GEMM profiles of H100
      (``tandem calibrate --from vidur``; held-out on A100: docs/sim-engine.md).
    * Attention reads the KV cache at ``kv_memory`` of peak bandwidth (decode is
      memory-bound) or computes at ``attention_compute`` (prefill), whichever is slower;
      both are assumptions (Vidur's attention tables are not used).
    * ``step_overhead_s`` per step (scheduler, sampling, launches): fitted to StreamRL's
      7B/H800 decode profile (Fig. 6) with the GEMM terms above held fixed.
    """

    gemm_compute: float = Field(
        0.7301, gt=0, le=1, description="GEMM achieved / peak FLOP/s (fitted: Vidur H100)"
    )
    gemm_memory: float = Field(
        1.0, gt=0, le=1, description="GEMM weight streaming / peak HBM (fitted: Vidur H100)"
    )
    gemm_overlap: float = Field(
        1.226, ge=1, description="p of the smooth max of GEMM compute and memory time"
    )
    kv_memory: float = Field(
        0.8, gt=0, le=1, description="KV, optimizer and weight-load bytes / peak HBM"
    )
    attention_compute: float = Field(0.5, gt=0, le=1, description="attention FLOP/s / peak")
    train_mfu: float = Field(0.4, gt=0, le=1, description="training model-FLOPs utilisation")
    step_overhead_s: float = Field(
        0.00406, ge=0, description="fixed cost per engine step, s (4 ms is 0.004)"
    )
    gpu_memory_utilization: float = Field(
        0.9, gt=0, le=1, description="share of HBM vLLM may use (weights + KV cache)"
    )

    @field_validator("step_overhead_s")
    @classmethod
    def _in_seconds(cls, value: float) -> float:
        if value > MOST_STEP_OVERHEAD_S:  # milliseconds typed as seconds
            raise ValueError(
                f"{value:g} s an engine step is beyond any engine: the unit is seconds "
                "(4 ms is 0.004)"
            )
        return value


class HardwareRow(_Section):
    """A row of hardware.csv for this run: a GPU it does not list (every figure given), or
    figures of one it lists (those given replace its own; e.g. a price for H100-SXM)."""

    name: str = Field(min_length=1, description="the name cluster pools give as hardware")
    bf16_dense_tflops: float | None = Field(None, gt=0, description="dense bf16 TFLOP/s")
    hbm_gb: float | None = Field(None, gt=0, description="GPU memory, GB")
    hbm_tb_per_s: float | None = Field(
        None, gt=0, description="memory bandwidth, TB/s (an H100's 3.35 TB/s is 3.35)"
    )
    nvlink_gb_per_s: float | None = Field(None, gt=0, description="NVLink, GB/s")
    cost_per_machine_rel_h20: float | None = Field(
        None, gt=0, description="an 8-GPU machine's cost, in 8-GPU H20 machines"
    )

    @field_validator("hbm_tb_per_s")
    @classmethod
    def _in_tb_per_s(cls, value: float | None) -> float | None:
        if value is not None and value > MOST_HBM_TB_PER_S:  # GB/s typed as TB/s
            raise ValueError(
                f"{value:g} TB/s is beyond any GPU: the unit is TB/s (an H100's 3.35 TB/s is "
                "3.35, not 3350)"
            )
        return value


class SimSection(_Section):
    cost_model: str = Field(
        "roofline",
        description="'roofline' (efficiencies below), 'roofline:DIR' (GEMM efficiencies from "
        "`tandem calibrate --from vidur`) or 'profiled:PATH' (a live profile's calibration)",
    )
    efficiency: EfficiencySection = Field(default_factory=EfficiencySection)
    fast_forward: bool = Field(
        True, description="advance engines event to event in closed form (False: step by step)"
    )
    instance_start_s: float = Field(60.0, ge=0, description="elastic: time to start an instance")
    hardware: list[HardwareRow] = Field(
        default_factory=list,
        description="GPUs to add to hardware.csv, or figures (a price) of ones it lists",
    )

    @field_validator("hardware")
    @classmethod
    def _each_name_once(cls, rows: list[HardwareRow]) -> list[HardwareRow]:
        names = [r.name for r in rows]
        if twice := sorted({n for n in names if names.count(n) > 1}):
            raise ValueError(f"{twice[0]!r} is given more than once")
        return rows

    @field_validator("cost_model")
    @classmethod
    def _known_cost_model(cls, value: str) -> str:
        if value != "roofline" and not value.startswith(("profiled:", "roofline:")):
            raise ValueError("must be 'roofline', 'roofline:DIR' or 'profiled:PATH'")
        kind, _, path = value.partition(":")
        # absolute, so that the saved spec.yaml runs from any directory
        return f"{kind}:{os.path.abspath(path)}" if path else value
