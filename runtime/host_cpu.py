"""CPU seconds from /proc: of a server's processes, its engine (the scheduler and model
worker, pinned to the server's cores) and its HTTP frontend (on any core); of a live
run's processes by role (``cpu_ms_per_sample_*`` in a live run's ``metrics.json``).

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


def run_pids_by_role(trainer_pid: int | None, server_pids: list[int]) -> dict[str, list[int]]:
    """This run's processes on this host, by role: ``actor`` (this process), ``trainer``
    (its process tree), ``frontend`` (each server's leader), ``engine`` (the processes below
    the leaders: engine core, model worker) and ``other`` (any other process below this
    one). Processes that are not below this one (attached servers, Ray actors) are left
    out; so is a role with no process."""
    mine = descendants(os.getpid())
    out = {"actor": [os.getpid()]}
    known: set[int] = set()
    if trainer_pid is not None and trainer_pid in mine:
        out["trainer"] = [trainer_pid, *descendants(trainer_pid)]
        known.update(out["trainer"])
    leaders = [p for p in server_pids if p in mine]
    if leaders:
        out["frontend"] = leaders
        out["engine"] = [q for p in leaders for q in descendants(p)]
        known.update(leaders, out["engine"])
    out["other"] = [p for p in mine if p not in known]
    return out


def run_cpu_by_role(trainer_pid: int | None, server_pids: list[int]) -> dict[str, float]:
    """CPU seconds so far of this run's processes on this host, by the roles of
    :func:`run_pids_by_role`."""
    roles = run_pids_by_role(trainer_pid, server_pids)
    return {role: sum(cpu_seconds(p) for p in pids) for role, pids in roles.items()}


def cpu_use_metrics(
    before: dict[str, float], after: dict[str, float], num_samples: int, wall_s: float
) -> dict[str, float]:
    """``cpu_cores_used`` over ``wall_s`` and ``cpu_ms_per_sample`` (all roles, and each
    role's ``cpu_ms_per_sample_<role>``) between two :func:`run_cpu_by_role` snapshots."""
    used = {role: max(0.0, after[role] - before[role]) for role in after if role in before}
    if num_samples <= 0 or wall_s <= 0:
        return {}
    out = {"cpu_cores_used": sum(used.values()) / wall_s,
           "cpu_ms_per_sample": 1000 * sum(used.values()) / num_samples}  # fmt: skip
    out.update({f"cpu_ms_per_sample_{r}": 1000 * s / num_samples for r, s in used.items()})
    return out
