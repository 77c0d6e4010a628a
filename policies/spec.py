"""The run spec: one typed, validated description of a run, loaded from YAML.

Unknown keys, wrong types and impossible values are errors that name the key
(``SpecError``); the CLI turns them into exit status 2 before anything runs.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import Field, ValidationError, ValidationInfo, field_validator, model_validator

from policies.allocation import ALLOCATION
from policies.cluster import MAX_ITERATIONS, ClusterSection, check_name, count
from policies.cluster import Section as _Section
from policies.dispatch import DISPATCH, NEEDS_LENGTHS
from policies.live_section import LiveSection
from policies.modes import MODES
from policies.pipeline_section import PipelineSection, overlap_modes
from policies.predictors import PREDICTORS
from policies.scheduling import SCHEDULING
from policies.sim_section import SimSection
from policies.spec_yaml import (
    SpecError,
    apply_overrides,
    format_errors,
    given_texts,
    parse_override,
    read_value,
    read_yaml,
)
from policies.workload_section import MAX_RUN_SAMPLES, WorkloadSection

# re-exported: their homes are small modules
__all__ = [
    "LiveSection", "SpecError", "apply_overrides", "parse_override", "read_value", "read_yaml",
]  # fmt: skip


RUN_NAME = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$"  # one path component: runs/NAME-... stays in runs/


class RunSection(_Section):
    name: str = Field("run", description="letters, digits, '.', '_', '-' (a directory name)")
    iterations: int = count(
        10, ge=1, le=MAX_ITERATIONS, description="optimizer steps (iterations) to run"
    )
    seed: int = count(0, ge=0, description="root seed of every named random stream")
    tracking: Literal["none", "tensorboard", "wandb", "mlflow"] = Field(
        "none",
        description="per-step metrics logger: tensorboard (RUN_DIR/tensorboard), wandb "
        "(offline unless WANDB_MODE says otherwise; RUN_DIR/wandb), mlflow (file store "
        "RUN_DIR/mlruns unless MLFLOW_TRACKING_URI is set); wandb and mlflow are extras",
    )

    trace: bool | None = Field(
        None,
        description="write trace.json (tens of MB at scale; `tandem trace RUN` writes it "
        "later from the run's parquet files); unset: yes for `tandem run`, no for a sweep's "
        "points",
    )

    @field_validator("name", mode="before")
    @classmethod
    def _one_directory_name(cls, value: Any) -> str:
        if isinstance(value, int) and not isinstance(value, bool):
            value = str(value)  # a spec file's name of digits (name: 123) is a number in YAML
        if not isinstance(value, str) or not re.fullmatch(RUN_NAME, value):
            raise ValueError(
                f"{value!r} must be a directory name inside runs/: up to 128 letters, digits, "
                "'.', '_' or '-', starting with a letter or digit"
            )
        return value


class ModelShape(_Section):
    """A model's shape, for the simulator's cost model (what a ``config.json`` holds)."""

    num_params_b: float = Field(gt=0, description="parameters, billions (all experts)")
    active_params_b: float | None = Field(
        None, gt=0, description="parameters per token, billions (mixture of experts; None: all)"
    )
    num_layers: int = Field(ge=1, description="transformer layers")
    hidden_size: int = Field(ge=1, description="model width")
    intermediate_size: int = Field(0, ge=0, description="MLP width (an expert's, for MoE)")
    num_attention_heads: int = Field(ge=1, description="query heads")
    num_kv_heads: int | None = Field(None, ge=1, description="KV heads (None: as attention heads)")
    head_dim: int | None = Field(None, ge=1, description="None: hidden_size / attention heads")
    vocab_size: int = Field(0, ge=0, description="vocabulary size")
    num_experts: int = Field(0, ge=0, description="routed experts (0: dense)")
    num_experts_per_tok: int = Field(0, ge=0, description="experts each token is routed to")
    kv_lora_rank: int = Field(0, ge=0, description="multi-head latent attention KV rank (0: none)")
    qk_rope_head_dim: int = Field(0, ge=0, description="MLA: rotary key width cached per layer")

    @model_validator(mode="after")
    def _experts(self) -> ModelShape:
        if self.num_experts and not 0 < self.num_experts_per_tok <= self.num_experts:
            raise ValueError(
                "num_experts_per_tok must be in 1..num_experts for a mixture of experts"
            )
        if self.active_params_b is not None and self.active_params_b > self.num_params_b:
            raise ValueError("active_params_b cannot exceed num_params_b")
        return self

    @model_validator(mode="after")
    def _whole_heads(self) -> ModelShape:
        heads, kv = self.num_attention_heads, self.num_kv_heads
        if not self.kv_lora_rank and kv is not None and heads % kv:  # latent: no KV heads
            raise ValueError(
                f"num_kv_heads {kv} does not divide num_attention_heads {heads} (each KV "
                "head serves a whole group of query heads)"
            )
        if self.head_dim is None and self.hidden_size % heads:
            raise ValueError(
                f"hidden_size {self.hidden_size} is not a multiple of num_attention_heads "
                f"{heads}, so the head size is not whole; give head_dim"
            )
        return self


class ModelSection(_Section):
    name: str = Field(
        "Qwen2.5-7B",
        description="row of models.csv (sim cost model), or the name of the shape below",
    )
    path: str | None = Field(None, description="Hugging Face model directory (live)")
    config: str | None = Field(
        None, description="sim: a Hugging Face config.json (or its directory) giving the shape"
    )
    shape: ModelShape | None = Field(None, description="sim: the model's shape, inline")
    shape_source: str | None = Field(
        None, description="where shape came from: a run's record of its model.config"
    )

    @model_validator(mode="after")
    def _one_shape(self) -> ModelSection:
        if self.config is not None and self.shape is not None:
            raise ValueError("give model.config or model.shape, not both")
        return self


class AlgorithmSection(_Section):
    name: Literal["grpo", "ppo"] = Field(
        "grpo", description="objective: PipelineRL's simplified GRPO or PPO-clip (live loss)"
    )
    batch_size: int = count(1024, ge=1, le=2**20, description="samples per optimizer step")
    group_size: int = count(8, ge=1, le=4096, description="samples per prompt")
    micro_batch_per_gpu: int = count(
        1, ge=1, le=2**20, description="samples per trainer GPU per micro-batch"
    )
    kl_coef: float = Field(0.0, ge=0, description="weight of the reference-model KL (0: none)")
    clip_epsilon: float = Field(0.2, gt=0, description="importance-weight clip (1 + epsilon)")
    learning_rate: float = Field(1e-6, gt=0, description="AdamW learning rate (live trainer)")

    @model_validator(mode="after")
    def _groups_fit(self) -> AlgorithmSection:
        if self.batch_size % self.group_size:
            raise ValueError(
                f"batch_size ({self.batch_size}) must be a multiple of group_size ({self.group_size})"
            )
        return self


class ElasticSection(_Section):
    max_extra_instances: int = count(4, ge=0, le=4096, description="elastic: most instances added")
    gpus_per_step: int = count(8, ge=1, le=4096, description="GPUs added per scale-out (one node)")
    retire: bool = Field(
        False,
        description="elastic: also retire instances (newest first, drained, never the last) "
        "while generation with fewer would still take no longer than training",
    )


class PoliciesSection(_Section):
    # each registry in its key's annotation: ``tandem spec keys`` lists its names
    dispatch: Annotated[str, DISPATCH] = Field(
        "skewness-aware", description="which instance serves each sample"
    )
    dispatch_objective: Literal["sum", "max"] = Field(
        "sum",
        description="skewness-aware: minimise the sum (as StreamRL prints Alg. 2) or the max "
        "(the batch's generation time) of the two instance groups' latencies",
    )
    long_tail_fraction: float = Field(
        0.2, gt=0, lt=1, description="skewness-aware: share of samples treated as long-tail"
    )
    scheduling: Annotated[str, SCHEDULING] = Field(
        "lpt", description="order of requests inside an instance"
    )
    length_predictor: Annotated[str, PREDICTORS] = Field(
        "oracle", description="predicted output lengths (dispatch)"
    )
    predictor_recall: float = Field(0.87, gt=0, le=1, description="noisy-oracle: top-20% recall")
    ranker_path: str | None = Field(
        None,
        description="ranker: a model file of `tandem ranker fit` (sim and live; saved "
        "absolute); unset: the sim fits one on held-out draws of the workload, a live run "
        "starts empty and learns from its completions",
    )
    allocation: Annotated[str, ALLOCATION] = Field(
        "fixed", description="split of GPUs between generation and training"
    )
    elastic: ElasticSection = Field(default_factory=ElasticSection)

    @field_validator("dispatch")
    @classmethod
    def _known_dispatch(cls, value: str) -> str:
        return check_name(value, DISPATCH.names())

    @field_validator("scheduling")
    @classmethod
    def _known_scheduling(cls, value: str) -> str:
        return check_name(value, SCHEDULING.names())

    @field_validator("length_predictor")
    @classmethod
    def _known_predictor(cls, value: str, info: ValidationInfo) -> str:
        value = check_name(value, PREDICTORS.names())
        dispatch = info.data.get("dispatch")
        if value == "none" and dispatch in NEEDS_LENGTHS:
            raise ValueError(
                f"'none' leaves policies.dispatch {dispatch!r} without predicted lengths (it "
                "would put the first fifth of a batch on one instance): choose a length "
                "predictor or another dispatch"
            )
        return value

    @field_validator("allocation")
    @classmethod
    def _known_allocation(cls, value: str) -> str:
        return check_name(value, ALLOCATION.names())

    @field_validator("ranker_path")
    @classmethod
    def _absolute_ranker_path(cls, value: str | None) -> str | None:
        if value is None:
            return None
        if not value.strip():
            raise ValueError("an empty path: give a model file of `tandem ranker fit`, or null")
        return str(Path(value).expanduser().absolute())  # the run reads it from any directory

    @model_validator(mode="after")
    def _ranker_path_needs_ranker(self) -> PoliciesSection:
        if self.ranker_path is not None and self.length_predictor != "ranker":
            raise ValueError(
                f"ranker_path is read only by length_predictor 'ranker', not "
                f"{self.length_predictor!r}: set policies.length_predictor=ranker or "
                "policies.ranker_path=null"
            )
        return self


SECRET_KEYS = (("live", "token"), ("live", "api_key"))  # never written to a file or tracker


class RunSpec(_Section):
    run: RunSection = Field(default_factory=RunSection)
    model: ModelSection = Field(default_factory=ModelSection)
    cluster: ClusterSection = Field(default_factory=ClusterSection)
    workload: WorkloadSection = Field(default_factory=WorkloadSection)
    algorithm: AlgorithmSection = Field(default_factory=AlgorithmSection)
    pipeline: PipelineSection = Field(default_factory=PipelineSection)
    policies: PoliciesSection = Field(default_factory=PoliciesSection)
    sim: SimSection = Field(default_factory=SimSection)
    live: LiveSection = Field(default_factory=LiveSection)

    @model_validator(mode="after")
    def _lpt_needs_priorities(self) -> RunSpec:
        if self.policies.scheduling == "lpt":
            for i, pool in enumerate(self.cluster.generation):
                if pool.scheduling_policy != "priority":
                    raise ValueError(
                        f"cluster.generation.{i}.scheduling_policy: 'lpt' scheduling needs "
                        "vLLM's 'priority' policy"
                    )
        return self

    @model_validator(mode="after")
    def _whole_rounds(self) -> RunSpec:
        steps = self.pipeline.steps_per_generation
        if self.run.iterations % steps:
            raise ValueError(
                f"run.iterations ({self.run.iterations}) must be a multiple of "
                f"pipeline.steps_per_generation ({steps}): conventional generates one batch "
                "for that many steps"
            )
        return self

    @model_validator(mode="after")
    def _bounded_run(self) -> RunSpec:
        num_samples = self.run.iterations * self.algorithm.batch_size
        if num_samples > MAX_RUN_SAMPLES:
            raise ValueError(
                f"run.iterations × algorithm.batch_size = {num_samples:,} samples; a run may "
                f"generate at most {MAX_RUN_SAMPLES:,}"
            )
        return self

    def public_dump(self) -> dict[str, Any]:
        """The spec as plain data with its secrets (:data:`SECRET_KEYS`) set to None: what
        result files, reports and trackers record."""
        data = self.model_dump(mode="json")
        for section, key in SECRET_KEYS:
            data[section][key] = None
        return data

    def to_yaml(self) -> str:
        """The resolved spec as YAML, secrets left out (:meth:`public_dump`)."""
        return yaml.safe_dump(self.public_dump(), sort_keys=False)

    @property
    def prompts_per_iteration(self) -> int:
        return self.algorithm.batch_size // self.algorithm.group_size


def spec_from_dict(data: dict[str, Any], given: dict[str, str] | None = None) -> RunSpec:
    """``data`` validated; ``given``: the overrides' values as typed, for the message."""
    try:
        return RunSpec.model_validate(data)
    except ValidationError as err:
        raise SpecError(format_errors(err, given)) from None


def override_spec(spec: RunSpec, overrides: list[str]) -> RunSpec:
    """``spec`` with each ``key.path=value`` override set (and validated again).

    Overrides apply to the resolved spec, so list items and defaults can be set. One that
    switches ``pipeline.mode`` to a mode fixing its own lag, without setting
    ``pipeline.max_lag`` too, drops the old spec's ``max_lag``: that belonged to the old
    mode (a ``pipeline`` base, or live-tiny's lag for ``pipeline`` runs); likewise one
    switching to a mode that is not continuous drops ``pipeline.push_every`` (and
    ``pipeline.inflight`` unless the waves overlap), one switching to a mode
    ``pipeline.overlap_waves`` does not apply to drops that, and one leaving
    ``conventional`` drops ``pipeline.steps_per_generation``."""
    data = apply_overrides(spec.model_dump(mode="json"), overrides, RunSpec)
    keys = set(given_texts(overrides))
    pipeline = data.get("pipeline")
    mode = pipeline.get("mode") if isinstance(pipeline, dict) else None
    if mode != spec.pipeline.mode and mode in MODES:  # switched to another known mode
        traits = MODES.get(mode)
        if "pipeline.max_lag" not in keys and traits.fixed_lag(1) is not None:
            pipeline["max_lag"] = None
        if "pipeline.push_every" not in keys and not traits.continuous:
            pipeline["push_every"] = 1
        if "pipeline.overlap_waves" not in keys and mode not in overlap_modes():
            pipeline["overlap_waves"] = None
        if "pipeline.steps_per_generation" not in keys and not traits.conventional:
            pipeline["steps_per_generation"] = 1
        if "pipeline.inflight" not in keys and not (traits.continuous or pipeline["overlap_waves"]):
            pipeline["inflight"] = "keep"
    return spec_from_dict(data, given_texts(overrides))


def load_spec(path: str | Path | None, overrides: list[str] | None = None) -> RunSpec:
    """Load a YAML spec (or the defaults when ``path`` is None) and apply overrides."""
    data: dict[str, Any] = {}
    if path is not None:
        try:
            loaded = read_yaml(Path(path).read_text(), RunSpec)
        except FileNotFoundError:
            raise SpecError(f"spec file {path} does not exist") from None
        except IsADirectoryError:
            raise SpecError(f"spec {path} is a directory, not a YAML file") from None
        except (PermissionError, UnicodeDecodeError) as err:
            raise SpecError(f"spec file {path} cannot be read ({err})") from None
        except yaml.YAMLError as err:
            raise SpecError(f"{path}: not valid YAML ({err})") from None
        if loaded is None:  # a user who names a file means it to say something
            raise SpecError(f"{path}: empty spec file (no keys); write {{}} in it for all defaults")
        if not isinstance(loaded, dict):
            raise SpecError(f"{path}: the top level must be a mapping of sections")
        data = loaded
    spec = spec_from_dict(data)
    return override_spec(spec, overrides) if overrides else spec


def flat_keys(data: Any, prefix: str = "") -> dict[str, Any]:
    """A nested mapping as ``{"a.b.c": value}`` (lists stay values)."""
    if isinstance(data, dict):
        out: dict[str, Any] = {}
        for k, v in data.items():
            out.update(flat_keys(v, f"{prefix}{k}."))
        return out
    return {prefix.rstrip("."): data}


def spec_changes(original: RunSpec, new: RunSpec) -> list[str]:
    """``key (old → new)`` for every key whose value differs, sorted by key."""
    a, b = flat_keys(original.model_dump(mode="json")), flat_keys(new.model_dump(mode="json"))
    return [
        f"{k} ({a.get(k)!r} → {b.get(k)!r})"
        for k in sorted(set(a) | set(b))
        if a.get(k) != b.get(k)
    ]
