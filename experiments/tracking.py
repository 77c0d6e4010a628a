"""Experiment tracking backends for ``run.tracking`` (TensorBoard, Weights & Biases, MLflow).

:func:`tracker_for` gives a :class:`Tracker`: the ``on_step`` callback that a simulation
(``Simulation.run``) or a live run (``run_live``) calls after every optimizer step. It
turns each :class:`policies.tracking.StepUpdate` into a
:class:`policies.tracking.StepReport` and hands it to every logger, as it happens: the
run's log (always) and the backend the spec names. Every backend works offline:

* ``tensorboard`` (base install) — event files in ``RUN_DIR/tensorboard``
  (``tensorboard --logdir RUN_DIR``);
* ``wandb`` (``pip install 'tandem-rl[wandb]'``) — ``wandb.init(mode="offline")`` under
  ``RUN_DIR/wandb`` unless ``WANDB_MODE`` says otherwise (``wandb sync`` uploads later);
* ``mlflow`` (``pip install 'tandem-rl[mlflow]'``) — a file store in ``RUN_DIR/mlruns``
  unless ``MLFLOW_TRACKING_URI`` is set (``mlflow ui --backend-store-uri RUN_DIR/mlruns``;
  MLflow 3 serves a file store only with ``MLFLOW_ALLOW_FILE_STORE=true``, which this sets
  for the process unless it is set already).

Library imports happen when a logger first writes, so building a tracker is cheap and
a missing optional package is reported (by :func:`tracker_for`) before the run starts.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Any

from policies.spec import RunSpec
from policies.tracking import MetricLogger, RunEnd, StepReport, StepReporter, StepUpdate

log = logging.getLogger(__name__)

OPTIONAL = {"wandb": "wandb", "mlflow": "mlflow"}  # backend -> module it imports
# W&B has no run status to set: ``finish(exit_code=)`` marks a non-zero run failed; 130 is
# the shell's code for Ctrl-C, as tandem exits
WANDB_EXIT_CODES = {RunEnd.FINISHED: 0, RunEnd.FAILED: 1, RunEnd.KILLED: 130}


def _numbers(metrics: dict[str, Any]) -> dict[str, float]:
    return {k: float(v) for k, v in metrics.items() if isinstance(v, int | float) and v is not None}


def step_line(r: StepReport) -> str:
    """One line per step for the run's log (steps numbered as in steps.json)."""
    parts = [f"step {r.step}: {r.num_samples} samples", f"{r.samples_per_s:.3g} samples/s"]
    if r.reward is not None:
        parts.append(f"reward {r.reward:.3f}")
    if r.loss is not None:
        parts.append(f"loss {r.loss:.4g}")
    if r.mean_staleness is not None:
        parts.append(f"staleness {r.mean_staleness:.2f} (max {r.max_staleness})")
    parts.append(f"pause {r.pause_s:.3f} s per instance")  # steps.json's breakdown.pause_s
    return ", ".join(parts)


class LogLogger:
    """Each step as one INFO line of this module's logger (it reaches ``run.log``)."""

    def log_step(self, report: StepReport) -> None:
        log.info(step_line(report))

    def log_summary(self, metrics: dict[str, Any]) -> None:
        log.info("summary: %s", ", ".join(f"{k}={v:.4g}" for k, v in _numbers(metrics).items()))

    def close(self, end: RunEnd = RunEnd.FINISHED) -> None:
        if end is not RunEnd.FINISHED:
            log.info("tracking: the run ended %s", end.value)


class TensorBoardLogger:
    """Scalars in a TensorBoard event file (the ``tensorboard`` package's own writer).

    Each writer (a run, or each part of a resumed one) writes a new file, which begins
    with a session start at the first step it logs, as ``SummaryWriter(purge_step=)``
    does: TensorBoard then hides the earlier files' events from that step on, so the
    steps a stopped part logged after its checkpoint, trained again on resume, keep one
    value (the resumed part's)."""

    def __init__(self, log_dir: Path) -> None:
        self.log_dir = Path(log_dir)
        self._writer: Any = None
        self._last_step = 0

    def _open(self) -> Any:
        if self._writer is None:
            from tensorboard.summary.writer.event_file_writer import EventFileWriter

            self.log_dir.mkdir(parents=True, exist_ok=True)
            self._writer = EventFileWriter(str(self.log_dir))
        return self._writer

    def _purge_from(self, step: int) -> None:
        from tensorboard.compat.proto.event_pb2 import Event, SessionLog

        start = SessionLog(status=SessionLog.START)
        self._open().add_event(Event(wall_time=time.time(), step=step, session_log=start))

    def _write(self, step: int, values: dict[str, float]) -> None:
        from tensorboard.compat.proto.event_pb2 import Event
        from tensorboard.compat.proto.summary_pb2 import Summary

        summary = Summary(value=[Summary.Value(tag=k, simple_value=v) for k, v in values.items()])
        self._open().add_event(Event(wall_time=time.time(), step=step, summary=summary))

    def log_step(self, report: StepReport) -> None:
        if self._writer is None:  # this part's first step: earlier parts' from it are stale
            self._purge_from(report.step)
        self._last_step = report.step
        self._write(report.step, report.scalars())
        self._writer.flush()  # as it happens: a reader sees every finished step

    def log_summary(self, metrics: dict[str, Any]) -> None:
        values = {f"summary/{k}": v for k, v in _numbers(metrics).items()}
        self._write(self._last_step, values)

    def close(self, end: RunEnd = RunEnd.FINISHED) -> None:
        if self._writer is not None:  # event files have no run status
            self._writer.close()
            self._writer = None


class WandbLogger:
    """A Weights & Biases run, offline by default (``WANDB_MODE`` overrides)."""

    def __init__(self, run_dir: Path, spec: RunSpec) -> None:
        self.run_dir = Path(run_dir)
        self.spec = spec
        self._run: Any = None

    def _open(self) -> Any:
        if self._run is None:
            import wandb

            self.run_dir.mkdir(parents=True, exist_ok=True)
            self._run = wandb.init(
                project=os.environ.get("WANDB_PROJECT", "tandem"),
                name=self.spec.run.name,
                dir=str(self.run_dir),
                mode=os.environ.get("WANDB_MODE", "offline"),
                config=self.spec.public_dump(),
            )
        return self._run

    def log_step(self, report: StepReport) -> None:
        self._open().log(report.scalars(), step=report.step)

    def log_summary(self, metrics: dict[str, Any]) -> None:
        self._open().summary.update(_numbers(metrics))

    def close(self, end: RunEnd = RunEnd.FINISHED) -> None:
        if self._run is not None:  # a non-zero exit code marks the W&B run failed
            self._run.finish(exit_code=WANDB_EXIT_CODES[end])
            self._run = None


def flat_params(data: Any, prefix: str = "") -> dict[str, str]:
    """A nested spec dump as ``a.b.0.c`` → string value (MLflow parameters)."""
    if isinstance(data, dict):
        items = data.items()
    elif isinstance(data, list):
        items = ((str(i), v) for i, v in enumerate(data))
    else:
        return {prefix: str(data)}
    out: dict[str, str] = {}
    for key, value in items:
        out |= flat_params(value, f"{prefix}.{key}" if prefix else str(key))
    return out


class MlflowLogger:
    """An MLflow run through ``MlflowClient`` (no global active run); a file store in the
    run directory unless ``MLFLOW_TRACKING_URI`` is set."""

    def __init__(self, run_dir: Path, spec: RunSpec) -> None:
        self.run_dir = Path(run_dir)
        self.spec = spec
        self._client: Any = None
        self._run_id: str | None = None
        self._last_step = 0

    def _open(self) -> tuple[Any, str]:
        if self._client is None:
            from mlflow.entities import Param
            from mlflow.tracking import MlflowClient

            uri = os.environ.get("MLFLOW_TRACKING_URI")
            if not uri:
                uri = (self.run_dir / "mlruns").resolve().as_uri()
                # MLflow 3 keeps its file store only on request (it prefers a database)
                os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
            client = MlflowClient(tracking_uri=uri)
            name = os.environ.get("MLFLOW_EXPERIMENT_NAME", "tandem")
            found = client.get_experiment_by_name(name)
            experiment_id = found.experiment_id if found else client.create_experiment(name)
            run = client.create_run(experiment_id, run_name=self.spec.run.name)
            params = flat_params(self.spec.public_dump())
            client.log_batch(run.info.run_id, params=[Param(k, v) for k, v in params.items()])
            self._client, self._run_id = client, run.info.run_id
        assert self._run_id is not None
        return self._client, self._run_id

    def _log(self, values: dict[str, float], step: int) -> None:
        from mlflow.entities import Metric

        client, run_id = self._open()
        now_ms = int(time.time() * 1000)
        client.log_batch(run_id, metrics=[Metric(k, v, now_ms, step) for k, v in values.items()])

    def log_step(self, report: StepReport) -> None:
        self._last_step = report.step
        self._log(report.scalars(), report.step)

    def log_summary(self, metrics: dict[str, Any]) -> None:
        self._log({f"summary/{k}": v for k, v in _numbers(metrics).items()}, self._last_step)

    def close(self, end: RunEnd = RunEnd.FINISHED) -> None:
        if self._client is not None:
            self._client.set_terminated(self._run_id, status=end.value)
            self._client = None


class Tracker:
    """A run's ``on_step``: every update reported to every logger, in step order.

    Use as a context manager around the run; :meth:`finish` logs the run's final metrics
    (``metrics.json``) before the loggers close."""

    def __init__(self, loggers: list[MetricLogger]) -> None:
        self.loggers = loggers
        self.reporter = StepReporter()
        self.reports: list[StepReport] = []

    def __call__(self, update: StepUpdate) -> None:
        report = self.reporter.report(update)
        self.reports.append(report)
        for logger in self.loggers:
            logger.log_step(report)

    def finish(self, metrics: dict[str, Any]) -> None:
        for logger in self.loggers:
            logger.log_summary(metrics)

    def close(self, end: RunEnd = RunEnd.FINISHED) -> None:
        for logger in self.loggers:
            logger.close(end)

    def __enter__(self) -> Tracker:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, err: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close(RunEnd.of(err))  # a stopped or crashed run is not marked finished


def backend_logger(name: str, spec: RunSpec, run_dir: Path) -> MetricLogger | None:
    """The logger of ``run.tracking`` value ``name`` (None for ``none``)."""
    if name in OPTIONAL and importlib.util.find_spec(OPTIONAL[name]) is None:
        raise ValueError(
            f"run.tracking: {name!r} needs the {OPTIONAL[name]} package "
            f"(pip install 'tandem-rl[{name}]'), or choose tensorboard or none"
        )
    factories: dict[str, Callable[[], MetricLogger | None]] = {
        "none": lambda: None,
        "tensorboard": lambda: TensorBoardLogger(run_dir / "tensorboard"),
        "wandb": lambda: WandbLogger(run_dir, spec),
        "mlflow": lambda: MlflowLogger(run_dir, spec),
    }
    if name not in factories:
        raise ValueError(f"run.tracking: unknown backend {name!r}; choose {', '.join(factories)}")
    return factories[name]()


def tracker_for(spec: RunSpec, run_dir: Path) -> Tracker:
    """The tracker of a run writing to ``run_dir``: the run's log plus ``run.tracking``."""
    backend = backend_logger(spec.run.tracking, spec, Path(run_dir))
    loggers: list[MetricLogger] = [LogLogger()]
    if backend is not None:
        loggers.append(backend)
    return Tracker(loggers)
