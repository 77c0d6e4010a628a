"""Typed records passed between stages, shared by the simulator and the live runtime.

Times are seconds from the run's start; a time not yet known is ``None``, never 0.
Weight versions count optimizer steps: version ``v`` is the policy after ``v`` steps.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class FinishReason(StrEnum):
    STOP = "stop"
    LENGTH = "length"
    ABORT = "abort"


class InflightHandling(StrEnum):
    """What a generation instance does with running requests when new weights arrive."""

    KEEP = "keep"  # pause, load, resume: sequences keep their KV cache (PipelineRL)
    ABORT_RESUBMIT = "abort-resubmit"  # abort running requests, load, resubmit them
    DRAIN = "drain"  # stop admitting, finish running requests, then load
    BARRIER = "barrier"  # load only when the instance is idle (between iterations)


class SpanKind(StrEnum):
    PREFILL = "prefill"
    DECODE = "decode"
    TRAIN = "train"
    WEIGHT_SYNC = "weight_sync"
    CONTEXT_SWITCH = "context_switch"
    IDLE = "idle"


@dataclass(slots=True, frozen=True)
class Request:
    """One sample to generate: a prompt of a group, with its predicted output length."""

    sample_id: int
    prompt_id: int
    group_id: int
    iteration: int
    prompt_tokens: int
    max_tokens: int
    predicted_tokens: float | None = None
    prompt: str | None = None  # the prompt text (live); None in the simulator

    def with_prediction(self, predicted_tokens: float | None) -> Request:
        """This request with ``predicted_tokens``: ``dataclasses.replace`` at a tenth of
        its cost (once a sample, hot at scale); every field is passed on."""
        return Request(
            self.sample_id, self.prompt_id, self.group_id, self.iteration,
            self.prompt_tokens, self.max_tokens, predicted_tokens, self.prompt,
        )  # fmt: skip


@dataclass(slots=True)
class Completion:
    """A finished (or aborted) generation of one request."""

    request: Request
    instance_id: int
    output_tokens: int
    finish_reason: FinishReason
    version_start: int
    version_end: int
    dispatch_s: float
    gen_start_s: float | None
    gen_end_s: float | None
    token_ids: tuple[int, ...] | None = None  # live only
    logprobs: tuple[float, ...] | None = None  # sampling log-probs (live only)
    reward: float | None = None  # verifiable reward (live only)
    version_prompt: int | None = None  # weights its prompt KV came from; None: version_start
    text: str | None = None  # the text the reward scored (live only)

    @property
    def sample_id(self) -> int:
        return self.request.sample_id

    @property
    def prompt_version(self) -> int:
        """The (oldest) weight version the sample's prompt KV was computed with."""
        return self.version_start if self.version_prompt is None else self.version_prompt


@dataclass(slots=True)
class Discarded:
    """Work ``abort-resubmit`` weight updates threw away (on one instance, or a run's)."""

    num_requests: int = 0  # running requests aborted (one aborted twice counts twice)
    num_output_tokens: int = 0  # output tokens they had decoded (then decoded again)

    def add(self, num_requests: int, num_output_tokens: int) -> None:
        self.num_requests += num_requests
        self.num_output_tokens += num_output_tokens


@dataclass(slots=True)
class InstanceView:
    """What a policy may see of a generation instance."""

    instance_id: int
    hardware: str
    tp: int
    datacenter: str
    max_num_seqs: int
    kv_capacity_tokens: int
    num_assigned: int = 0  # dispatched and not yet finished
    assigned_tokens: float = 0.0  # predicted output tokens of the assigned requests
    version: int = 0  # weight version loaded

    @property
    def num_running(self) -> int:
        return min(self.num_assigned, self.max_num_seqs)

    @property
    def num_queued(self) -> int:
        return max(0, self.num_assigned - self.max_num_seqs)

    @property
    def num_free_slots(self) -> int:
        return max(0, self.max_num_seqs - self.num_assigned)


@dataclass(slots=True)
class StepStats:
    """What the trainer reports after an optimizer step."""

    step: int
    version: int  # weight version produced by this step (step + 1)
    num_samples: int
    num_tokens: int
    start_s: float
    end_s: float
    loss: float | None = None
    mean_reward: float | None = None
    mean_lag: float | None = None
    ess: float | None = None  # effective sample size of the importance weights
    busy_s: float | None = None  # trainer compute time of the step (no waits); None: unknown
    kl: float | None = None  # mean KL to the reference model (kl_coef > 0); None: unknown
    clip_fraction: float | None = None  # share of tokens whose importance weight was clipped
    num_skipped: int = 0  # samples not forwarded: advantage exactly 0 (live.skip_zero_advantage)


@dataclass(slots=True)
class SampleRecord:
    """One row of ``samples.parquet``."""

    sample_id: int
    prompt_id: int
    group_id: int
    iteration: int
    instance_id: int
    prompt_tokens: int
    output_tokens: int
    predicted_output_tokens: float | None
    dispatch_s: float
    gen_start_s: float | None
    gen_end_s: float | None
    train_step: int | None
    version_start: int
    version_end: int
    version_trained: int | None
    reward: float | None
    version_prompt: int | None = None  # weights its prompt KV came from (>= version_start)
    completion_text: str | None = None  # what the reward scored (live only)
    completion_token_ids: tuple[int, ...] | None = None  # generated, <eos> included (live)

    @property
    def staleness(self) -> int | None:
        """Versions between the oldest weights the sample depends on and those it trained."""
        if self.version_trained is None:
            return None
        oldest = self.version_start if self.version_prompt is None else self.version_prompt
        return self.version_trained - oldest

    @classmethod
    def from_completion(
        cls, c: Completion, iteration: int | None = None, train_step: int | None = None
    ) -> SampleRecord:
        """The row of a completion; trained into ``train_step`` (with that version) if given."""
        r = c.request
        return cls(
            sample_id=r.sample_id,
            prompt_id=r.prompt_id,
            group_id=r.group_id,
            iteration=r.iteration if iteration is None else iteration,
            instance_id=c.instance_id,
            prompt_tokens=r.prompt_tokens,
            output_tokens=c.output_tokens,
            predicted_output_tokens=r.predicted_tokens,
            dispatch_s=c.dispatch_s,
            gen_start_s=c.gen_start_s,
            gen_end_s=c.gen_end_s,
            train_step=train_step,
            version_start=c.version_start,
            version_end=c.version_end,
            version_trained=train_step,
            reward=c.reward,
            version_prompt=c.prompt_version,
            completion_text=c.text,
            completion_token_ids=c.token_ids,
        )


@dataclass(slots=True)
class Span:
    """One row of ``events.parquet``: a resource doing one kind of thing for a while."""

    resource: str  # gen-<i>, trainer, link-<a>-<b>
    kind: SpanKind
    start_s: float
    end_s: float
    iteration: int | None = None
    batch_size: int | None = None


@dataclass(slots=True, frozen=True)
class TraceRequest:
    """One request of a scheduler trace: fixed prompt and output lengths (``ignore_eos``)."""

    prompt_tokens: int
    output_tokens: int
    prompt_group: int  # requests of one group have the same prompt (GRPO siblings)
    priority: float = 0.0


@dataclass(slots=True, frozen=True)
class SchedulerStep:
    """What one engine step scheduled (a real vLLM engine's, or the simulator's)."""

    num_requests: int  # requests computing in this step
    num_tokens: int  # tokens they compute (one per decode, a chunk per prefill)
    num_new: int  # requests scheduled for the first time
    num_preempted: int  # requests preempted in this step
