"""The generation cores lent to the trainer while no request runs (runtime.core_loan)."""

from __future__ import annotations

import asyncio
import multiprocessing as mp
import os
from pathlib import Path

from sharded_harness import make_model_dir

from experiments.specs import config_path
from policies.spec import load_spec
from runtime import launcher
from runtime.core_loan import CoreLoan
from runtime.recorder import Recorder
from runtime.trainer import TrainerConfig, TrainItem
from runtime.trainer_proc import TrainerProcess


def _cpus(text: str) -> set[int]:
    """``0-1,3`` as {0, 1, 3} (``Cpus_allowed_list`` of /proc/<pid>/task/<tid>/status)."""
    out: set[int] = set()
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        out.update(range(int(lo), int(hi or lo) + 1))
    return out


def _thread_cores(pid: int) -> list[set[int]]:
    """The cores each thread of ``pid`` may run on."""
    out = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        for line in (task / "status").read_text().splitlines():
            if line.startswith("Cpus_allowed_list:"):
                out.append(_cpus(line.split(":", 1)[1].strip()))
    return out


def _items(n: int) -> list[TrainItem]:
    return [TrainItem(i, (3, 4, 5), (6,) * 12, (-1.0,) * 12, 0.5, 1.0, 0) for i in range(n)]


def test_the_trainer_runs_on_every_core_only_while_generation_idles(tmp_path):
    every = sorted(os.sched_getaffinity(0))
    assert len(every) >= 2, "this test needs a host of two cores or more"
    own = every[-1:]
    loan = CoreLoan(own, every, mp.get_context("spawn"))
    config = TrainerConfig(make_model_dir(tmp_path), batch_size=8, micro_batch_samples=4)
    trainer = TrainerProcess(config, own, loan=loan)
    trainer.start()
    try:

        async def run() -> list[list[set[int]]]:
            await trainer.initialise(None)
            seen = [_thread_cores(trainer.pid)]  # after the warm-ups: back on its own core
            trainer.generation_idle(True)
            await trainer.train(_items(8), 0.0)
            seen.append(_thread_cores(trainer.pid))
            trainer.generation_idle(False)
            await trainer.train(_items(8), 0.0)
            seen.append(_thread_cores(trainer.pid))
            return seen

        before, idle, busy = asyncio.run(run())
    finally:
        trainer.stop()
    assert all(cores == set(own) for cores in before)
    assert all(cores == set(every) for cores in idle)  # torch's threads too
    assert all(cores == set(own) for cores in busy)


def test_the_recorder_says_when_generation_idles_and_when_it_resumes():
    recorder, calls = Recorder(), []
    recorder.on_generation_idle = calls.append
    recorder.sent(0, 0.0)  # the first request: busy
    recorder.sent(1, 0.1)
    recorder.sent(0, 0.2)
    recorder.returned(0, 0.3, 0)
    recorder.returned(1, 0.4, 0)  # server 0 still runs one
    assert calls == [False]
    recorder.returned(0, 0.5, 0)  # none runs anywhere
    assert calls == [False, True]
    recorder.sent(1, 0.6)
    assert calls == [False, True, False]


def test_the_launcher_lends_only_cores_of_its_own_to_a_trainer_that_counts_its_threads(
    monkeypatch,
):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1})
    live = config_path("live-longtail")

    def loan(*sets: str, train_cores: tuple[int, ...] = (1,)) -> CoreLoan | None:
        return launcher._core_loan(load_spec(live, list(sets)), list(train_cores))

    lent = loan("pipeline.mode=disagg-sync")
    assert lent is not None and (lent.own, lent.every) == ([1], [0, 1])
    assert loan("live.lend_idle_cores=false") is None
    assert loan("live.trainer_threads=1") is None
    assert loan("live.server_urls=[http://127.0.0.1:9]") is None
    assert loan("live.device=cuda") is None
    assert loan("pipeline.mode=colocated-sync", train_cores=(0, 1)) is None  # has them all
