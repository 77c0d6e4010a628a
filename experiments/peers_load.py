"""Other load on the host while a benchmark run runs, from /proc/stat and rusage.

The host's busy CPU time (``/proc/stat``: user, nice, system, irq, softirq and steal,
every core) minus the CPU time of the benchmark's own process tree (this process and
every descendant reaped, ``RUSAGE_SELF`` + ``RUSAGE_CHILDREN``) is what *other* load
took during the run. Measured around one run, after its subprocess has exited and been
reaped, so the run's whole tree is counted as our own.

A descendant whose parent exits without waiting for it (vLLM's engine processes, when a
server is stopped) would take its CPU time with it: the benchmark process makes itself
the child subreaper (``PR_SET_CHILD_SUBREAPER``), so such orphans become its children,
and :func:`reap_orphans` waits for them after each run. Without that, a quarter of a
tandem run's CPU time went missing and counted as other load. Known bias: the kernel's
own background work counts as other load, as does any orphan still running when the
run is measured; both err towards rejecting a quiet run, never towards accepting a
busy one. Steal time (a hypervisor running other guests) counts as other load.
"""

from __future__ import annotations

import ctypes
import logging
import os
import resource
import time
from dataclasses import dataclass
from pathlib import Path

BUSY_FIELDS = (0, 1, 2, 5, 6, 7)  # user nice system (idle iowait) irq softirq steal
MAX_OTHER_SHARE = 0.10  # of the host's CPU capacity; above it a run is disturbed
PR_SET_CHILD_SUBREAPER = 36  # linux/prctl.h
REAP_TIMEOUT_S = 5.0

log = logging.getLogger(__name__)


@dataclass(slots=True, frozen=True)
class CpuSnapshot:
    """CPU times at one moment, seconds."""

    wall_s: float
    host_busy_s: float  # every core, every process, since boot
    own_s: float  # this process and its reaped descendants


@dataclass(slots=True, frozen=True)
class RunLoad:
    """CPU accounting of one run: how much of the host other processes took."""

    wall_s: float
    host_busy_s: float
    own_s: float
    num_cpus: int

    @property
    def other_s(self) -> float:
        return max(0.0, self.host_busy_s - self.own_s)

    @property
    def other_share(self) -> float:
        """Other load as a share of the host's capacity over the run (0 to 1)."""
        capacity_s = self.wall_s * self.num_cpus
        return self.other_s / capacity_s if capacity_s > 0 else 0.0


def parse_host_busy_s(proc_stat: str, clock_ticks: int) -> float:
    """Busy seconds of every core from the text of ``/proc/stat`` (its ``cpu`` line)."""
    for line in proc_stat.splitlines():
        fields = line.split()
        if fields and fields[0] == "cpu":
            values = [int(v) for v in fields[1:]]
            return sum(values[i] for i in BUSY_FIELDS if i < len(values)) / clock_ticks
    raise ValueError("no aggregate 'cpu' line in /proc/stat")


def own_cpu_s() -> float:
    """User + system seconds of this process and of every child it has reaped."""
    total = 0.0
    for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN):
        usage = resource.getrusage(who)
        total += usage.ru_utime + usage.ru_stime
    return total


def become_subreaper() -> bool:
    """Make orphaned descendants children of this process (Linux); False if refused."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        ok = libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        ok = False
    if not ok:
        log.warning("not a child subreaper: orphaned processes' CPU counts as other load")
    return ok


def reap_orphans(timeout_s: float = REAP_TIMEOUT_S) -> int:
    """Wait for children that exited (adopted orphans); stop when none are left or after
    ``timeout_s``. Call only when no child of our own (a ``Popen``) is still running.
    Returns how many were reaped."""
    reaped = 0
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return reaped  # no children left
        if pid:
            reaped += 1
        else:
            time.sleep(0.05)  # a child still runs: an orphan finishing its exit
    log.warning("children still running %.0f s after a run; counted as other load", timeout_s)
    return reaped


def snapshot() -> CpuSnapshot:
    text = Path("/proc/stat").read_text()
    return CpuSnapshot(
        time.perf_counter(), parse_host_busy_s(text, os.sysconf("SC_CLK_TCK")), own_cpu_s()
    )


def load_between(
    start: CpuSnapshot, end: CpuSnapshot, num_cpus: int | None = None
) -> RunLoad:  # fmt: skip
    """The load of the interval from ``start`` to ``end``."""
    return RunLoad(
        wall_s=end.wall_s - start.wall_s,
        host_busy_s=end.host_busy_s - start.host_busy_s,
        own_s=end.own_s - start.own_s,
        num_cpus=num_cpus or os.cpu_count() or 1,
    )


def disturbance(load: RunLoad, max_other_share: float = MAX_OTHER_SHARE) -> str | None:
    """Why the run counts as disturbed (one phrase), or None when it does not."""
    if load.other_share > max_other_share:
        return (
            f"other load took {load.other_share:.0%} of the CPU "
            f"({load.other_s:.1f} CPU s in {load.wall_s:.0f} s; limit {max_other_share:.0%})"
        )
    return None
