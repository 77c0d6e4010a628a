"""A live run's CPU timeline rows reach ``cpu_timeline.csv`` as they are measured
(runtime.cpu_rows_file): a part stopped before its save, by SIGKILL too, leaves them to the
part that resumes it, in the format the run's save writes."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from proc_view import wait_until

from runtime.cpu_rows_file import CpuRowsFile
from runtime.run_dir import RunDir

REPO = Path(__file__).resolve().parents[1]
CONFIG = REPO / "experiments" / "configs" / "live-tiny.yaml"
# a first part's rows: two before the checkpoint the next part resumes from (2.0 s), one
# after it (that part was stopped past its checkpoint: the resume measures that time again)
FIRST = [{"start_s": t, "end_s": t + 1.0, "actor": 0.5, "trainer": 0.25, "total": 0.75}
         for t in (0.0, 1.0, 2.0)]  # fmt: skip

# a part resumed at step 2, 2.0 s into the run, measuring its CPU every 0.02 s; its actor
# loop never ends: the test kills it with SIGKILL
KILLED_PART = """
import asyncio, os, sys, time
from pathlib import Path
from policies.spec import load_spec
from runtime import live_run
from runtime.run_dir import RunDir
from runtime.supervisor import Servers

class Actor:
    def __init__(self):
        self.t0 = time.monotonic()
    def now(self):
        return 2.0 + time.monotonic() - self.t0
    async def push_now(self, version):
        pass
    async def run(self):
        print("running", flush=True)
        await asyncio.sleep(3600)

class Trainer:
    pid = None

spec = load_spec(Path(sys.argv[2]), ["live.cpu_sample_s=0.02"])
cpu_file = RunDir(Path(sys.argv[1])).cpu_rows_file(2, 2.0)
run = live_run._run_clocked(spec, Actor(), Trainer(), Servers([], "token"), 2, True, cpu_file)
asyncio.run(run)
"""


def _part_rows(out: Path) -> list[dict]:
    path = out / "cpu_timeline.csv"
    return [r for r in pd.read_csv(path).to_dict("records") if r["start_s"] >= 2.0]


def test_a_part_killed_with_sigkill_leaves_its_cpu_rows_for_the_resume(tmp_path):
    """Before: a part wrote its rows at its end, or as SIGTERM or Ctrl-C stopped it; a
    SIGKILLed one left none (a resumed pipeline run's stopped part lost them all)."""
    out = tmp_path / "run"
    out.mkdir()
    pd.DataFrame(FIRST).to_csv(out / "cpu_timeline.csv", index=False)
    part = subprocess.Popen(
        [sys.executable, "-c", KILLED_PART, str(out), str(CONFIG)], cwd=REPO,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        started = part.stdout.readline().strip()
        assert started == "running", part.stderr.read()
        written = wait_until(lambda: len(_part_rows(out)) >= 3, 60)
    finally:
        part.kill()
        part.wait()
    assert written, "the part's rows never reached cpu_timeline.csv while it ran"
    rows = RunDir(out).earlier_part(next_step=10, time_s=math.inf).cpu_rows
    mine = rows[2:]
    assert rows[:2] == [{**r, "other": pytest.approx(math.nan, nan_ok=True)} for r in FIRST[:2]]
    assert len(mine) >= 3 and all(math.isnan(r["trainer"]) for r in mine)  # no trainer
    assert all(a["end_s"] == b["start_s"] for a, b in zip(mine, mine[1:]))  # no gap
    assert mine[0]["start_s"] == pytest.approx(2.0, abs=0.5)
    assert all(r["actor"] >= 0 and r["other"] >= 0 for r in mine)


def test_the_file_is_the_csv_the_runs_save_writes(tmp_path):
    """Appended rows, a row with a new column (the file rewritten under the wider header)
    and rows without one: byte for byte what ``RunResult.save`` writes of the same rows."""
    path = tmp_path / "cpu_timeline.csv"
    rows = [
        {"start_s": 2.0, "end_s": 2.1, "actor": 0.1234, "trainer": 1.0, "total": 1.1234},
        {"start_s": 2.1, "end_s": 2.2, "actor": 0.0, "trainer": 0.9876, "total": 0.9876},
        {"start_s": 2.2, "end_s": 2.3, "actor": 1e-05, "trainer": 0.5, "frontend": 0.25,
         "total": 0.75001},
        {"start_s": 2.3, "end_s": 2.31, "actor": 0.3, "trainer": 0.7, "total": 1.0},
    ]  # fmt: skip
    written = CpuRowsFile(path, FIRST[:2])
    for row in rows:
        written.append(row)
    written.close()
    assert path.read_text() == pd.DataFrame(FIRST[:2] + rows).to_csv(index=False)
