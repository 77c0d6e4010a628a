"""Weight pushes over a cross-datacenter link: one at a time at its full bandwidth, and a
push made obsolete by a newer one before it started is never sent (``sim.links``)."""

from __future__ import annotations

import simpy

from experiments.specs import config_path
from policies.records import Span
from policies.spec import load_spec
from sim.links import LinkPush, Links
from sim.simulator import Simulation
from sim.ticks import to_seconds, to_ticks

# streamrl-7b with its generation in dc1 behind a 1 Gbps link: a push (~122 s) outlasts
# a training step, so pushes pile up on the link
CROSS_DC = ["run.iterations=4", "algorithm.batch_size=32", "workload.max_output_tokens=500",
            "cluster.generation.0.datacenter=dc1", "cluster.network.inter_dc_gbps=1"]  # fmt: skip


def _link_spans(mode: str, *overrides: str) -> list[Span]:
    spec = load_spec(config_path("streamrl-7b"), [*CROSS_DC, f"pipeline.mode={mode}", *overrides])
    return [s for s in Simulation(spec).run().spans if s.resource == "link-dc0-dc1"]


def test_pushes_on_one_link_go_one_at_a_time_and_an_obsolete_one_is_never_sent():
    env = simpy.Environment()
    spans: list[Span] = []
    log: list[tuple[int, float]] = []
    links = Links(env, spans.append)

    def push(version: int) -> bool:
        deliver = lambda: log.append((version, to_seconds(env.now)))  # noqa: E731
        return links.send(LinkPush("link-dc0-dc1", version, 10.0, deliver))

    def trainer():  # noqa: ANN202 - SimPy process
        assert push(1)  # the link is free: the caller delivers at once
        yield env.timeout(to_ticks(1.0))
        assert not push(2)  # behind version 1
        yield env.timeout(to_ticks(1.0))
        assert not push(3)  # makes version 2 obsolete before it started

    env.process(trainer())
    env.run()
    assert log == [(3, 10.0)]
    assert [(s.start_s, s.end_s, s.iteration) for s in spans] == [(0.0, 10.0, 0), (10.0, 20.0, 2)]


def test_pipeline_pushes_never_overlap_on_a_slow_link():
    # a step on 2 trainer GPUs takes less than a push (~122 s), so pushes pile up and step
    # 1's is overtaken by step 2's
    # (a fixed split: what balanced picks is not what this test is about)
    split = ("policies.allocation=fixed", "cluster.trainer.num_gpus=2")
    spans = _link_spans("pipeline", "pipeline.max_lag=4", *split)
    assert len(spans) >= 2
    for before, after in zip(spans, spans[1:]):
        assert after.start_s >= before.end_s  # one transfer at a time: never over 1 Gbps
    assert [s.iteration for s in spans] == [0, 2]  # step 1's weights were overtaken by step 2's


def test_stream_async_pushes_never_overlap_on_a_slow_link():
    spans = _link_spans("stream-async")
    assert [s.iteration for s in spans] == [0, 1, 2]
    for before, after in zip(spans, spans[1:]):
        assert after.start_s >= before.end_s


def test_a_lone_push_still_takes_its_full_transfer_time():
    weight_bytes = 7.6e9 * 2  # Qwen2.5-7B in bf16, roughly: one push over 1 Gbps ~ 122 s
    first = _link_spans("stream-async")[0]
    assert 0.9 * weight_bytes * 8 / 1e9 < first.end_s - first.start_s < 1.1 * weight_bytes * 8 / 1e9
