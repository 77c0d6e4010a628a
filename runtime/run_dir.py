"""A live run's directory: its original spec, the resume check, fault and process records.

A live run writes ``spec.yaml`` when it starts and never rewrites it. A directory that
holds a checkpoint (``checkpoints/last.pt``, or ``last.dcp`` of a run on Ray) is resumed, and only with a spec that trains
the same thing: :func:`training_changes` compares every key but the operational ones
(:data:`OPERATIONAL_KEYS`: where servers run, tokens, threads, ...), and a change is
refused naming its keys unless ``force_new_spec``, which goes on and keeps the new spec
beside the original as ``spec.resumed-N.yaml``; from then on that newest spec is the one
a resume is checked against and the one its resume command names.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from policies.results import CPU_TIMELINE_FILE, write_atomic
from policies.spec import RunSpec, SpecError, load_spec, spec_changes
from runtime.checkpoints import CHECKPOINT_DIR, LAST, LAST_SHARDED, readable
from runtime.cpu_rows_file import CpuRowsFile
from runtime.history import journal_path, journal_samples, journal_steps

SPEC = "spec.yaml"  # the run's original spec, written when it starts and never again

# keys a resumed run may change: they decide where and how the run's processes run, and
# what is recorded of it (tracking, kept checkpoints, the CPU timeline), not what is
# trained (prefixes end in "."). The weight group's backend carries the same verified
# weights; lent cores are torch threads, as live.trainer_threads
OPERATIONAL_KEYS = (
    "run.name", "run.tracking", "sim.", "live.host", "live.base_port", "live.token",
    "live.api_key", "live.server_urls", "live.num_servers", "live.restart_servers",
    "live.startup_timeout_s", "live.trainer_threads", "live.trainer_nice", "live.engine_nice",
    "live.kv_cache_gib", "live.checkpoint_every", "live.checkpoint_min_interval_s",
    "live.keep_checkpoints", "live.cpu_sample_s", "live.lend_idle_cores", "live.weight_backend",
    "live.device", "live.cost_model", "live.warm_up_tokens", "live.skip_zero_advantage",
    "live.share_prompts", "live.stop_grace_s",
)  # fmt: skip


def newest_spec(run: Path) -> Path:
    """The spec a run directory's run last ran: its highest ``spec.resumed-N.yaml``, else
    ``spec.yaml``."""
    resumed = [(int(p.stem.rsplit("-", 1)[1]), p) for p in run.glob("spec.resumed-*.yaml")
               if p.stem.rsplit("-", 1)[1].isdigit()]  # fmt: skip
    return max(resumed)[1] if resumed else run / SPEC


def _operational(change: str) -> bool:
    key = change.split(" ", 1)[0]
    return any(key == k or (k.endswith(".") and key.startswith(k)) for k in OPERATIONAL_KEYS)


def training_changes(original: RunSpec, new: RunSpec) -> list[str]:
    """``key (old → new)`` for every key that differs and alters training."""
    return [c for c in spec_changes(original, new) if not _operational(c)]


@dataclass(slots=True, frozen=True)
class EarlierPart:
    """A resumed run's earlier parts, as they saved them: ``steps.json`` records and
    ``cpu_timeline.csv`` rows."""

    steps: list[dict[str, Any]]
    cpu_rows: list[dict[str, float]]


def _csv_rows(path: Path) -> list[dict[str, float]]:
    """A CSV's rows as dicts."""
    import pandas as pd

    return pd.read_csv(path).to_dict("records")


@dataclass(slots=True, frozen=True)
class RunDir:
    path: Path
    ray_address: str | None = None  # a run on Ray: its sharded trainer writes last.dcp

    @property
    def checkpoint(self) -> Path:
        """The last checkpoint: ``last.pt`` of the one trainer process, or the directory
        ``last.dcp`` of the sharded trainer on Ray."""
        name = LAST if self.ray_address is None else LAST_SHARDED
        return self.path / CHECKPOINT_DIR / name

    @property
    def spec_path(self) -> Path:
        """The spec the run last ran: its newest ``spec.resumed-N.yaml``, else ``spec.yaml``."""
        return newest_spec(self.path)

    def resume_command(self) -> str:
        ray = "" if self.ray_address is None else " --ray"
        if self.ray_address not in (None, "local"):
            ray += f" {self.ray_address}"
        return f"tandem run {self.spec_path} --live{ray} --out {self.path}"

    def how_to_go_on(self) -> str:
        """What a stopped run's error ends with: ``resume with: <command>`` once a step was
        checkpointed, else that running the same command starts again from step 0."""
        if readable(self.checkpoint) is not None:
            return f"resume with: {self.resume_command()}"
        again = self.resume_command()
        return f"no step was checkpointed yet: running it again starts from step 0: {again}"

    def check(self, spec: RunSpec, force_new_spec: bool = False) -> None:
        """What :meth:`prepare` refuses, refused before anything is written: a resume whose
        checkpoint another kind of trainer wrote, or whose spec changes what is trained."""
        self._check_trainer_kind()
        if readable(self.checkpoint) is None or force_new_spec:
            return
        if not self.spec_path.exists():
            raise SpecError(
                f"{self.path} holds a checkpoint but no spec.yaml to check this spec "
                "against; pass --force-new-spec to resume anyway"
            )
        if changes := training_changes(load_spec(self.spec_path), spec):
            raise SpecError(
                f"resuming {self.path}: this spec changes what is trained: {'; '.join(changes)}."
                f" Resume with the run's own spec ({self.resume_command()}), use another "
                "--out, or pass --force-new-spec"
            )

    def prepare(self, spec: RunSpec, force_new_spec: bool = False) -> None:
        """A fresh run writes its spec; a resumed one checks the spec against it (and
        keeps a changed one beside it, ``force_new_spec``)."""
        self.check(spec, force_new_spec)
        self.path.mkdir(parents=True, exist_ok=True)
        if readable(self.checkpoint) is None or not self.spec_path.exists():
            write_atomic(self.path / SPEC, spec.to_yaml().encode())
        elif training_changes(load_spec(self.spec_path), spec):
            self._keep_new(spec)

    def checkpointed_steps(self) -> int:
        """The steps a resume of this directory starts after: those its checkpoints'
        history covers (0 without a checkpoint; a history line whose checkpoint never
        landed counts here, until the resume drops it)."""
        if readable(self.checkpoint) is None:
            return 0
        return journal_steps(journal_path(self.checkpoint)) or 0

    def checkpointed_samples(self) -> int:
        """The trained samples of the steps :meth:`checkpointed_steps` counts."""
        if readable(self.checkpoint) is None:
            return 0
        return journal_samples(journal_path(self.checkpoint))

    def finished(self, spec: RunSpec) -> bool:
        """The run trained ``spec``'s every step and saved its results (a resume would
        start every process only to find nothing to do); not where a later part of the run
        checkpointed steps past those results and stopped before it saved its own."""
        steps, metrics = self.path / "steps.json", self.path / "metrics.json"
        if readable(self.checkpoint) is None or not (steps.exists() and metrics.exists()):
            return False
        saved = len(json.loads(steps.read_text()))
        checkpointed = journal_steps(journal_path(self.checkpoint))
        return saved >= spec.run.iterations and (checkpointed is None or checkpointed <= saved)

    def _check_trainer_kind(self) -> None:
        """A run checkpointed by one trainer process resumes locally, a sharded one on Ray."""
        other = RunDir(self.path, None if self.ray_address is not None else "local")
        if readable(other.checkpoint) is not None and readable(self.checkpoint) is None:
            where = "without --ray" if self.ray_address is not None else "with --ray"
            raise SpecError(
                f"{self.path} was checkpointed by a {'sharded' if other.ray_address else 'single'}"
                f" trainer ({other.checkpoint.name}); resume it {where}"
            )

    def _keep_new(self, spec: RunSpec) -> None:
        n = 1
        while (self.path / f"spec.resumed-{n}.yaml").exists():
            n += 1
        write_atomic(self.path / f"spec.resumed-{n}.yaml", spec.to_yaml().encode())

    def earlier_part(self, next_step: int, time_s: float) -> EarlierPart:
        """What the run's earlier parts saved of their steps before ``next_step`` and of
        their CPU timeline before ``time_s`` (a resumed run keeps them as they were)."""
        steps, cpu = self.path / "steps.json", self.path / CPU_TIMELINE_FILE
        records = json.loads(steps.read_text()) if steps.exists() else []
        rows = _csv_rows(cpu) if cpu.exists() else []
        return EarlierPart(
            [r for r in records if r.get("step", next_step) < next_step],
            [r for r in rows if r.get("end_s", time_s) <= time_s],
        )

    def cpu_rows_file(self, next_step: int, time_s: float) -> CpuRowsFile:
        """``cpu_timeline.csv`` for a part that started at ``next_step`` and ``time_s``: the
        earlier parts' rows before it, then this part's as they are measured, on disk
        while it runs (:mod:`runtime.cpu_rows_file`), so that a part stopped before its
        save (SIGTERM, Ctrl-C, an error, SIGKILL) leaves them to the part resuming it."""
        earlier = self.earlier_part(next_step, time_s).cpu_rows
        return CpuRowsFile(self.path / CPU_TIMELINE_FILE, earlier)

    def keep_earlier(self, earlier: EarlierPart) -> None:
        """Put an earlier part's step records back in ``steps.json`` over the ones this part
        rebuilt from its checkpoint (which lack the timings only the live loop knew)."""
        path = self.path / "steps.json"
        if not earlier.steps or not path.exists():
            return
        kept = {r["step"]: r for r in earlier.steps}
        records = [kept.get(r.get("step"), r) for r in json.loads(path.read_text())]
        write_atomic(path, json.dumps(records, indent=2).encode())

    def record_processes(self, processes: dict[str, int | None]) -> None:
        """``logs/processes.json``: the pid of each process the run started."""
        write_atomic(self.path / "logs" / "processes.json", json.dumps(processes).encode())

    def record_placement(self, placed: dict[str, dict[str, Any]]) -> None:
        """``logs/placement.json`` of a run on Ray: each process's pid and Ray node."""
        write_atomic(self.path / "logs" / "placement.json", json.dumps(placed).encode())

    def faults(self) -> list[dict]:
        """Every fault of the run, all its parts (resumed ones too)."""
        path = self.path / "faults.json"
        return json.loads(path.read_text()) if path.exists() else []

    def append_fault(self, fault: Any) -> None:
        """Add one fault (a server lost, restarted, rejoined) to faults.json, as it happens."""
        rows = [*self.faults(), asdict(fault)]
        write_atomic(self.path / "faults.json", json.dumps(rows, indent=2).encode())
