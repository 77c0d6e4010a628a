"""A command started with SIGINT ignored (``cmd &`` in a script: the shell starts it so)
keeps ignoring it: the run's stop handling (``runtime.graceful_stop.StopRequests``) and
its children's start (``runtime.lifetime.start_deaf_to``) put back what they found, and a
Ctrl-C meant for the script does not stop the run. Checked in a fresh interpreter, whose
dispositions are its own."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent(
    """
    import multiprocessing, os, signal, time
    from runtime.graceful_stop import StopRequests
    from runtime.lifetime import start_deaf_to_stop_signals

    if __name__ == "__main__":
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        with StopRequests(5.0):
            child = multiprocessing.get_context("spawn").Process(target=time.sleep, args=(0.1,))
            start_deaf_to_stop_signals(child)
            child.join()
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.2)
            print("inside", signal.getsignal(signal.SIGINT))
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.2)
        print("after", signal.getsignal(signal.SIGINT))
    """
)


def test_a_run_started_with_sigint_ignored_keeps_ignoring_it(tmp_path) -> None:
    script = tmp_path / "ignored.py"
    script.write_text(SCRIPT)
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr  # a handler raised KeyboardInterrupt: 1
    ignored = str(int(signal.SIG_IGN))
    assert done.stdout.split() == ["inside", ignored, "after", ignored]
