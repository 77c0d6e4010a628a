"""Every modelling assumption behind the reproduction reports, with its source."""

from __future__ import annotations

from experiments.reproduce.report import Assumption

_SPEC = "documented engine-efficiency assumption, `policies/sim_section.py` EfficiencySection (not fitted)"
_FIT = (
    "fitted to StreamRL's published 7B/H800 decode profile (Fig. 6) by "
    "`sim.calibration.fit_ptl_profile`; efficiency factor only"
)

COMMON = [
    Assumption("Qwen2.5-7B/32B/72B shapes", "params, layers, hidden, KV heads", "`models.csv`"),
    Assumption("decode: achieved HBM bandwidth", "0.8 × peak", _SPEC),
    Assumption("decode: achieved FLOP/s", "0.292 × peak", _FIT),
    Assumption("decode: compute and memory time", "add (not max)", _FIT),
    Assumption("prefill: achieved FLOP/s", "0.6 × peak", _SPEC),
    Assumption("training MFU", "0.4", _SPEC),
    Assumption("fixed cost per decode step", "2.83 ms", _FIT),
    Assumption("KV cache", "0.9 × HBM − bf16 weights", _SPEC + " (vLLM's default utilisation)"),
    Assumption(
        "training FLOPs per token",
        "PPO 18·P (actor + critic fwd/bwd, ref, old-logprob, value); GRPO 6·P",
        "`sim/costs.py` roofline (standard 6·P per trained model)",
    ),
    Assumption(
        "optimizer step", "32 B per parameter through HBM (Adam, fp32 states)", "`sim/costs.py`"
    ),
    Assumption(
        "engine",
        "vLLM-like continuous batching, max 256 running sequences",
        "vLLM default; `sim/engine.py`",
    ),
    Assumption(
        "prompt-length correlation of output lengths",
        "96 % of log-length variance per prompt, 0.98 across epochs",
        "simulator default (`workload`), set so a prompt's history can rank lengths as well "
        "as StreamRL's published ranker (recall 0.87 / 0.82 / 0.76; docs/ranker.md)",
    ),
    Assumption("random seed", "0 (named streams)", "shipped configs"),
]

STREAMRL_ASSUMPTIONS = [
    Assumption("H800", "989.5 TFLOP/s bf16, 80 GB, 3.35 TB/s; cost 2.85 per GPU", "`hardware.csv` (StreamRL Table 1)"),
    Assumption("H20", "148 TFLOP/s bf16, 96 GB, 4.0 TB/s; cost 1.00 per GPU", "`hardware.csv` (StreamRL Table 1)"),
    *COMMON,
    Assumption("GPUs", "7B/32, 32B/64, 72B/128 H800; 8 per node", "StreamRL README (paper setup)"),
    Assumption("algorithm", "PPO, 1024 samples per iteration, one sample per prompt", "StreamRL README"),
    Assumption("output lengths", "Fig. 7 histogram (±3 %), ×0.25 / ×0.5 for 5K / 10K", "`output_length_hist.csv`, README"),
    Assumption("prompt lengths", "lognormal, median 512 tokens, σ = 0.5", "shipped configs; not published"),
    Assumption("tensor parallelism", "7B TP 1, 32B TP 2, 72B TP 4", "smallest TP leaving KV room (config comments)"),
    Assumption("network", "1600 Gbps per node (8×200 RoCE); 80 Gbps between DCs", "StreamRL README"),
    Assumption("colocated context switch", "training state + weights over PCIe at 50 GB/s per GPU", "shipped configs; not published"),
    Assumption("verl-like baseline", "colocated, round-robin dispatch, FCFS, no length prediction", "our reading of verl"),
    Assumption("ColocationRL", "colocated with StreamRL's dispatch, LPT and ranker", "README: 'same engine as StreamRL'"),
    Assumption("length ranker", "noisy oracle with top-20 % recall 0.87", "README: best ranker's published recall"),
    Assumption("skewness-aware dispatch", "top 20 % long-tail, P90 / P50, objective = sum", "README (Alg. 2 as printed)"),
    Assumption("allocation", "`balanced` (Alg. 1); across DCs the faster side shrinks", "README"),
    Assumption("elastic", "+1 node (8 GPUs) when Δ > Δ′, ≤ 32 extra instances, 60 s start", "issue 6; cap and start time ours"),
    Assumption("heterogeneous 7B", "32 H20 (dc1) generate, 16 H800 (dc0) train", "README / issue 6"),
    Assumption("heterogeneous 72B", "64 H20 (TP 4, dc1) generate, 64 H800 (dc0) train", "ours (the README gives no 72B split)"),
]  # fmt: skip

PIPELINERL_ASSUMPTIONS = [
    Assumption("H100-SXM", "989.5 TFLOP/s bf16, 80 GB, 3.35 TB/s", "`hardware.csv` (NVIDIA datasheet)"),
    *COMMON,
    Assumption("setup", "Qwen2.5-7B, 128 H100: 48 generate at 64 sequences each, 80 train", "`pipelinerl.md` (paper)"),
    Assumption("algorithm", "GRPO, B = 1024 sequences per optimizer step, group 8, max 8192 tokens", "`pipelinerl.md`"),
    Assumption("output lengths", "StreamRL's Fig. 7 histogram scaled to 8192 tokens", "`pipelinerl-7b.yaml` (PipelineRL publishes none)"),
    Assumption("prompt lengths", "lognormal, median 256 tokens", "`pipelinerl-7b.yaml`; not published"),
    Assumption("dispatch", "least-loaded, FCFS, no length prediction", "`pipelinerl-7b.yaml` (PipelineRL has no ranker)"),
    Assumption("in-flight update", "keep (pause, load, resume with KV kept)", "`pipelinerl.md`"),
    Assumption(
        "conventional RL (G steps per round)",
        "`conventional` mode, steps_per_generation = G: G·B samples on one set of weights, "
        "then G simulated optimizer steps, then a weight push; lags recorded per sample",
        "`pipelinerl.md` (the paper's baseline); `policies/modes/conventional.py`",
    ),
    Assumption(
        "conventional throughput",
        "trained samples / makespan over whole rounds (how many: the report's mode line)",
        "this report (every round pays generation, G steps and the push in series)",
    ),
    Assumption(
        "steady-state throughput",
        "B × steps / time over the middle half of the optimizer steps",
        "this report (pipeline only; excludes its fill and drain)",
    ),
]  # fmt: skip
