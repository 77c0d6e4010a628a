"""Per-step tracking, shared by the simulator and the live runtime.

After every optimizer step an executor hands its ``on_step`` callback a
:class:`StepUpdate`: the step's :class:`StepStats`, the samples that step trained and the
spans recorded since the previous update (live also the busy periods still open). A
:class:`StepReporter` turns the updates into :class:`StepReport` rows (reward, loss,
KL / clip fraction where the trainer knows them, lag and staleness, samples/s,
generation, training and pause time, utilization of each resource over the step's
window), and a :class:`MetricLogger` writes them as they happen. The loggers that need a
library (TensorBoard, Weights & Biases, MLflow) live in ``experiments.tracking``; this
module imports none of them.

Windows: step ``k``'s window runs from the end of step ``k − 1`` (0 for the first step
of a run) to the end of step ``k``. A span counts in a window for the part of it inside
the window, as far as it was recorded when the step ended: a span recorded after its
time (the simulator records a decode period when it ends) counts in the window it ends in.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Protocol

from policies.records import SampleRecord, Span, SpanKind, StepStats
from policies.resources import TRAINER, is_generation

TRACKERS = ("none", "tensorboard", "wandb", "mlflow")  # values of ``run.tracking``

_BUSY = {SpanKind.PREFILL, SpanKind.DECODE, SpanKind.TRAIN}


@dataclass(frozen=True, slots=True)
class StepUpdate:
    """What an executor reports after one optimizer step (global step numbers)."""

    stats: StepStats
    samples: tuple[SampleRecord, ...]  # the samples this step trained
    new_spans: tuple[Span, ...]  # spans recorded since the previous update
    open_spans: tuple[Span, ...] = ()  # busy periods not yet closed, up to now (live)
    num_steps: int | None = None  # the run's total, for progress displays
    window_start_s: float | None = None  # None: the previous update's end (0 at first);
    # a resumed run's first step starts its window at the checkpoint's time

    @property
    def step(self) -> int:
        return self.stats.step


@dataclass(frozen=True, slots=True)
class StepReport:
    """One row of per-step tracking; ``None`` where the executor does not know the value."""

    step: int
    time_s: float  # run time at the step's end
    window_s: float  # length of the step's window
    num_samples: int
    num_tokens: int
    samples_per_s: float  # trained samples over the window
    reward: float | None
    loss: float | None
    kl: float | None  # KL to the reference model (kl_coef > 0)
    clip_fraction: float | None  # share of tokens whose importance weight was clipped
    ess: float | None  # effective sample size of the importance weights
    mean_lag: float | None  # trainer's view: its version − the sample's prompt version
    mean_staleness: float | None  # version_trained − version_prompt, samples of the step
    max_staleness: int | None
    generation_s: float | None  # first dispatch to last completion of the step's samples
    train_s: float | None  # trainer compute time of the step
    # the mean over generation instances of the seconds each was paused for weight loads
    # in the window: steps.json's ``breakdown.pause_s`` (policies.breakdown), not their sum
    pause_s: float
    utilization: dict[str, float] = field(default_factory=dict)  # resource -> busy share

    def scalars(self) -> dict[str, float]:
        """Name → value of every known scalar (the tags of every logger)."""
        values: dict[str, float | int | None] = {
            "reward": self.reward,
            "loss": self.loss,
            "kl": self.kl,
            "clip_fraction": self.clip_fraction,
            "ess": self.ess,
            "lag/mean": self.mean_lag,
            "staleness/mean": self.mean_staleness,
            "staleness/max": self.max_staleness,
            "throughput/samples_per_s": self.samples_per_s,
            "throughput/samples": self.num_samples,
            "throughput/tokens": self.num_tokens,
            "time/run_s": self.time_s,
            "time/window_s": self.window_s,
            "time/generation_s": self.generation_s,
            "time/train_s": self.train_s,
            "time/pause_s": self.pause_s,
            **{f"utilization/{name}": u for name, u in sorted(self.utilization.items())},
        }
        return {k: float(v) for k, v in values.items() if v is not None}


class RunEnd(StrEnum):
    """How a tracked run ended (MLflow's run statuses; W&B gets an exit code)."""

    FINISHED = "FINISHED"
    FAILED = "FAILED"  # an error stopped it
    KILLED = "KILLED"  # Ctrl-C or SIGTERM

    @classmethod
    def of(cls, err: BaseException | None) -> RunEnd:
        """The end of a run that raised ``err`` (``None``: it returned)."""
        if err is None:
            return cls.FINISHED
        return cls.KILLED if isinstance(err, KeyboardInterrupt) else cls.FAILED


class MetricLogger(Protocol):
    """Where step reports go (TensorBoard, W&B, MLflow, the run's log)."""

    def log_step(self, report: StepReport) -> None: ...

    def log_summary(self, metrics: dict[str, Any]) -> None: ...

    def close(self, end: RunEnd = RunEnd.FINISHED) -> None: ...


class StepReporter:
    """Turns the updates of one run into :class:`StepReport` rows, in order."""

    def __init__(self) -> None:
        self._window_start_s = 0.0
        self._pending: list[Span] = []  # recorded spans that reach past the last window
        self._resources: set[str] = set()  # instances and trainer seen so far (idle: 0)

    def report(self, update: StepUpdate) -> StepReport:
        stats, samples = update.stats, update.samples
        if update.window_start_s is not None:
            self._window_start_s = update.window_start_s
        lo, hi = self._window_start_s, max(self._window_start_s, stats.end_s)
        spans = [*self._pending, *update.new_spans]
        self._pending = [s for s in spans if s.end_s > hi]
        self._window_start_s = hi
        busy, paused_s = _window_busy([*spans, *update.open_spans], lo, hi)
        self._resources |= busy.keys()
        instances = [r for r in self._resources if is_generation(r)]
        pause_s = paused_s / len(instances) if instances else 0.0
        busy = {r: busy.get(r, 0.0) for r in sorted(self._resources)}
        window_s = hi - lo
        stale = [s.staleness for s in samples if s.staleness is not None]
        rewards = [s.reward for s in samples if s.reward is not None]
        reward = stats.mean_reward
        if reward is None and rewards:
            reward = sum(rewards) / len(rewards)
        return StepReport(
            step=stats.step,
            time_s=hi,
            window_s=window_s,
            num_samples=stats.num_samples,
            num_tokens=stats.num_tokens,
            samples_per_s=stats.num_samples / window_s if window_s > 0 else 0.0,
            reward=reward,
            loss=stats.loss,
            kl=stats.kl,
            clip_fraction=stats.clip_fraction,
            ess=stats.ess,
            mean_lag=stats.mean_lag,
            mean_staleness=sum(stale) / len(stale) if stale else None,
            max_staleness=max(stale) if stale else None,
            generation_s=_generation_s(samples),
            train_s=stats.busy_s if stats.busy_s is not None else stats.end_s - stats.start_s,
            pause_s=pause_s,
            utilization={r: b / window_s if window_s > 0 else 0.0 for r, b in busy.items()},
        )


def _generation_s(samples: Sequence[SampleRecord]) -> float | None:
    ends = [s.gen_end_s for s in samples if s.gen_end_s is not None]
    if not ends:
        return None
    return max(ends) - min(s.dispatch_s for s in samples)


def _window_busy(spans: Sequence[Span], lo: float, hi: float) -> tuple[dict[str, float], float]:
    """Busy seconds of each resource inside [lo, hi] (its busy spans merged), and the
    seconds generation instances spent loading weights there."""
    intervals: dict[str, list[tuple[float, float]]] = defaultdict(list)
    pause_s = 0.0
    for s in spans:
        is_generation = s.resource.startswith("gen-")
        if not (is_generation or s.resource == TRAINER):
            continue  # links: their weight transfers are in the pause
        busy = intervals[s.resource]  # every instance seen gets a row, idle ones too
        a, b = max(lo, s.start_s), min(hi, s.end_s)
        if b <= a:
            continue
        if s.kind in _BUSY:
            busy.append((a, b))
        elif s.kind == SpanKind.WEIGHT_SYNC and is_generation:
            pause_s += b - a
    return {r: _merged_length(iv) for r, iv in intervals.items()}, pause_s


def _merged_length(intervals: list[tuple[float, float]]) -> float:
    total, end = 0.0, float("-inf")
    for a, b in sorted(intervals):
        if b <= end:
            continue
        total += b - max(a, end)
        end = b
    return total
