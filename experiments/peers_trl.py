"""TRL's ``GRPOTrainer`` on tandem's model, tasks and reward: the peer of ``bench peers``.

Run as its own process (``python -m experiments.peers_trl JOB.json RESULT.json``), so
that runs share no state. What it runs is TRL 1.16's GRPO as shipped — generation by
plain ``transformers`` ``generate`` (no vLLM), one generation batch per optimizer step
— configured to match the tandem run it is compared with:

* the same model directory, the same task prompts (:class:`runtime.tasks.TaskSet` with
  the spec's seed, prompt count and output cap), sent as plain completion prompts, as
  tandem's actor sends them; step ``k`` trains the prompts of tandem's iteration ``k``
  (:class:`runtime.tasks.TaskPromptSource`, dataset order, no shuffling);
* the same reward on the same text (:meth:`runtime.tasks.TaskSet.reward` of
  :func:`runtime.tasks.completion_text` of each completion's token ids, not of TRL's
  text, which its ``skip_special_tokens`` decode left without the ``<pad>`` and ``<unk>``
  the model emitted), the
  batch shape (``batch_size`` samples = ``batch_size / group_size`` prompts ×
  ``num_generations = group_size``), at most ``max_output_tokens`` new tokens, the
  temperature, learning rate and clip epsilon of the spec, on CPU with ``threads``
  torch threads;
* float32 training without gradient checkpointing, as tandem's trainer: TRL's defaults
  (``bf16=True``, ``gradient_checkpointing=True``) are for GPUs — on this CPU they made
  each step about 5× slower (TRL's own ``step_time`` 1.46 s against 0.30 s at batch 32),
  most of it in backward.

One warm-up step runs off the clock; the ``steps`` steps after it are timed at each
optimizer step's end (:class:`StepClock`), and their samples and completion tokens are
counted by the reward function, which sees every completion's token ids.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from experiments.peers_rates import StepPoint, StepSeries
from runtime.errors import MissingExtra
from runtime.tasks import TaskPromptSource, TaskSet, completion_text

PEERS_INSTALL_HINT = "pip install 'tandem-rl[peers]' (or: pip install 'trl>=1.16')"
WARMUP_STEPS = 1

log = logging.getLogger(__name__)


@dataclass(slots=True, frozen=True)
class TrlJob:
    """What one TRL run trains on, and how; written as JSON for the run's process."""

    model_dir: str
    seed: int
    num_prompts: int
    max_output_tokens: int
    batch_size: int  # samples per optimizer step
    group_size: int  # samples per prompt (TRL's num_generations)
    learning_rate: float
    clip_epsilon: float
    temperature: float
    steps: int  # timed optimizer steps, after the warm-up
    threads: int  # torch threads
    out_dir: str
    tasks: str = "mixed"  # the task set (workload.tasks)

    def save(self, path: Path) -> None:
        path.write_text(json.dumps(asdict(self), indent=2))

    @classmethod
    def load(cls, path: Path) -> TrlJob:
        return cls(**json.loads(path.read_text()))


def require_trl() -> None:
    """Raise :class:`MissingExtra` naming the ``peers`` extra when TRL is not installed."""
    try:
        import datasets  # noqa: F401
        import trl  # noqa: F401
    except ImportError:
        raise MissingExtra(
            f"bench peers runs TRL's GRPOTrainer, which is not installed; {PEERS_INSTALL_HINT}"
        ) from None


def step_prompt_ids(job: TrlJob) -> list[list[int]]:
    """Prompt ids of each step: the warm-up repeats iteration 0, then iterations 0..N-1."""
    tasks = TaskSet(job.seed, job.num_prompts, job.max_output_tokens, mix=job.tasks)
    source = TaskPromptSource(tasks, job.batch_size, job.group_size)
    iterations = [0] * WARMUP_STEPS + list(range(job.steps))
    return [source.prompt_ids(i) for i in iterations]


def dataset_rows(job: TrlJob) -> list[dict[str, Any]]:
    """One row per prompt and step, in step order: ``prompt`` (the plain completion prompt
    tandem sends) and ``prompt_id`` (passed on to the reward function)."""
    tasks = TaskSet(job.seed, job.num_prompts, job.max_output_tokens, mix=job.tasks)
    return [
        {"prompt": tasks[pid].text, "prompt_id": pid} for ids in step_prompt_ids(job) for pid in ids
    ]


class TaskReward:
    """TRL reward function over :meth:`TaskSet.reward`; counts what it scores.

    TRL calls it with the dataset's extra columns as keyword lists (``prompt_id``) and
    with every completion's token ids (up to and with its first ``<eos>``), which it scores
    as tandem's actor does (:func:`completion_text`); :meth:`take` returns and resets the
    counts and the rewards' sum."""

    def __init__(self, tasks: TaskSet) -> None:
        self.__name__ = "task_reward"  # TRL names its reward metrics after it
        self.tasks = tasks
        self.num_samples = 0
        self.completion_tokens = 0
        self.reward_sum = 0.0

    def __call__(
        self, completions: Sequence[str], prompt_id: Sequence[int],
        completion_ids: Sequence[Sequence[int]], **_: Any,
    ) -> list[float]:  # fmt: skip
        self.num_samples += len(completions)
        self.completion_tokens += sum(len(ids) for ids in completion_ids)
        texts = [completion_text(ids) for ids in completion_ids]
        rewards = [self.tasks.reward(int(p), t) for p, t in zip(prompt_id, texts)]
        self.reward_sum += sum(rewards)
        return rewards

    def take(self) -> tuple[int, int, float]:
        counts = (self.num_samples, self.completion_tokens, self.reward_sum)
        self.num_samples = self.completion_tokens = 0
        self.reward_sum = 0.0
        return counts


def _grpo_config(job: TrlJob):  # -> trl.GRPOConfig
    from trl import GRPOConfig

    return GRPOConfig(
        output_dir=job.out_dir, per_device_train_batch_size=job.batch_size,
        gradient_accumulation_steps=1, num_generations=job.group_size,
        max_completion_length=job.max_output_tokens, temperature=job.temperature,
        learning_rate=job.learning_rate, epsilon=job.clip_epsilon,
        max_steps=WARMUP_STEPS + job.steps, use_cpu=True, use_vllm=False,
        shuffle_dataset=False, seed=job.seed, save_strategy="no", logging_strategy="no",
        bf16=False, fp16=False, gradient_checkpointing=False,  # as tandem trains: float32
        report_to="none", disable_tqdm=True, dataloader_num_workers=0,
    )  # fmt: skip


def _step_clock(reward: TaskReward):  # -> StepClock (a transformers.TrainerCallback)
    from transformers import TrainerCallback

    class StepClock(TrainerCallback):
        """Records each optimizer step's end time, this process's CPU seconds then (every
        thread: TRL generates and trains in this one process) and what was scored."""

        def __init__(self) -> None:
            self.points: list[StepPoint] = []
            self.cpu_s: list[float] = []

        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            num_samples, num_tokens, reward_sum = reward.take()
            now = time.perf_counter()
            self.points.append(StepPoint(now, num_samples, num_tokens, reward_sum))
            self.cpu_s.append(time.process_time())

    return StepClock()


def series_of(points: Sequence[StepPoint], cpu_s: Sequence[float] = ()) -> StepSeries:
    """The timed steps after the warm-up, in seconds from the warm-up's end; ``cpu_s``:
    the process's CPU seconds at each step's end (the series' CPU is over the same steps)."""
    if len(points) <= WARMUP_STEPS:
        raise ValueError(f"{len(points)} steps ran: none timed after the warm-up")
    zero = points[WARMUP_STEPS - 1].end_s
    timed = tuple(replace(p, end_s=p.end_s - zero) for p in points[WARMUP_STEPS:])
    cpu = cpu_s[-1] - cpu_s[WARMUP_STEPS - 1] if len(cpu_s) == len(points) else None
    return StepSeries(0.0, timed[-1].end_s, timed, cpu)


def run_trl(job: TrlJob) -> dict[str, Any]:
    """Train ``WARMUP_STEPS + job.steps`` GRPO steps; the result record (JSON-ready)."""
    require_trl()
    import torch
    import trl
    from datasets import Dataset
    from transformers import AutoTokenizer

    torch.set_num_threads(job.threads)
    tasks = TaskSet(job.seed, job.num_prompts, job.max_output_tokens, mix=job.tasks)
    reward = TaskReward(tasks)
    clock = _step_clock(reward)
    trainer = trl.GRPOTrainer(
        model=job.model_dir, reward_funcs=[reward], args=_grpo_config(job),
        train_dataset=Dataset.from_list(dataset_rows(job)),
        processing_class=AutoTokenizer.from_pretrained(job.model_dir), callbacks=[clock],
    )  # fmt: skip
    start = time.perf_counter()
    trainer.train()
    log.info("TRL: %d steps in %.1f s", len(clock.points), time.perf_counter() - start)
    return {
        "series": series_of(clock.points, clock.cpu_s).to_json(),
        "versions": {"trl": trl.__version__, "torch": torch.__version__},
        "torch_threads": torch.get_num_threads(),
        "bf16": trainer.args.bf16,
        "gradient_checkpointing": trainer.args.gradient_checkpointing,
    }


def main(argv: list[str] | None = None) -> int:
    """``python -m experiments.peers_trl JOB.json RESULT.json``."""
    job_path, result_path = (Path(a) for a in (argv or sys.argv[1:]))
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    result = run_trl(TrlJob.load(job_path))
    result_path.write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
