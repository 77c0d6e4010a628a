"""Samples/s and completion tokens/s of one benchmark run, whole run and steady state.

Every system of ``tandem bench peers`` reports its run as a :class:`StepSeries`: the
optimizer steps it timed, each with its end time and the samples and completion tokens
it trained, and the window the whole run spans. Both rates come from that one record,
the same way for every system:

* **whole run**: every sample (token) trained over the whole window;
* **steady state**: the samples (tokens) of steps 1..N-1 over the time from the end of
  step 0 to the end of step N-1 — the first timed step, with whatever start-up it
  carries (a first weight push, a cold cache), is left out.

* **reward**: the mean task reward of the samples trained over the timed steps, and of
  those of the last quarter of the steps (``late_reward``): a system that trades learning
  for speed (samples too stale for the step size) shows it here, beside its rates. (A
  continuous mode trains last the groups that finished last, often the harder ones: its
  late figure reads low for that alone; compare whole-run means.)

* **CPU per sample**: the CPU seconds the system's own processes used over the whole
  window (``cpu_s``, where it was measured) per sample trained — what a sample costs the
  host, less disturbed by other load than the rates (a slow host still costs more CPU
  per sample: TRL's 16.8–26.0 ms across one session's rounds).

Completion tokens include the end-of-sequence token when a completion has one (vLLM's
``output_tokens`` and TRL's ``completion_ids`` both do).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any


@dataclass(slots=True, frozen=True)
class StepPoint:
    """One timed optimizer step."""

    end_s: float  # seconds from the run's clock start
    num_samples: int
    completion_tokens: int
    reward_sum: float = 0.0  # the task reward summed over the step's samples


@dataclass(slots=True, frozen=True)
class StepSeries:
    """The timed steps of one run and the window of the whole run (seconds)."""

    start_s: float
    end_s: float
    steps: tuple[StepPoint, ...]
    cpu_s: float | None = None  # CPU seconds of the system's processes over the window

    def to_json(self) -> dict[str, Any]:
        return {"start_s": self.start_s, "end_s": self.end_s, "cpu_s": self.cpu_s,
                "steps": [asdict(s) for s in self.steps]}  # fmt: skip

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> StepSeries:
        steps = tuple(StepPoint(**s) for s in data["steps"])
        cpu = data.get("cpu_s")
        return cls(float(data["start_s"]), float(data["end_s"]), steps,
                   None if cpu is None else float(cpu))  # fmt: skip


@dataclass(slots=True, frozen=True)
class Rates:
    """Throughput of one run; steady-state figures are None with fewer than two steps."""

    samples_per_s: float
    tokens_per_s: float
    steady_samples_per_s: float | None
    steady_tokens_per_s: float | None
    num_samples: int
    completion_tokens: int
    wall_s: float
    cpu_ms_per_sample: float | None = None  # None where the run's CPU was not measured
    mean_reward: float | None = None  # over the samples of the timed steps
    late_reward: float | None = None  # over those of the last quarter of the steps

    @property
    def mean_completion_tokens(self) -> float:
        return self.completion_tokens / self.num_samples if self.num_samples else 0.0


def rates(series: StepSeries) -> Rates:
    """Whole-run and steady-state rates of ``series`` (see the module docstring)."""
    if not series.steps:
        raise ValueError("a run with no timed steps has no rates")
    wall_s = series.end_s - series.start_s
    if wall_s <= 0:
        raise ValueError(f"the run's window must be positive, got {wall_s} s")
    num_samples = sum(s.num_samples for s in series.steps)
    num_tokens = sum(s.completion_tokens for s in series.steps)
    steady_samples = steady_tokens = None
    if len(series.steps) > 1:
        steady_s = series.steps[-1].end_s - series.steps[0].end_s
        later = series.steps[1:]
        if steady_s > 0:
            steady_samples = sum(s.num_samples for s in later) / steady_s
            steady_tokens = sum(s.completion_tokens for s in later) / steady_s
    return Rates(
        samples_per_s=num_samples / wall_s,
        tokens_per_s=num_tokens / wall_s,
        steady_samples_per_s=steady_samples,
        steady_tokens_per_s=steady_tokens,
        num_samples=num_samples,
        completion_tokens=num_tokens,
        wall_s=wall_s,
        cpu_ms_per_sample=(
            1000 * series.cpu_s / num_samples if series.cpu_s is not None and num_samples else None
        ),
        mean_reward=_mean_reward(series.steps),
        late_reward=_mean_reward(series.steps[len(series.steps) - _quarter(series.steps) :]),
    )


def _quarter(steps: tuple[StepPoint, ...]) -> int:
    return -(-len(steps) // 4)  # the last quarter's steps, at least one


def _mean_reward(steps: tuple[StepPoint, ...]) -> float | None:
    num_samples = sum(s.num_samples for s in steps)
    return sum(s.reward_sum for s in steps) / num_samples if num_samples else None
