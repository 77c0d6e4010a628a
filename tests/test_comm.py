"""Communication in the simulator (``sim.comm``): tensor-parallel all-reduces in every
engine step and the trainer's gradient all-reduce, checked against figures computed by
hand from the ring formula ``2 (n-1)/n · bytes / bandwidth + NCCL's latency``."""

from __future__ import annotations

import json

import pytest
from helpers import small_spec, write_profile

from policies.protocols import Device
from policies.records import SpanKind
from policies.resources import TRAINER
from policies.sim_section import EfficiencySection
from sim.calibrated import CalibratedCostModel
from sim.calibration import calibrate_profile, cost_model_document
from sim.comm import Fabric
from sim.costs import RooflineCostModel, build_cost_model
from sim.models import model
from sim.simulator import Simulation
from sim.tables import hardware
from sim.ticks import StepWork, to_ticks

EFF = EfficiencySection()


def _roofline(name: str) -> RooflineCostModel:
    return RooflineCostModel(model(name), EFF, "grpo")


def _without_comm_s(cost: RooflineCostModel, device: Device, work: StepWork) -> float:
    """The step as the cost model priced it before communication: its operators' sum."""
    hw, tp = cost.hw(device.hardware), device.num_gpus
    rows = work.num_decode + work.num_prefill_tokens
    decode = cost.attention_s(hw, tp, work.decode_context_tokens, work.decode_context_tokens)
    prefill = cost.attention_s(hw, tp, work.prefill_attention_pairs, work.prefill_context_tokens)
    return EFF.step_overhead_s + cost.gemm_s(hw, tp, rows) + decode + prefill


def test_a_tp1_step_is_its_operators_and_a_tp4_decode_step_adds_its_all_reduces():
    cost = _roofline("Qwen2.5-72B")
    for hw, tp in (("H20", 1), ("H20", 4)):
        device, h = Device(hw, tp), cost.hw(hw)
        law = cost.decode_law(device, 256)
        assert law.p1 == to_ticks(cost.attention_s(h, tp, 1.0, 1.0))  # affine in context
        fixed = EFF.step_overhead_s + cost.gemm_s(h, tp, 256)
        if tp == 1:  # to the bit
            assert law.p0 == to_ticks(fixed)
            work = StepWork(256, 300_000, 512, 512 * 513 // 2, 512)
            assert cost.mixed_step_s(device, work) == _without_comm_s(cost, device, work)
            continue
        # 160 all-reduces of 256·8192·2 B: 1.5 × 4 194 304 B at 450 GB/s + 10.2 µs each
        assert (law.p0 - to_ticks(fixed)) / 1e12 == pytest.approx(160 * 24.181013e-6, rel=1e-6)


def test_a_tp8_step_with_prefill_adds_the_all_reduces_of_all_its_rows():
    cost = _roofline("Qwen2.5-72B")
    device = Device("H100-SXM", 8)
    work = StepWork(256, 400_000, 256, 256 * 257 // 2, 256)  # 512 rows
    added = cost.mixed_step_s(device, work) - _without_comm_s(cost, device, work)
    # 160 × (1.75 × 512·8192·2 B / 450 GB/s + 15.0 µs) = 160 × 47.622364 µs
    assert added == pytest.approx(160 * 47.622364e-6, rel=1e-6)


def test_a_tp_spanning_machines_pays_the_node_nic():
    spec = small_spec(
        model__name="Qwen2.5-72B", cluster__generation__0__num_gpus=16,
        cluster__generation__0__tp=16, cluster__trainer__num_gpus=16,
    )  # fmt: skip
    slow = spec.model_copy(deep=True)
    slow.cluster.network.intra_dc_gbps = 800.0  # 100 GB/s instead of 200
    device = Device("H800", 16)
    fast_law, slow_law = (build_cost_model(s).decode_law(device, 64) for s in (spec, slow))
    # 160 all-reduces of 64·8192·2 B, of which 1.875× crosses the NIC: at 100 against 200 GB/s
    extra_s = 160 * 1.875 * 64 * 8192 * 2 * (1 / 100e9 - 1 / 200e9)
    assert (slow_law.p0 - fast_law.p0) / 1e12 == pytest.approx(extra_s, rel=1e-6)


def test_gradient_all_reduce_hides_behind_a_long_backward_and_not_behind_none():
    cost = _roofline("Qwen2.5-7B")  # 15.24 GB of bf16 gradients: 582 buckets of 25 MiB
    fabric = Fabric.of(hardware("H800"), 1600.0)
    bucket_s = 15.24e9 / 582 / 200e9 + 7.8e-6  # 2 GPUs: each sends the bucket once
    assert cost.grad_sync_s(Device("H800", 2), 0, fabric) == pytest.approx(582 * bucket_s)
    # 100 000 tokens: a backward of 7.7 s, so only the last bucket is left
    assert cost.grad_sync_s(Device("H800", 2), 100_000, fabric) == pytest.approx(bucket_s)
    assert cost.grad_sync_s(Device("H800", 1), 0, fabric) == 0.0


def test_a_gradient_all_reduce_across_machines_is_slower_than_one_inside():
    cost = _roofline("Qwen2.5-7B")
    fabric = Fabric.of(hardware("H100-SXM"), 1600.0)
    bucket_bytes = 15.24e9 / 582
    inside = 582 * (1.75 * bucket_bytes / 450e9 + 15.0e-6)  # 8 GPUs over NVLink
    across = 582 * (1.875 * bucket_bytes / 200e9 + 33.0e-6)  # 16: the 200 GB/s NIC
    assert cost.grad_sync_s(Device("H100-SXM", 8), 0, fabric) == pytest.approx(inside)
    assert cost.grad_sync_s(Device("H100-SXM", 16), 0, fabric) == pytest.approx(across)
    assert across > 2 * inside


def _optimizer_job_s(num_gpus: int) -> tuple[list[float], list[dict]]:
    result = Simulation(small_spec(cluster__trainer__num_gpus=num_gpus)).run()
    spans = [
        s.end_s - s.start_s
        for s in result.spans
        if s.resource == TRAINER and s.kind == SpanKind.TRAIN and s.batch_size is None
    ]
    return spans, result.steps


def test_a_one_gpu_trainer_has_no_gradient_all_reduce_and_two_have_one():
    spans, steps = _optimizer_job_s(1)
    assert [s["grad_sync_s"] for s in steps] == [0.0, 0.0]
    assert spans == pytest.approx([s["optimizer_s"] for s in steps])
    spans, steps = _optimizer_job_s(2)
    assert all(s["grad_sync_s"] > 0 for s in steps)
    assert spans == pytest.approx([s["optimizer_s"] + s["grad_sync_s"] for s in steps])


def test_a_calibrated_model_adds_the_all_reduce_its_profile_did_not_measure(tmp_path):
    setup = {
        "model": {"name": "tiny"},
        "hardware": {"kind": "cpu", "tp": 1},
        "trainer": {"hardware": "H100-SXM", "num_gpus": 2},
    }
    profile = write_profile(tmp_path, setup)  # weight_bytes 1e6: one bucket
    document = cost_model_document(calibrate_profile(tmp_path), profile)
    (tmp_path / "cost_model.json").write_text(json.dumps(document))
    cost = CalibratedCostModel.load(tmp_path / "cost_model.json")
    fabric = Fabric.of(hardware("H100-SXM"), 1600.0)
    # 8 GPUs: 1.75e6 B / 450 GB/s + 15.0 µs; less the 2 profiled: 1e6 B / 450 GB/s + 7.8 µs
    expected = (1.75e6 / 450e9 + 15.0e-6) - (1e6 / 450e9 + 7.8e-6)
    assert cost.grad_sync_s(Device("H100-SXM", 8), 300, fabric) == pytest.approx(expected)
    assert cost.grad_sync_s(Device("H100-SXM", 2), 300, fabric) == 0.0
    assert cost.grad_sync_s(Device("H100-SXM", 8), 300, None) == 0.0
