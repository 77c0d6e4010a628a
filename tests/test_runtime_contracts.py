"""Typed contracts between stages: the checkpoint's data position, the trainer's methods,
resource names and the one list of metric names."""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing as mp
import threading
from typing import Any

from helpers import completion, request

from policies.records import SampleRecord, Span, SpanKind, StepStats
from policies.resources import TRAINER, generation_resource, instance_of, is_link, link_resource
from policies.results import METRIC_NAMES, SUMMARY_METRICS, compute_metrics
from runtime.recorder import DataPosition, Recorder
from runtime.trainer_proc import PushResult, TrainerProcess, serve


def _recorder() -> Recorder:
    rec = Recorder()
    for i in range(4):
        rec.sent(0, 0.1 * i)
        rec.completion(completion(request(i), 0, 1.0 + i))
        rec.returned(0, 1.0 + i, 0)
    rec.trained([0, 1], step=0)
    rec.trained([2], step=1)
    rec.span(TRAINER, SpanKind.TRAIN, 1.0, 2.0, iteration=0)
    rec.steps.append({"step": 0, "busy_s": 0.5})
    return rec


def test_a_data_position_holds_what_was_trained_by_its_step_and_round_trips():
    position = _recorder().journal_delta(step=0, time_s=9.5)
    assert (position.next_step, position.time_s) == (1, 9.5)
    assert [s.sample_id for s in position.samples] == [0, 1]  # not sample 2 (step 1)
    assert all(isinstance(s, SampleRecord) for s in position.samples)
    assert {s.resource for s in position.spans} == {TRAINER, generation_resource(0)}
    again = DataPosition.from_dict(position.to_dict())
    assert again == position
    resumed = Recorder.resumed(again)
    assert resumed.step_offset == 1
    assert sorted(resumed.samples) == [0, 1] and resumed.spans == position.spans
    assert resumed.steps == [{"step": 0, "busy_s": 0.5}]


class FakePipe:
    """The parent's end of the trainer's pipe: records calls, answers from a script."""

    def __init__(self, *answers: object) -> None:
        self.sent: list = []
        self.answers = list(answers)

    def send(self, msg) -> None:
        self.sent.append(msg)

    def recv(self):
        return True, self.answers.pop(0)


def test_the_trainer_process_has_typed_methods_over_its_pipe():
    proc = TrainerProcess(config=None)  # type: ignore[arg-type] - never started
    stats = StepStats(3, 4, 8, 100, 0.0, 1.0, busy_s=0.7)
    position = _recorder().journal_delta(0, 2.0)
    proc._conn = FakePipe(None, position.to_dict(), stats, None)

    async def script():
        assert await proc.initialise("nowhere.pt") is None
        assert await proc.initialise("last.pt") == position  # a typed position, not a dict
        assert await proc.step(3, 1.0) == stats
        await proc.checkpoint("last.pt", position)

    asyncio.run(script())
    assert [name for name, _ in proc._conn.sent] == [
        "initialise",
        "initialise",
        "step",
        "checkpoint",
    ]
    assert proc._conn.sent[3][1] == ("last.pt", position.to_dict())  # plain data in the file


class SlowTrainWorker:
    """A trainer worker whose train call runs until released, with a push answered."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.answered = PushResult(5, [0.01], [{"load_ms": 1.0}])

    def train(self, items, now_s: float) -> float:
        assert self.release.wait(30), "never released"
        return 1.5

    def answers_ready(self) -> bool:
        return True

    def push_answers(self) -> PushResult:
        return self.answered


def _served_slow_trainer() -> tuple[SlowTrainWorker, TrainerProcess, Any, threading.Thread]:
    """A :class:`SlowTrainWorker` served on a thread, and the client wired to its pipes."""
    worker = SlowTrainWorker()
    conn, child = mp.Pipe()
    answers, answers_child = mp.Pipe()
    server = threading.Thread(target=serve, args=(child, answers_child, worker), daemon=True)
    server.start()
    proc = TrainerProcess(config=None)  # type: ignore[arg-type] - the pipes are set by hand
    proc._conn, proc._answers_conn = conn, answers
    return worker, proc, conn, server


def test_push_answers_are_read_while_a_train_call_runs():
    """The servers' answers to a push must not wait for the micro-batch being trained: the
    next batch's dispatch waits for them (docs/live-throughput.md, eleventh session)."""
    worker, proc, conn, server = _served_slow_trainer()

    async def script() -> None:
        training = asyncio.create_task(proc.train([], 0.0))
        await asyncio.sleep(0.05)
        result = await asyncio.wait_for(proc.push_answers(), timeout=10)
        assert result == worker.answered
        assert not training.done()  # the answers came while the train call still ran
        worker.release.set()
        assert await training == 1.5

    asyncio.run(script())
    conn.send(None)  # the serving loop ends
    server.join(10)
    assert not server.is_alive()


def test_resource_names_are_spelled_in_one_place():
    assert generation_resource(3) == "gen-3" and instance_of("gen-3") == 3
    assert link_resource("dc0", "dc1") == "link-dc0-dc1" and is_link("link-dc0-dc1")
    assert TRAINER == "trainer"


def test_compute_metrics_reports_exactly_the_listed_metrics_in_order():
    spans = [Span(generation_resource(0), SpanKind.DECODE, 0.0, 1.0, 0, 1)]
    metrics = compute_metrics([], spans, 2.0, {generation_resource(0): (0.0, 2.0)}, False, 1, None)
    assert tuple(metrics) == METRIC_NAMES
    assert set(SUMMARY_METRICS) < set(METRIC_NAMES)


def test_the_run_ends_without_waiting_for_a_trainer_call_it_gave_up_on():
    """A stop out of live.stop_grace_s gives up on the trainer's job in progress; before, its
    pipe call ran in asyncio's default pool, which the event loop's end waits for: the run
    could not end before the trainer answered (the teardown then kills the trainer)."""
    worker, proc, conn, server = _served_slow_trainer()

    async def script() -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(proc.train([], 0.0), timeout=0.1)

    # a run that waited for the call would end only after this stand-in for the teardown's
    # SIGKILL released it: the order, not a time, is what the test checks
    teardown = threading.Timer(120, worker.release.set)
    teardown.start()
    asyncio.run(script())
    assert not worker.release.is_set()
    teardown.cancel()
    worker.release.set()  # as the teardown's SIGKILL would end the call
    conn.send(None)
    server.join(10)
    assert not server.is_alive()
