"""Run results with one schema for the simulator and the live runtime.

Metrics, and how each bubble is measured (all in resource-seconds, i.e. summed over
generation instances and the trainer):

* ``skewness_bubble_s`` — time a generation instance sits without work while the
  iteration it serves is still being generated elsewhere. Each iteration's window runs
  from its first dispatch to its last completion; an instance's non-busy time inside
  the union of these windows counts.
* ``pipeline_bubble_s`` — time a stage waits on the other: generation instances'
  non-busy time outside every iteration window (waiting for weights or training, weight
  loads, lag throttling) plus the trainer's idle time. Colocated runs time-share GPUs, so
  there it is the context-switch time instead.
* ``generation_utilization`` / ``trainer_utilization`` — busy (prefill, decode / train)
  time over the time the resource held its GPUs: the trainer the whole run; an instance
  from the start or its scale-out (its engine start and weight load count as waiting) to
  its retirement or the end, as ``cost_normalized_throughput`` prices it; both bubbles
  count an instance's non-busy time over that same span.
* ``mean_staleness`` / ``max_staleness`` — ``version_trained − version_prompt`` over trained
  samples: from the oldest weights a sample depends on, those its prompt KV was computed
  with (``version_start`` unless the sample waited in an engine's queue across an update).
  A request an ``abort-resubmit`` update aborted starts again on the new weights: its
  ``version_start`` is that of its last (kept) generation, which is the one it trains on.
* ``aborted_requests`` / ``discarded_tokens`` (simulated) — the work ``abort-resubmit``
  threw away: requests aborted (one aborted twice counts twice) and the output tokens
  they had decoded. ``throughput_tokens_per_s`` counts only the kept tokens, while
  ``generation_utilization`` includes the time spent decoding the discarded ones.
* ``cost_normalized_throughput`` (simulated) — throughput over the run's GPU cost averaged
  over the run: each instance's GPUs priced while held, from the start or its scale-out
  to its retirement or the end (``sim.gpu_cost``); a fixed cluster's is its cost.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from policies.breakdown import with_breakdown
from policies.cluster import ClusterSection
from policies.intervals import Interval, complement, intersect_length, length, merged
from policies.record_files import record_rows
from policies.records import Discarded, SampleRecord, Span, SpanKind
from policies.resources import TRAINER
from policies.spec import RunSpec
from policies.trace import trace_json

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Metric:
    """One key of ``metrics.json``."""

    name: str
    meaning: str
    in_summary: bool = True  # a row of the CLI's summary table


# The unit ``cost_normalized_throughput`` divides by: hardware.csv's
# ``cost_per_machine_rel_h20`` prices a whole 8-GPU machine, relative to an H20 machine's
# cost, so a cluster of 16 H20 GPUs costs 2 units (not 16).
COST_UNIT = "H20-machine cost unit (the cost of one 8-GPU H20 machine)"
COST_NORMALIZED_UNIT = f"samples/s per {COST_UNIT}"

# Every metric :func:`compute_metrics` reports, for sim and live alike, in this order: the
# one list the CLI's summary, the tests and the docs take their names from.
METRICS: tuple[Metric, ...] = (
    Metric("throughput_samples_per_s", "trained samples per second of the run"),
    Metric("throughput_tokens_per_s", "trained output tokens per second of the run"),
    Metric("generation_utilization", "busy share of the time instances held their GPUs"),
    Metric("trainer_utilization", "busy share of the trainer over the run"),
    Metric("pipeline_bubble_s", "resource-seconds a stage waits for the other (above)"),
    Metric("skewness_bubble_s", "instance-seconds idle while an iteration is generated"),
    Metric("mean_staleness", "mean version_trained − version_start of trained samples"),
    Metric("max_staleness", "largest version_trained − version_start"),
    Metric("num_samples_generated", "samples whose generation finished", in_summary=False),
    Metric("num_samples_trained", "samples an optimizer step trained"),
    Metric(
        "cost_normalized_throughput",
        f"{COST_NORMALIZED_UNIT}, each GPU priced while held (elastic: added to retired); sim only",
    ),
    Metric("generation_time_s", "mean per-iteration first dispatch to last completion"),
    Metric("iteration_time_s", "run time per optimizer step"),
    Metric("makespan_s", "the run's end time", in_summary=False),
    Metric(
        "num_generation_instances",
        "instances that ever existed (elastic: the added and retired ones too)",
        in_summary=False,
    ),
)
METRIC_NAMES = tuple(m.name for m in METRICS)
SUMMARY_METRICS = tuple(m.name for m in METRICS if m.in_summary)
# added by the simulator: the GPUs each stage ran on, as allocated (``balanced`` may
# re-split the spec's counts; shown in the summary) and the wall-clock seconds it took
SPLIT_METRICS: tuple[Metric, ...] = (
    Metric("generation_gpus", "GPUs of the generation pools at the start (colocated: all)"),
    Metric(
        "mean_generation_gpus",
        "generation GPUs held, averaged over the run (elastic: each instance from its "
        "scale-out to its retirement; else generation_gpus)",
    ),
    Metric("trainer_gpus", "trainer GPUs (colocated: all, shared with generation)"),
)
# added by the simulator: what ``pipeline.inflight: abort-resubmit`` threw away (else 0)
DISCARD_METRICS: tuple[Metric, ...] = (
    Metric("aborted_requests", "running requests aborted by weight updates, then resubmitted"),
    Metric("discarded_tokens", "output tokens the aborted requests had decoded, thrown away"),
)
SIM_METRICS = ("sim_wall_s", *(m.name for m in (*SPLIT_METRICS, *DISCARD_METRICS)))
LIVE_METRICS = (
    "live_wall_s", "mean_reward_first_fifth", "mean_reward_last_fifth", "num_servers_lost",
    "startup_s", "warm_up_s", "time_to_first_step_s",  # this part of the run (runtime.live_run)
)  # fmt: skip
CPU_ROLES = ("actor", "trainer", "frontend", "engine", "other")  # runtime.host_cpu.run_cpu_by_role
CPU_METRICS = (  # a live run's CPU over its clock, for the roles it runs on this host
    "cpu_cores_used", "cpu_ms_per_sample", *(f"cpu_ms_per_sample_{r}" for r in CPU_ROLES),
)  # fmt: skip
WALL_METRICS = ("sim_wall_s", "live_wall_s", "startup_s", "warm_up_s")  # the host's, not the run's

GEN_BUSY = {SpanKind.PREFILL, SpanKind.DECODE}


def iteration_windows(samples: list[SampleRecord]) -> dict[int, Interval]:
    lo: dict[int, float] = {}
    hi: dict[int, float] = {}
    for s in samples:
        if s.gen_end_s is None:
            continue
        lo[s.iteration] = min(lo.get(s.iteration, s.dispatch_s), s.dispatch_s)
        hi[s.iteration] = max(hi.get(s.iteration, s.gen_end_s), s.gen_end_s)
    return {it: (lo[it], hi[it]) for it in lo}


def compute_metrics(
    samples: list[SampleRecord],
    spans: list[Span],
    end_s: float,
    gen_resources: dict[str, Interval],
    colocated: bool,
    num_steps: int,
    cost_units: float | None,
) -> dict[str, float | int | None]:
    """Metrics of ``metrics.json``; ``gen_resources`` maps ``gen-<i>`` to when it held its
    GPUs (``sim.gpu_cost``'s lease: taken, given back or the run's end)."""
    busy: dict[str, list[Interval]] = defaultdict(list)
    switch_s = 0.0
    for sp in spans:
        if sp.kind in GEN_BUSY or sp.kind == SpanKind.TRAIN:
            busy[sp.resource].append((sp.start_s, sp.end_s))
        if sp.kind == SpanKind.CONTEXT_SWITCH and sp.resource == TRAINER:
            switch_s += sp.end_s - sp.start_s
    windows = merged(iteration_windows(samples).values())
    gen_busy_s = gen_life_s = skew_s = gen_wait_s = 0.0
    for name, (start, end) in gen_resources.items():
        busy_of = merged(busy[name])
        idle = complement(busy_of, start, end)
        gen_busy_s += length(busy_of)
        gen_life_s += max(0.0, end - start)
        in_window = intersect_length(idle, windows)
        skew_s += in_window
        gen_wait_s += length(idle) - in_window
    train_busy_s = length(merged(busy[TRAINER]))
    pipeline_s = switch_s if colocated else gen_wait_s + max(0.0, end_s - train_busy_s)
    trained = [s for s in samples if s.train_step is not None]
    generated = [s for s in samples if s.gen_end_s is not None]
    stale = [s.staleness for s in trained if s.staleness is not None]
    per_iter = [hi - lo for lo, hi in iteration_windows(samples).values()]
    throughput = len(trained) / end_s if end_s > 0 else 0.0
    values = {
        "throughput_samples_per_s": throughput,
        "throughput_tokens_per_s": sum(s.output_tokens for s in trained) / end_s if end_s else 0.0,
        "generation_utilization": gen_busy_s / gen_life_s if gen_life_s else 0.0,
        "trainer_utilization": min(1.0, train_busy_s / end_s) if end_s else 0.0,
        "pipeline_bubble_s": pipeline_s,
        "skewness_bubble_s": skew_s,
        "mean_staleness": sum(stale) / len(stale) if stale else 0.0,
        "max_staleness": max(stale) if stale else 0,
        "num_samples_generated": len(generated),
        "num_samples_trained": len(trained),
        "cost_normalized_throughput": throughput / cost_units if cost_units else None,
        "generation_time_s": sum(per_iter) / len(per_iter) if per_iter else 0.0,
        "iteration_time_s": end_s / num_steps if num_steps else 0.0,
        "makespan_s": end_s,
        "num_generation_instances": len(gen_resources),
    }
    return {name: values[name] for name in METRIC_NAMES}


def discard_metrics(discarded: list[Discarded]) -> dict[str, int]:
    """:data:`DISCARD_METRICS` of a run's instances."""
    return {
        "aborted_requests": sum(d.num_requests for d in discarded),
        "discarded_tokens": sum(d.num_output_tokens for d in discarded),
    }


def split_metrics(cluster: ClusterSection) -> dict[str, int]:
    """:data:`SPLIT_METRICS` of the cluster a run ran on (its allocated one)."""
    return {
        "generation_gpus": sum(p.num_gpus for p in cluster.generation),
        "trainer_gpus": cluster.trainer.num_gpus,
    }


def write_atomic(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` so that a crash leaves either the old file or the new one."""
    if path.is_dir():  # else the error names the temporary file
        raise IsADirectoryError(
            errno.EISDIR, "a directory, where a file is to be written", str(path)
        )
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    except OSError as err:  # name the file asked for, not the temporary one beside it
        raise type(err)(err.errno, err.strerror, str(path)) from None
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


CPU_TIMELINE_FILE = "cpu_timeline.csv"
RESULT_FILES = (  # what a run writes besides its spec and log (timeline.png: the CLI's plot)
    "metrics.json", "samples.parquet", "events.parquet", "steps.json", CPU_TIMELINE_FILE,
    "trace.json", "timeline.png",
)  # fmt: skip
SAMPLE_COLUMNS = list(SampleRecord.__slots__)  # type: ignore[attr-defined]
SPAN_COLUMNS = list(Span.__slots__)  # type: ignore[attr-defined]


@dataclass(slots=True)
class RunResult:
    spec: RunSpec
    metrics: dict[str, Any]
    samples: list[SampleRecord]
    spans: list[Span]
    steps: list[dict[str, Any]] = field(default_factory=list)  # per optimizer step stats
    # live: the cores each role used, interval by interval (runtime.cpu_timeline)
    cpu_timeline: list[dict[str, float]] = field(default_factory=list)

    def samples_frame(self) -> Any:
        return _frame(self.samples, SAMPLE_COLUMNS)

    def spans_frame(self) -> Any:
        frame = _frame(self.spans, SPAN_COLUMNS, {"kind": str})
        return frame.astype({"iteration": "Int64", "batch_size": "Int64"})

    def cpu_frame(self) -> Any:
        import pandas as pd

        return pd.DataFrame(self.cpu_timeline)

    @classmethod
    def load(cls, out_dir: str | Path) -> RunResult:
        """The result a :meth:`save` wrote to ``out_dir`` (sim or live)."""
        import pandas as pd

        from policies.spec import load_spec

        out = Path(out_dir)
        if not out.is_dir():
            what = "is a file, not a run's directory" if out.exists() else "does not exist"
            raise ValueError(f"run directory {out} {what}")
        for name in ("spec.yaml", "metrics.json", "samples.parquet", "events.parquet"):
            if not (out / name).is_file():
                raise ValueError(
                    f"{out}: not a finished run's directory (no {name}; a run writes its "
                    "results when it ends)"
                )
        spec = load_spec(out / "spec.yaml")
        metrics = json.loads((out / "metrics.json").read_text())
        samples = [
            SampleRecord(**row) for row in record_rows(out / "samples.parquet", SampleRecord)
        ]
        spans = [
            Span(**{**row, "kind": SpanKind(row["kind"])})
            for row in record_rows(out / "events.parquet", Span)
        ]
        steps_path = out / "steps.json"
        steps = json.loads(steps_path.read_text()) if steps_path.exists() else []
        cpu_path = out / CPU_TIMELINE_FILE
        cpu = pd.read_csv(cpu_path).to_dict("records") if cpu_path.exists() else []
        return cls(spec, metrics, samples, spans, steps, cpu)

    def trace_json(self) -> bytes:
        """The run's timeline as a Chrome / Perfetto trace (``policies.trace``)."""
        meta = {"run": self.spec.run.name, "mode": self.spec.pipeline.mode}
        return trace_json(self.spans, self.samples, self.steps, meta, self.cpu_timeline)

    @staticmethod
    def clear(out_dir: str | Path) -> list[str]:
        """Delete the result files an earlier run left in ``out_dir`` (a run into it that
        stops early must not leave its spec beside another run's results); their names."""
        gone = []
        for name in RESULT_FILES:
            path = Path(out_dir) / name
            if path.is_file():
                path.unlink()
                gone.append(name)
        return gone

    def save(
        self, out_dir: str | Path, write_spec: bool = True, trace_by_default: bool = True
    ) -> Path:
        """Write spec.yaml, samples.parquet, events.parquet, steps.json, cpu_timeline.csv
        (live), trace.json (``run.trace``; unset: ``trace_by_default``) and, last, the
        completion marker metrics.json (each atomically): a directory with metrics.json
        holds the whole result. ``write_spec=False`` leaves the directory's spec.yaml as it
        is (a resumed live run)."""
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        log.info("writing results to %s…", out)
        (out / "metrics.json").unlink(missing_ok=True)  # an earlier part's: not complete now
        if write_spec:
            write_atomic(out / "spec.yaml", self.spec.to_yaml().encode())
        write_atomic(out / "samples.parquet", _parquet_bytes(self.samples_frame()))
        write_atomic(out / "events.parquet", _parquet_bytes(self.spans_frame()))
        if self.steps:
            steps = with_breakdown(self.steps, self.spans)  # where each step's time went
            write_atomic(out / "steps.json", json.dumps(steps, indent=2).encode())
        if self.cpu_timeline:
            write_atomic(out / CPU_TIMELINE_FILE, self.cpu_frame().to_csv(index=False).encode())
        trace = self.spec.run.trace
        if trace if trace is not None else trace_by_default:
            self._save_trace(out / "trace.json")
        else:  # never an earlier run's beside these results
            (out / "trace.json").unlink(missing_ok=True)
        write_atomic(out / "metrics.json", json.dumps(self.metrics, indent=2).encode())
        return out

    def _save_trace(self, path: Path) -> None:
        """trace.json, with a log line before and after: for a stepped run (no
        ``sim.fast_forward``) it is tens of MB and takes a while to build and write."""
        log.info(
            "writing %s (%d spans, %d samples)…", path.name, len(self.spans), len(self.samples)
        )
        start_s = time.perf_counter()
        data = self.trace_json()
        write_atomic(path, data)
        took_s = time.perf_counter() - start_s
        log.info("wrote %s (%.1f MB) in %.1f s", path.name, len(data) / 1e6, took_s)


def _frame(
    records: list[Any], names: list[str], convert: dict[str, Callable[[Any], Any]] | None = None
) -> Any:
    """The records' fields as a frame, built column by column: the frame ``asdict`` row by
    row gave (the fields are scalars, strings or tuples of ints) at a fraction of the cost;
    ``convert`` maps a column's values (an enum to its text)."""
    import pandas as pd

    if not records:  # object columns, as a frame of no rows had
        return pd.DataFrame([], columns=names)
    columns = {name: [getattr(r, name) for r in records] for name in names}
    for name, fn in (convert or {}).items():
        columns[name] = [fn(v) for v in columns[name]]
    return pd.DataFrame(columns, columns=names)


def _parquet_bytes(frame: Any) -> bytes:
    import io

    buf = io.BytesIO()
    frame.to_parquet(buf, index=False)
    return buf.getvalue()
