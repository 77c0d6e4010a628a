"""The simulated points of the StreamRL study, derived from the shipped configs.

Every system is a shipped config (``streamrl-7b`` / ``-32b`` / ``-72b``: the paper's
models, GPU counts, PPO, batch 1024, Fig. 7 lengths) plus overrides naming the
mechanism under test; nothing here is fitted to a published number.
"""

from __future__ import annotations

from dataclasses import dataclass

from experiments.reproduce.points import Point


@dataclass(frozen=True, slots=True)
class Budget:
    """How much to simulate: ``--quick`` runs fewer iterations and points."""

    iterations: int  # optimizer steps per end-to-end run
    stage_iterations: int  # iterations of the stage-scaling runs
    elastic_iterations: int  # iterations over which the max length grows 10K -> 20K
    lengths: tuple[int, ...]  # max output tokens (the paper's 5K / 10K / 20K datasets)
    stage_gpus: tuple[int, ...]  # GPUs per stage in the stage-scaling sweep
    stage_lengths: tuple[int, ...]  # output tokens per sample in the stage-scaling sweep
    systems: tuple[str, ...]  # end-to-end systems (keys of SYSTEMS)


ALL_SYSTEMS = (
    "colocated (verl-like)",
    "colocated + skewness-aware",
    "disagg-sync",
    "one-step-async",
    "stream-sync",
    "stream-async",
)
QUICK_SYSTEMS = (
    "colocated (verl-like)",
    "colocated + skewness-aware",
    "stream-sync",
    "stream-async",
)
QUICK = Budget(2, 1, 5, (5000, 10000, 20000), (8, 16, 32), (1000, 2000, 4000, 8000), QUICK_SYSTEMS)
FULL = Budget(
    10, 2, 10, (5000, 10000, 20000), (8, 16, 24, 32), (1000, 2000, 4000, 6000, 8000), ALL_SYSTEMS
)

MODELS = {"7B": "streamrl-7b", "32B": "streamrl-32b", "72B": "streamrl-72b"}
TOTAL_GPUS = {"7B": 32, "32B": 64, "72B": 128}

# A realistic ranker: StreamRL's published top-20 % recall of its best ranker.
RANKER = ("policies.length_predictor=noisy-oracle", "policies.predictor_recall=0.87")
VERL_LIKE = (  # verl: colocated, prompts split evenly by count, FIFO, no length prediction
    "pipeline.mode=colocated-sync",
    "policies.dispatch=round-robin",
    "policies.scheduling=fcfs",
    "policies.length_predictor=none",
)
RANDOM_FIFO = (
    "policies.dispatch=random",
    "policies.scheduling=fcfs",
    "policies.length_predictor=none",
)
ORACLE = ("policies.length_predictor=oracle",)

SYSTEMS: dict[str, tuple[str, ...]] = {
    "colocated (verl-like)": VERL_LIKE,
    "colocated + skewness-aware": ("pipeline.mode=colocated-sync", *RANKER),
    "disagg-sync": ("pipeline.mode=disagg-sync", *RANKER),
    "one-step-async": ("pipeline.mode=one-step-async", *RANKER),
    "stream-sync": ("pipeline.mode=stream-sync", *RANKER),
    "stream-async": ("pipeline.mode=stream-async", *RANKER),
}
ABLATION = ["colocated (verl-like)", "colocated + skewness-aware", "stream-sync", "stream-async"]
PREDICTORS = {
    "random + FIFO": ("pipeline.mode=stream-sync", *RANDOM_FIFO),
    "skewness-aware + ranker (recall 0.87)": ("pipeline.mode=stream-sync", *RANKER),
    "skewness-aware + oracle": ("pipeline.mode=stream-sync", *ORACLE),
}


def _iters(n: int) -> str:
    return f"run.iterations={n}"


def _max_len(tokens: int) -> str:
    return f"workload.max_output_tokens={tokens}"


def e2e_point(model: str, length: int, system: str, b: Budget) -> Point:
    return Point(MODELS[model], (*SYSTEMS[system], _max_len(length), _iters(b.iterations)))


def predictor_point(model: str, name: str, b: Budget) -> Point:
    return Point(MODELS[model], (*PREDICTORS[name], _max_len(20000), _iters(b.iterations)))


def allocation_point(model: str, length: int, allocation: str, b: Budget) -> Point:
    system = SYSTEMS["stream-async"]  # the shipped configs allocate with ``balanced``
    if allocation != "balanced":
        system = (*system, f"policies.allocation={allocation}")
    return Point(MODELS[model], (*system, _max_len(length), _iters(b.iterations)))


def stage_point(gpus: int, length: int | None, b: Budget) -> Point:
    """7B, disagg-sync, ``gpus`` per stage; ``length``: every sample that long (else Fig. 7)."""
    overrides = [
        "pipeline.mode=disagg-sync",
        "policies.allocation=fixed",
        f"cluster.generation.0.num_gpus={gpus}",
        f"cluster.trainer.num_gpus={gpus}",
        _iters(b.stage_iterations),
    ]
    if length is not None:  # a near-constant length isolates the effect of length
        overrides += [
            "workload.kind=lognormal",
            f"workload.lognormal_median_tokens={length}",
            "workload.lognormal_sigma=0.01",
            _max_len(2 * length),
        ]
    return Point("streamrl-7b", tuple(overrides))


def elastic_point(allocation: str, b: Budget) -> Point:
    """7B on 32 GPUs (16 + 16), max length growing linearly 10K -> 20K over the run."""
    return Point(
        "streamrl-7b",
        (
            *SYSTEMS["stream-async"],
            f"policies.allocation={allocation}",
            "policies.elastic.gpus_per_step=8",
            "policies.elastic.max_extra_instances=32",
            _max_len(10000),
            "workload.final_max_output_tokens=20000",
            _iters(b.elastic_iterations),
        ),
    )


def cross_dc_point(setup: str, length: int, b: Budget) -> Point:
    """7B: 32 H800 in one datacenter, or 32 H20 generating (dc1) + 16 H800 training (dc0)."""
    overrides = [*SYSTEMS["stream-async"], _max_len(length), _iters(b.iterations)]
    if setup == "heterogeneous cross-DC":
        overrides += [
            "cluster.generation.0.hardware=H20",
            "cluster.generation.0.num_gpus=32",
            "cluster.generation.0.datacenter=dc1",
            "cluster.trainer.num_gpus=16",
        ]
    return Point("streamrl-7b", tuple(overrides))


def weight_share_point(length: int, b: Budget) -> Point:
    """72B: 64 H20 generating in dc1 (TP 4), 64 H800 training in dc0, over the 80 Gbps link."""
    return Point(
        "streamrl-72b",
        (
            *SYSTEMS["stream-async"],
            "cluster.generation.0.hardware=H20",
            "cluster.generation.0.datacenter=dc1",
            _max_len(length),
            _iters(b.iterations),
        ),
    )


def all_points(b: Budget) -> list[Point]:
    points = [e2e_point(m, n, s, b) for m in MODELS for n in b.lengths for s in b.systems]
    points += [predictor_point(m, p, b) for m in MODELS for p in PREDICTORS]
    points += [
        allocation_point(m, n, a, b)
        for m in ("32B", "72B")
        for n in b.lengths
        for a in ("fixed", "balanced")
    ]
    points += [stage_point(g, None, b) for g in b.stage_gpus]
    points += [stage_point(16, n, b) for n in b.stage_lengths]
    points += [elastic_point(a, b) for a in ("fixed", "elastic")]
    points += [cross_dc_point(s, n, b) for s in CROSS_DC_SETUPS for n in b.lengths]
    points += [weight_share_point(n, b) for n in b.lengths]
    return points


CROSS_DC_SETUPS = ("single-DC H800", "heterogeneous cross-DC")
