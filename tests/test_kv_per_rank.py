"""KV cache and KV reads per tensor-parallel rank, as vLLM lays them out: each rank caches
``max(1, num_kv_heads // tp)`` KV heads (``ModelConfig.get_num_kv_heads``), so heads are
replicated when ``tp > num_kv_heads``, and the whole latent under latent attention
(``MLAAttentionSpec``: one head of ``kv_lora_rank + qk_rope_head_dim``). An instance holds
what one rank's free memory holds, not ``tp`` times it.

Seen (trial at scale): DeepSeek-V3 at tp 16 on H200 had 9.8M tokens of KV per instance in
the sim, about 0.61M in vLLM, and read its KV 16 times faster than one rank can.
"""

from __future__ import annotations

import pytest
from helpers import small_spec

from policies.protocols import Device
from policies.sim_section import EfficiencySection
from sim.cluster import check_sim_run
from sim.costs import RooflineCostModel
from sim.models import model
from sim.tables import hardware_table

EFF = EfficiencySection()


def _cost(name: str) -> RooflineCostModel:
    return RooflineCostModel(model(name), EFF, "grpo")


def _per_rank_capacity(name: str, hardware: str, tp: int) -> float:
    """One rank's free HBM over the KV bytes a token takes on it, written out by hand."""
    m, hw = model(name), hardware_table()[hardware]
    free = hw.hbm_bytes * EFF.gpu_memory_utilization - m.weight_bytes / tp
    if m.kv_lora_rank:
        per_layer = m.kv_lora_rank + m.qk_rope_head_dim  # the whole latent, one copy
    else:
        per_layer = 2 * max(1, m.num_kv_heads // tp) * m.head_dim
    return free / (2 * m.num_layers * per_layer)


@pytest.mark.parametrize(
    ("name", "tp", "heads"),
    [("Qwen3-30B-A3B", 2, 2), ("Qwen3-30B-A3B", 4, 1), ("Qwen3-30B-A3B", 8, 1),
     ("Qwen2.5-72B", 8, 1), ("Qwen2.5-72B", 16, 1), ("Llama-3.1-8B", 2, 4),
     ("Llama-2-7B", 8, 4), ("DeepSeek-V3", 1, 1), ("DeepSeek-V3", 16, 1)],
)  # fmt: skip
def test_kv_heads_per_rank_follow_vllm_get_num_kv_heads(name, tp, heads):
    assert model(name).kv_heads_per_rank(tp) == heads


def test_deepseek_v3_at_tp16_holds_what_one_rank_holds():
    """Every rank caches the full latent: 61 × 576 × 2 bytes a token on each of 16 GPUs."""
    capacity = _cost("DeepSeek-V3").kv_capacity_tokens(Device("H200", 16))
    assert capacity == pytest.approx(_per_rank_capacity("DeepSeek-V3", "H200", 16), abs=1)
    assert 600_000 < capacity < 620_000  # vLLM: about 0.61M; before: 9.8M


def test_qwen3_30b_at_tp8_replicates_its_4_kv_heads():
    """4 KV heads: tp 4 gives each rank one, tp 8 two ranks each head. Going from 4 to 8
    GPUs frees only the halved weights, not twice the KV room (before: 2.27×)."""
    cost = _cost("Qwen3-30B-A3B")
    tp4, tp8 = (cost.kv_capacity_tokens(Device("H100-SXM", tp)) for tp in (4, 8))
    assert tp8 == pytest.approx(_per_rank_capacity("Qwen3-30B-A3B", "H100-SXM", 8), abs=1)
    assert tp4 == pytest.approx(_per_rank_capacity("Qwen3-30B-A3B", "H100-SXM", 4), abs=1)
    assert 1.1 < tp8 / tp4 < 1.2


@pytest.mark.parametrize(
    ("name", "hardware", "tps"),
    [("Qwen2.5-7B", "H800", (1, 2, 4)), ("Qwen2.5-72B", "H800", (4, 8)),
     ("Llama-3.1-8B", "H100-SXM", (1, 8)), ("Qwen3-30B-A3B", "H100-SXM", (1, 2, 4))],
)  # fmt: skip
def test_a_model_whose_kv_heads_split_evenly_keeps_its_capacity_and_reads(name, hardware, tps):
    """tp ≤ KV heads: per rank is exactly the old whole-instance arithmetic, bit for bit."""
    cost, m = _cost(name), model(name)
    hw = hardware_table()[hardware]
    for tp in tps:
        free = tp * hw.hbm_bytes * EFF.gpu_memory_utilization - m.weight_bytes
        assert cost.kv_capacity_tokens(Device(hardware, tp)) == int(free // m.kv_bytes_per_token)
        read = m.kv_bytes_per_token * 1000 / (tp * hw.hbm_bytes_per_s * EFF.kv_memory)
        assert cost.attention_s(hw, tp, 0.0, 1000) == read


@pytest.mark.parametrize(
    ("name", "tp", "copies"), [("DeepSeek-V3", 16, 16), ("Qwen2.5-72B", 16, 2),
                                ("Qwen3-235B-A22B", 8, 2)]
)  # fmt: skip
def test_each_rank_reads_its_own_kv_replicas_included(name, tp, copies):
    """A decode step reads each rank's KV slice in parallel: ``copies`` times the KV an even
    split would give each rank (the whole latent on every rank under latent attention)."""
    cost, m = _cost(name), model(name)
    hw = hardware_table()["H200"]
    even_split = m.kv_bytes_per_token * 1000 / (tp * hw.hbm_bytes_per_s * EFF.kv_memory)
    assert cost.attention_s(hw, tp, 0.0, 1000) == pytest.approx(copies * even_split)


def test_a_sequence_longer_than_the_cache_names_tp_and_max_output_tokens():
    """Before: only cluster.generation.0.tp, though the max tokens are often the lever."""
    spec = small_spec(model__name="Qwen2.5-32B", cluster__generation__0__tp=1,
                      cluster__generation__0__num_gpus=1, workload__max_output_tokens=32768)  # fmt: skip
    with pytest.raises(ValueError) as info:
        check_sim_run(spec)
    said = str(info.value)
    assert said.startswith("cluster.generation.0.tp: the longest prompt with its max_tokens (")
    assert "raise cluster.generation.0.tp" in said
    assert "lower workload.max_output_tokens (32768)" in said
    blocks = _cost("Qwen2.5-32B").kv_capacity_tokens(Device("H800", 1)) // 16 - 1  # null block
    capacity = blocks * 16
    assert f"{capacity} tokens)" in said


def test_a_growing_max_names_final_max_output_tokens_and_the_override():
    spec = small_spec(cluster__generation__0__num_gpu_blocks_override=100,
                      workload__final_max_output_tokens=4000)  # fmt: skip
    with pytest.raises(ValueError) as info:
        check_sim_run(spec)
    said = str(info.value)
    assert said.startswith("cluster.generation.0.num_gpu_blocks_override: ")
    assert "(99 blocks of 16 tokens, 1584 tokens)"  # one is the null block in said
    assert "raise cluster.generation.0.num_gpu_blocks_override" in said
    assert "lower workload.final_max_output_tokens (4000)" in said
