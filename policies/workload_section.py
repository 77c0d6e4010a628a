"""The ``workload`` section of a run spec: the prompts and output lengths a simulated run
draws (``sim.workload``), or the task set a live run serves."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, ValidationInfo, field_validator, model_validator

from policies.cluster import MAX_TOKENS, count
from policies.cluster import Section as _Section

MAX_RUN_SAMPLES = 10_000_000  # run.iterations × algorithm.batch_size: what a run may hold
MIN_PROMPT_TOKENS = 16  # every simulated prompt length is drawn within these bounds
MAX_PROMPT_TOKENS = 8192


class WorkloadSection(_Section):
    kind: Literal["histogram", "lognormal", "pareto", "trace"] = Field(
        "histogram",
        description="output-length distribution (sim; live prompts come from the tasks)",
    )
    max_output_tokens: int = count(
        5000, ge=1, le=MAX_TOKENS, description="cap on a sample's output tokens"
    )
    final_max_output_tokens: int | None = count(
        None,
        ge=1,
        le=MAX_TOKENS,
        description="grow max output linearly to this by the last iteration "
        "(at least max_output_tokens)",
    )
    prompt_tokens_median: int = count(
        512, ge=1, le=MAX_TOKENS,
        description=f"median prompt length, tokens (sim; each prompt is drawn within "
        f"{MIN_PROMPT_TOKENS}-{MAX_PROMPT_TOKENS})",
    )  # fmt: skip
    prompt_tokens_sigma: float = Field(0.5, ge=0, description="log-normal sigma of prompt lengths")
    lognormal_median_tokens: float = Field(
        1500.0, gt=0, description="kind lognormal: median output length, tokens"
    )
    lognormal_sigma: float = Field(0.8, gt=0, description="kind lognormal: sigma of log lengths")
    pareto_alpha: float = Field(1.5, gt=0, description="kind pareto: tail index")
    pareto_min_tokens: float = Field(300.0, gt=0, description="kind pareto: smallest length")
    trace_path: str | None = Field(
        None, description="kind trace: CSV/parquet of prompt_id, prompt_tokens, output_tokens"
    )
    num_prompts: int = count(
        4096, ge=1, le=MAX_RUN_SAMPLES, description="prompts in the dataset (one epoch)"
    )
    tasks: Literal["mixed", "longtail"] = Field(
        "mixed",
        description="live task set (runtime/tasks.py): mixed — four families, about 13-token "
        "answers on average; longtail — 92 % 2–5-token answers, 8 % 75–127-token ones",
    )
    # Defaults match StreamRL's published ranker (recall of the longest 20/10/5 %:
    # 0.87/0.82/0.76), which needs a predictor whose log length correlates ~0.97 with the
    # sample's; a prompt's history can reach sqrt(0.96 * 0.98) = 0.97 here (docs/ranker.md).
    prompt_correlation: float = Field(
        0.96, ge=0, le=1, description="share of a sample's log-length variance set by its prompt"
    )
    epoch_correlation: float = Field(
        0.98, ge=0, le=1, description="correlation of a prompt's length across epochs"
    )

    @model_validator(mode="after")
    def _trace_has_path(self) -> WorkloadSection:
        if self.kind == "trace" and not self.trace_path:
            raise ValueError("kind 'trace' needs trace_path")
        return self

    @field_validator("final_max_output_tokens")
    @classmethod
    def _grows(cls, value: int | None, info: ValidationInfo) -> int | None:
        start = info.data.get("max_output_tokens")
        if value is not None and start is not None and value < start:
            raise ValueError(
                f"{value} is smaller than workload.max_output_tokens ({start}): the max grows "
                "to it by the last iteration; leave it unset to keep the max fixed"
            )
        return value

    @field_validator("prompt_tokens_median")
    @classmethod
    def _producible_prompts(cls, value: int) -> int:
        if not MIN_PROMPT_TOKENS <= value <= MAX_PROMPT_TOKENS:
            raise ValueError(
                f"{value} is outside the prompt lengths the workload draws, "
                f"{MIN_PROMPT_TOKENS}-{MAX_PROMPT_TOKENS} tokens (each prompt is clipped to them)"
            )
        return value
