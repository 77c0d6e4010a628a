"""The stage model's decode estimate on one instance: the KV cache caps the sequences that
decode at once, and what the drain's cache stops holding is prefilled again."""

from __future__ import annotations

from helpers import FreeCost

from policies.cluster import GenerationPool
from policies.decode_estimate import InstanceDecode
from policies.protocols import Device
from policies.stage_model import StageModel


class UnitCost(FreeCost):
    """Decode step = 1 s whatever the batch and context."""

    def decode_step_s(self, device: Device, batch_size: int, context_tokens: int) -> float:
        return 1.0


def _decode(kv_tokens: int | None, recompute=None) -> InstanceDecode:
    # outputs of 10 tokens, no prompt: a slot's mean context is 10² / (2 · 10) = 5 tokens
    return InstanceDecode(UnitCost(), Device("H800", 1), 0.0, [10] * 100, kv_tokens, recompute)


def test_the_full_phase_runs_what_the_cache_holds():
    # 8 queued requests of 10 tokens on 8 slots: 10 steps; a cache of 20 tokens holds 4
    # slots of 5 tokens, so 20 steps
    assert [_decode(kv).full_s(8, 8) for kv in (None, 40, 20)] == [10.0, 10.0, 20.0]


def test_the_drain_runs_what_the_cache_holds_and_recomputes_the_rest():
    calls = []

    def recompute_s(num_seqs: int, context_tokens: float) -> float:
        calls.append((num_seqs, context_tokens))
        return 3.0

    # 4 sequences of 10 tokens, mean context 5: a cache of 10 tokens runs 2 at a time (40
    # tokens in 20 steps) and the 2 it cannot hold are prefilled again at 5 tokens each
    assert _decode(None, recompute_s).drain_s(4, 4) == 10.0
    assert _decode(20, recompute_s).drain_s(4, 4) == 10.0
    assert calls == []
    assert _decode(10, recompute_s).drain_s(4, 4) == 23.0
    assert calls == [(2, 5.0)]


def test_stage_model_asks_the_kv_cache_of_the_pool():
    class Cache:
        def kv_tokens(self, pool: GenerationPool) -> int:
            return 20

    pool = GenerationPool(num_gpus=8, max_num_seqs=8)
    # 4 instances of 16 requests on 8 slots: 8 · 10 / 8 + 10 = 20 s; a cache of 20 tokens
    # runs 4 of them at a time, so both phases take twice the steps
    m = StageModel(UnitCost(), 64, 0.0, [10] * 100)
    assert m.generation_s(pool, 4) == 20.0
    m.kv_cache = Cache()
    assert m.generation_s(pool, 4) == 40.0
