"""CPU seconds of a server's processes, from /proc: its engine (the scheduler and model
worker, pinned to the server's cores) and its HTTP frontend (on any core).

What generation takes of a host beyond its pinned engine cores is the frontend's share
(and the caller's): on a host whose every core runs an engine, that share is taken from
the engines (``experiments.policy_effects``)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of one process so far (0 if it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def process_age_s(pid: int | None = None) -> float:
    """Seconds since the process (this one by default) started."""
    stat = Path(f"/proc/{pid or os.getpid()}/stat").read_text().rsplit(")", 1)[1].split()
    uptime_s = float(Path("/proc/uptime").read_text().split()[0])
    return uptime_s - int(stat[19]) / os.sysconf("SC_CLK_TCK")


def descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (children, their children, ...)."""
    out, todo = [], [pid]
    while todo:
        for task in Path(f"/proc/{todo.pop()}/task").glob("*"):
            try:
                kids = [int(c) for c in (task / "children").read_text().split()]
            except OSError:
                continue
            out += kids
            todo += kids
    return out


@dataclass(frozen=True, slots=True)
class ServerCpu:
    engine_s: float  # the processes below the server's leader (engine core, model worker)
    frontend_s: float  # the leader: vLLM's HTTP frontend and tandem's routes

    def __sub__(self, earlier: ServerCpu) -> ServerCpu:
        return ServerCpu(self.engine_s - earlier.engine_s, self.frontend_s - earlier.frontend_s)


def server_cpu(leader_pid: int) -> ServerCpu:
    """CPU seconds so far of the server whose leader (frontend) is ``leader_pid``."""
    engine = sum(cpu_seconds(p) for p in descendants(leader_pid))
    return ServerCpu(engine, cpu_seconds(leader_pid))
