"""The ``live`` section of a run spec: settings of the live runtime (``--live``)."""

from __future__ import annotations

import os
from typing import Literal
from urllib.parse import urlsplit

from pydantic import Field, field_validator, model_validator

from policies.cluster import MAX_TOKENS, Section, count


class LiveSection(Section):
    """Live runtime settings (used with ``--live``)."""

    num_servers: int = count(1, ge=1, le=64, description="generation servers to start")
    host: str = Field("127.0.0.1", description="address the servers bind to")
    base_port: int = count(
        8400, ge=1024, le=65000, description="port of server 0 (server i: base + i)"
    )
    token: str | None = Field(None, description="control-route bearer token (generated if None)")
    device: Literal["auto", "cpu", "cuda"] = Field(
        "auto", description="cuda: NCCL weight group; otherwise gloo"
    )
    weight_backend: Literal["auto", "gloo", "nccl"] = Field(
        "auto",
        description="backend of the weight group (trainer to servers). auto: NCCL where the "
        "trainer and every server hold GPUs of their own (the Ray launcher on a CUDA "
        "cluster), gloo otherwise: NCCL refuses two ranks on one GPU, and servers started on "
        "this machine share its GPU with the trainer; gloo carries a push through host memory",
    )
    kv_cache_gib: float = Field(1.0, gt=0, description="vLLM CPU KV cache per server, GiB")
    max_model_len: int = count(
        512, ge=16, le=MAX_TOKENS, description="longest prompt + output, tokens"
    )
    temperature: float = Field(
        1.0, ge=0, le=2, description="sampling temperature; vLLM samples within [0, 2]"
    )
    checkpoint_every: int = count(
        1,
        ge=1,
        description="optimizer steps between checkpoints; the run's last step always "
        "checkpoints (a value above run.iterations: that one only)",
    )
    checkpoint_min_interval_s: float = Field(
        0.0,
        ge=0,
        description="a due checkpoint is skipped while the last one is younger than this "
        "(seconds of the run clock); the run's last step always checkpoints, and so does "
        "the last trained step at a Ctrl-C or SIGTERM",
    )
    stop_grace_s: float = Field(
        60.0,
        gt=0,
        le=86_400,
        description="seconds a Ctrl-C or SIGTERM waits for the trainer's job in progress and "
        "the stop's checkpoint; past them the run stops without that checkpoint (it resumes "
        "after the last one). Also how long the trainer process gets to finish writing a "
        "checkpoint when the run ends, before it is killed",
    )
    keep_checkpoints: int = count(
        3,
        ge=0,
        le=10_000,
        description="newest checkpoints kept as checkpoints/step-N.pt for `tandem export "
        "--step` (hard links: K cost K - 1 checkpoints of disk; 0: only last.pt)",
    )
    server_urls: list[str] | None = Field(
        None, description="attach to running servers (base URLs) instead of starting num_servers"
    )
    micro_batch_samples: int = count(
        8, ge=1, le=2**20, description="samples per trainer micro-batch"
    )
    trainer_threads: int | None = count(
        None, ge=1, le=1024,
        description="torch threads of the trainer process; None: one per core it runs on (the "
        "second half of the cores, or all of them where a mode time-shares them: colocated-sync)",
    )  # fmt: skip
    trainer_nice: int = count(
        0, ge=0, le=19,
        description="niceness of the trainer process: >0 lets the generation server's frontend "
        "and the actor, which run on any core, go first on the trainer's core",
    )  # fmt: skip
    engine_nice: int | None = count(
        None, ge=0, le=19,
        description="niceness of the vLLM engine processes of the servers this run starts (not "
        "their HTTP frontends or the trainer, which then go first on a core they share); "
        "None: 8 where each server has a core of its own on a CPU host (every mode but "
        "pipeline), else 0 (docs/live-throughput.md)",
    )  # fmt: skip
    lend_idle_cores: bool = Field(
        True,
        description="while no request runs on any server, the trainer trains on the "
        "generation cores too, one torch thread per core (runtime/core_loan.py); with servers "
        "this run starts, trainer_threads unset, on the CPU",
    )
    skip_zero_advantage: bool = Field(
        True,
        description="the trainer leaves out of its forward and backward the samples whose "
        "advantage is exactly 0 (every sample of their group got the same reward): with "
        "algorithm.kl_coef 0 they add nothing to the gradient, so the update is unchanged; they "
        "still count in the step's samples, reward and lag (steps.json: num_skipped)",
    )
    share_prompts: bool = Field(
        True,
        description="the trainer packs the samples of one prompt with a single copy of it, "
        "each answer attending to that copy (runtime/packing.py): the same log-probs from "
        "fewer tokens, ~half as many on live-longtail",
    )
    compile_trainer: bool = Field(
        False,
        description="run the trainer's forward and backward under torch.compile (inductor, "
        "dynamic shapes), compiled before the run's clock starts: ~15 % less time per step on "
        "live-tiny, 10-20 s more start-up, a C++ compiler needed; not with a sharded trainer",
    )
    startup_timeout_s: float = Field(300.0, gt=0, description="wait for a server's /health")
    cpu_sample_s: float = Field(
        0.1,
        ge=0,
        description="interval of the CPU timeline (cpu_timeline.csv, a counter track of "
        "trace.json, a panel of timeline.png): the cores each role of the run used; 0: none",
    )
    cost_model: str | None = Field(
        None,
        description="calibrated cost model (cost_model.json, or the `tandem calibrate` directory "
        "holding it) that skewness-aware dispatch prices with; None: the tiny model's constants "
        "(runtime/cost.py)",
    )
    warm_up_tokens: int = count(
        16, ge=0, le=MAX_TOKENS,
        description="before the run's clock starts, each server generates one batch of this "
        "many tokens a sample (a fresh engine's first requests are slow); 0: no warm-up",
    )  # fmt: skip
    restart_servers: bool = Field(
        False, description="start a server that died again; it rejoins at the next weight push"
    )
    api_key: str | None = Field(
        None, description="API key of the servers' inference routes (None: they need none)"
    )

    @model_validator(mode="after")
    def _nccl_on_gpus(self) -> LiveSection:
        if self.weight_backend == "nccl" and self.device == "cpu":
            raise ValueError("live.weight_backend: nccl needs live.device cuda (or auto), not cpu")
        return self

    @field_validator("cost_model")
    @classmethod
    def _absolute_cost_model(cls, value: str | None) -> str | None:
        # absolute, as sim.cost_model's path, so that the saved spec.yaml runs from any directory
        return None if value is None else os.path.abspath(value)

    @field_validator("server_urls")
    @classmethod
    def _server_urls_distinct(cls, urls: list[str] | None) -> list[str] | None:
        """Base URLs, each once, without a trailing slash (``URL/`` + ``/route`` was a 404)."""
        seen: dict[str, int] = {}
        for i, url in enumerate(urls or []):
            parts = urlsplit(url)
            if parts.scheme not in ("http", "https") or not parts.hostname:
                raise ValueError(
                    f"server_urls[{i}] {url!r}: expected a base URL such as http://127.0.0.1:8400"
                )
            key = f"{parts.scheme}://{parts.hostname}:{parts.port}{parts.path.rstrip('/')}"
            if key in seen:
                raise ValueError(
                    f"server_urls[{i}] {url} is server_urls[{seen[key]}] again: a server "
                    "joins a run's weight group once; list each server once"
                )
            seen[key] = i
        return None if urls is None else [u.rstrip("/") for u in urls]

    @model_validator(mode="after")
    def _restart_own_servers(self) -> LiveSection:
        if self.restart_servers and self.server_urls:
            raise ValueError(
                "restart_servers restarts servers this run starts; it cannot restart "
                "live.server_urls"
            )
        return self
