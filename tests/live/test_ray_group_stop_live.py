"""``tandem run --live --ray`` stopped by SIGTERM to its whole process group (``timeout``,
Slurm, systemd): the command's own Ray runs in a session of its own
(``runtime.ray_session.ray_in_its_own_session``), so the driver alone gets the signal and
stops as a SIGTERM to it alone does. Before: the signal killed Ray's GCS and raylet under
the driver, which hung 60 s, then exited 1 (``Failed to connect to GCS within 60
seconds``) with no resume line and no stop record in ``run.log``."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
from pathlib import Path

import pytest
from helpers import TANDEM
from proc_view import wait_until

pytestmark = pytest.mark.live

REPO = Path(__file__).resolve().parents[2]
# a hang guard, not a timing claim: the old code exited 1 after its 60 s hang, with no
# resume line, which the assertions below refuse; the stop itself takes seconds
STOP_WITHIN_S = 180


@pytest.mark.timeout(600)
def test_sigterm_to_the_whole_group_of_a_ray_run_stops_it_with_its_resume_line(tmp_path):
    out = tmp_path / "run"
    cmd = [*TANDEM, "run", "live-tiny", "--live", "--ray", "--out", str(out),
           "--set", "run.iterations=300"]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen(
        cmd, cwd=REPO, env=env, start_new_session=True, stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL, text=True,
    )  # fmt: skip
    try:
        assert wait_until(lambda: _num_steps(out) >= 3 or proc.poll() is not None, 400)
        assert proc.poll() is None, "the run ended before it was stopped"
        os.killpg(proc.pid, signal.SIGTERM)  # the command and every process in its group
        printed, _ = proc.communicate(timeout=STOP_WITHIN_S)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    assert proc.returncode == 143, printed
    assert f"terminated; resume with: tandem run {out}/spec.yaml --live --ray" in printed
    assert "the run stopped: RunInterrupted: stopped by SIGTERM" in _log(out)


def _num_steps(out: Path) -> int:
    """The steps whose line the run's log holds."""
    return len(re.findall(r"tracking: step \d+:", _log(out)))


def _log(out: Path) -> str:
    path = out / "run.log"
    return path.read_text() if path.exists() else ""
