"""An engine that holds requests and stops stepping is told apart (runtime/engine_watch.py)."""

from __future__ import annotations

import asyncio

import pytest

from runtime.engine_watch import EngineWatch, stall_s_from_env


class _Processor:
    def __init__(self) -> None:
        self.unfinished = 0

    def process_outputs(self, outputs, *args, **kwargs):
        return outputs

    def get_num_unfinished_requests(self) -> int:
        return self.unfinished


class _Engine:
    def __init__(self) -> None:
        self.output_processor = _Processor()
        self.added: list[str] = []

    async def add_request(self, request_id: str, *args, **kwargs) -> str:
        self.added.append(request_id)
        return request_id

    async def abort(self, request_id: str, internal: bool = False) -> None:
        self.output_processor.unfinished -= 1


def test_stalled_only_while_holding_requests_without_a_step_or_a_new_request():
    now = [100.0]
    engine = _Engine()
    watch = EngineWatch(engine, stall_s=60.0, clock=lambda: now[0])
    now[0] += 600  # idle for ten minutes, holding nothing: not stalled
    assert watch.stalled_for() is None
    asyncio.run(engine.add_request("r1"))  # a request comes: the clock starts from it
    engine.output_processor.unfinished = 1
    assert engine.added == ["r1"] and watch.stalled_for() is None
    now[0] += 30
    assert engine.output_processor.process_outputs(["out"]) == ["out"]  # a step
    assert watch.steps == 1
    now[0] += 59
    assert watch.stalled_for() is None
    now[0] += 2  # 61 s since its last step, one request held
    assert watch.stalled_for() == pytest.approx(61.0)
    watch.touch()  # a weight update's pause ended
    assert watch.stalled_for() is None
    engine.output_processor.unfinished = 0
    now[0] += 600
    assert watch.stalled_for() is None


def test_a_stall_seen_lasts_until_a_step_though_its_requests_were_taken_away():
    """Seen live: a run's stream to a hung engine timed out and closed, which aborted its
    requests; the server then answered /health 200 and was taken for alive."""
    now = [0.0]
    engine = _Engine()
    watch = EngineWatch(engine, stall_s=60.0, clock=lambda: now[0])
    engine.output_processor.unfinished = 2
    now[0] += 61
    assert watch.stalled_for() == pytest.approx(61.0)
    engine.output_processor.unfinished = 0  # the client gave up: its requests aborted
    now[0] += 5
    assert watch.stalled_for() == pytest.approx(66.0)
    watch.touch()  # a pause it answered: alive
    assert watch.stalled_for() is None
    engine.output_processor.unfinished = 1  # stalled again; nobody asks /health until the
    now[0] += 61  # client gives up and aborts (vLLM's generator calls engine.abort)
    asyncio.run(engine.abort("r"))
    assert engine.output_processor.unfinished == 0
    assert watch.stalled_for() == pytest.approx(61.0)
    asyncio.run(engine.add_request("again"))  # a new request does not show it alive
    engine.output_processor.unfinished = 1
    assert watch.stalled_for() == pytest.approx(61.0)
    engine.output_processor.process_outputs([])  # it stepped: alive again
    engine.output_processor.unfinished = 0
    now[0] += 600
    assert watch.stalled_for() is None


def test_an_engine_without_an_output_processor_is_never_stalled():
    watch = EngineWatch(object(), stall_s=1.0, clock=lambda: 1e9)
    assert watch.stalled_for() is None and watch.steps == 0


@pytest.mark.parametrize("raw", ["0", "-1", "soon"])
def test_a_bad_stall_setting_is_named(monkeypatch, raw):
    monkeypatch.setenv("TANDEM_STALL_S", raw)
    with pytest.raises(ValueError, match=f"TANDEM_STALL_S='{raw}': expected seconds > 0"):
        stall_s_from_env()
