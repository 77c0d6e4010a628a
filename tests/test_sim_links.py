"""Weight pushes over a cross-datacenter link: one at a time at its full bandwidth, and a
push made obsolete by a newer one before it started is never sent (``sim.links``)."""

from __future__ import annotations

import simpy

from experiments.specs import config_path
from policies.records import Span, SpanKind
from policies.resources import is_generation
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

    def push(version: int) -> None:
        deliver = lambda: log.append((version, to_seconds(env.now)))  # noqa: E731
        links.send(LinkPush("link-dc0-dc1", version, 10.0, deliver))

    def trainer():  # noqa: ANN202 - SimPy process
        push(1)  # the link is free: it starts now and is through at 10 s
        yield env.timeout(to_ticks(1.0))
        push(2)  # behind version 1
        yield env.timeout(to_ticks(1.0))
        push(3)  # makes version 2 obsolete before it started

    env.process(trainer())
    env.run()
    assert log == [(1, 10.0), (3, 20.0)]  # each handed over when through the link
    assert [(s.start_s, s.end_s, s.iteration) for s in spans] == [(0.0, 10.0, 0), (10.0, 20.0, 2)]


def test_pipeline_pushes_never_overlap_on_a_slow_link():
    # a step on 2 trainer GPUs takes far less than a push (~122 s), so pushes pile up and
    # those overtaken while they waited are never sent (a fixed split: what balanced picks
    # is not what this test is about)
    split = ("policies.allocation=fixed", "cluster.trainer.num_gpus=2", "run.iterations=8")
    spans = _link_spans("pipeline", "pipeline.max_lag=4", *split)
    assert len(spans) >= 2
    for before, after in zip(spans, spans[1:]):
        assert after.start_s >= before.end_s  # one transfer at a time: never over 1 Gbps
    assert [s.iteration for s in spans] == [0, 4, 5]  # steps 1-3's weights were overtaken


def test_instances_behind_a_slow_link_generate_while_the_weights_cross():
    """An instance that updates in flight pauses only to load weights that are through the
    link; before, it paused for the whole crossing, so a faster trainer, pushing sooner,
    stalled generation longer (4 steps: 249 s on 2 trainer GPUs, 371 s on 16)."""
    overrides = [*CROSS_DC, "pipeline.mode=pipeline", "pipeline.max_lag=4",
                 "policies.allocation=fixed", "run.iterations=8"]  # fmt: skip
    result = Simulation(load_spec(config_path("streamrl-7b"), overrides)).run()
    link = next(s for s in result.spans if s.resource == "link-dc0-dc1")
    generation = [s for s in result.spans if is_generation(s.resource)]
    pauses = [s.end_s - s.start_s for s in generation if s.kind == SpanKind.WEIGHT_SYNC]
    assert pauses and max(pauses) < 0.1 * (link.end_s - link.start_s)  # a load, not a crossing
    assert any(
        s.kind == SpanKind.DECODE and link.start_s < s.start_s < link.end_s for s in generation
    )
    fewer = load_spec(config_path("streamrl-7b"), [*overrides, "cluster.trainer.num_gpus=2"])
    assert result.metrics["makespan_s"] <= Simulation(fewer).run().metrics["makespan_s"]


def test_stream_async_pushes_never_overlap_on_a_slow_link():
    spans = _link_spans("stream-async")
    assert [s.iteration for s in spans] == [0, 1, 2]
    for before, after in zip(spans, spans[1:]):
        assert after.start_s >= before.end_s


def test_a_lone_push_still_takes_its_full_transfer_time():
    weight_bytes = 7.6e9 * 2  # Qwen2.5-7B in bf16, roughly: one push over 1 Gbps ~ 122 s
    first = _link_spans("stream-async")[0]
    assert 0.9 * weight_bytes * 8 / 1e9 < first.end_s - first.start_s < 1.1 * weight_bytes * 8 / 1e9


def test_a_push_still_crossing_when_the_run_ends_is_cut_there():
    result = Simulation(
        load_spec(config_path("streamrl-7b"), [*CROSS_DC, "pipeline.mode=stream-async"])
    ).run()
    end_s = result.metrics["makespan_s"]
    link = [s for s in result.spans if s.resource == "link-dc0-dc1"]
    assert max(s.end_s for s in result.spans) <= end_s
    assert link[-1].end_s == end_s  # the last push was still on the link
    assert all(110 < s.end_s - s.start_s < 135 for s in link[:-1])  # the others whole (~122 s)
