"""A live run's crashes end in one line naming what failed, with the resume command where
the run can go on; Ctrl-C prints no trainer traceback (runtime/trainer_proc.py,
runtime/launcher.py, runtime/warm_up.py)."""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path

import httpx
import pytest
from sharded_harness import make_model_dir

import runtime.launcher as launcher
from policies.spec import load_spec
from runtime.errors import LiveRunError, TrainerFailed
from runtime.run_dir import RunDir
from runtime.supervisor import Servers
from runtime.trainer import TrainerConfig
from runtime.trainer_proc import TrainerProcess

CONFIG = Path(__file__).resolve().parents[1] / "experiments" / "configs" / "live-tiny.yaml"
WRITE_FAILED = (
    "RuntimeError: writing a checkpoint failed: PermissionError: [Errno 1] Operation not "
    "permitted: '/runs/a/checkpoints/.last.pt.l6ypqj2a'\nTraceback (most recent call last):\n"
    '  File "runtime/trainer_proc.py", line 229, in _answer\n'
)


class _Conn:
    """The trainer child's end of the pipe, answering every call with ``answer``."""

    def __init__(self, answer: tuple) -> None:
        self.answer = answer

    def send(self, msg) -> None:
        pass

    def recv(self) -> tuple:
        return self.answer


def test_a_trainer_call_that_raised_is_one_line_the_traceback_in_the_log(caplog):
    """Before: a plain RuntimeError holding the child's traceback, which the CLI did not
    catch: a 100-line traceback and no resume hint."""
    trainer = TrainerProcess(TrainerConfig("unused", batch_size=4))
    with caplog.at_level("INFO"), pytest.raises(TrainerFailed) as err:
        trainer._call_sync(_Conn((False, WRITE_FAILED)), "checkpoint")
    assert str(err.value) == f"trainer checkpoint failed: {WRITE_FAILED.splitlines()[0]}"
    assert "Traceback" in caplog.text  # kept for whoever reads run.log


def _failed_trainer_call(tmp_path: Path, monkeypatch, checkpointed: bool) -> tuple[RunDir, str]:
    class _Trainer:
        pid = 1

        def start(self) -> None:
            pass

        def stop(self, grace_s: float = 10.0) -> None:
            pass

    async def drive(*args, **kwargs) -> None:
        raise TrainerFailed("trainer checkpoint failed: RuntimeError: writing ...")

    monkeypatch.setattr(launcher, "model_dir_for", lambda spec: "unused")
    monkeypatch.setattr(launcher, "trainer_config", lambda spec, model_dir: None)
    monkeypatch.setattr(launcher, "TrainerProcess", lambda *args: _Trainer())
    monkeypatch.setattr(launcher, "_servers", lambda *args: Servers([], "token"))
    monkeypatch.setattr(launcher, "drive", drive)
    spec = load_spec(CONFIG, [])
    run_dir = RunDir(tmp_path / "run")
    run_dir.prepare(spec)
    if checkpointed:
        run_dir.checkpoint.parent.mkdir(parents=True)
        run_dir.checkpoint.write_bytes(b"a checkpoint")
    with pytest.raises(LiveRunError) as err:
        launcher._run_processes(spec, run_dir, None, None, None)
    assert not isinstance(err.value, TrainerFailed)
    return run_dir, str(err.value)


def test_a_failed_trainer_call_ends_the_run_with_the_resume_command(tmp_path, monkeypatch):
    run_dir, message = _failed_trainer_call(tmp_path, monkeypatch, checkpointed=True)
    assert message == (
        "trainer checkpoint failed: RuntimeError: writing ...; resume with: "
        f"{run_dir.resume_command()}"
    )


def test_a_run_that_fails_before_its_first_checkpoint_says_it_starts_again(tmp_path, monkeypatch):
    """Before: "resume with: ..." although no step was checkpointed to resume from."""
    run_dir, message = _failed_trainer_call(tmp_path, monkeypatch, checkpointed=False)
    assert message == (
        "trainer checkpoint failed: RuntimeError: writing ...; no step was checkpointed yet: "
        f"running it again starts from step 0: {run_dir.resume_command()}"
    )


def test_a_server_that_never_answers_the_warm_up_is_one_line_naming_it():
    """Before: httpx.ReadTimeout with two tracebacks and no word of which server."""
    from runtime.warm_up import warm_up_servers

    class _Silent:
        instance_id = 1
        base_url = "http://127.0.0.1:18399"

        async def stream(self, *args, **kwargs):
            raise httpx.ReadTimeout("")
            yield

    spec = load_spec(CONFIG, ["live.warm_up_tokens=4"])
    with pytest.raises(LiveRunError) as err:
        asyncio.run(warm_up_servers({1: _Silent()}, spec))
    assert str(err.value) == (
        "server 1 (http://127.0.0.1:18399) did not answer the warm-up batch: ReadTimeout"
    )


def _ignores_sigint(pid: int) -> bool:
    status = Path(f"/proc/{pid}/status").read_text()
    ignored = int(next(x for x in status.splitlines() if x.startswith("SigIgn:")).split()[1], 16)
    return bool(ignored & (1 << (signal.SIGINT - 1)))


def test_the_trainer_process_ignores_ctrl_c_and_still_stops_with_the_run(tmp_path):
    """Before: Ctrl-C reached the trainer child too (the whole process group), which
    printed a KeyboardInterrupt traceback of its own."""
    trainer = TrainerProcess(TrainerConfig(make_model_dir(tmp_path), batch_size=4))
    trainer.start()
    proc = trainer._proc
    try:
        assert _ignores_sigint(trainer.pid)
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # not here
    finally:
        trainer.stop()
    assert not proc.is_alive() and proc.exitcode == 0
