"""Events a pipeline controller receives and commands it answers with.

Executors (the simulator's SimPy processes, the runtime's asyncio tasks) feed events
with their time stamps and carry out the commands; the controller does no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from policies.records import Completion, InflightHandling, InstanceView, Request, StepStats

__all__ = ["InflightHandling"]  # re-exported for the controllers


class Phase(StrEnum):
    GENERATE = "generate"
    TRAIN = "train"


# -- events -------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Start:
    time_s: float


@dataclass(frozen=True, slots=True)
class SampleFinished:
    time_s: float
    completion: Completion


@dataclass(frozen=True, slots=True)
class RequestsAborted:
    """Running requests dropped by an ``abort-resubmit`` weight update, to dispatch again."""

    time_s: float
    instance_id: int
    requests: tuple[Request, ...]


@dataclass(frozen=True, slots=True)
class InstanceLost:
    """A generation instance died: it takes no more work, and ``requests`` (those it was
    running, every one still to be generated) go to the others with their own ids."""

    time_s: float
    instance_id: int
    requests: tuple[Request, ...]


@dataclass(frozen=True, slots=True)
class TrainStepDone:
    time_s: float
    stats: StepStats


@dataclass(frozen=True, slots=True)
class WeightsLoaded:
    time_s: float
    instance_id: int
    version: int


@dataclass(frozen=True, slots=True)
class ContextSwitched:
    time_s: float
    to: Phase


@dataclass(frozen=True, slots=True)
class InstanceAdded:
    """A new instance serves from now on. ``view.version`` is the weights it holds: no
    older than any version pushed before (a push it missed while starting never reaches
    it, and a batch waiting for every instance to hold those weights would wait forever).
    The simulator loads the latest weights as the instance starts; the live runtime adds
    a server at the push that brought it into the weight group.

    ``from_scale_out``: True for the instance whose arrival ends a ``ScaleOut`` (the
    controller's scale-out is done): the last of its instances to arrive or be given up
    on. False for the others, and for a lost instance that was restarted and serves again
    (the live runtime's ``live.restart_servers``), which answers no scale-out. Every
    ``ScaleOut`` ends exactly once: so, or with ``ScaleOutFailed``."""

    time_s: float
    view: InstanceView
    from_scale_out: bool


@dataclass(frozen=True, slots=True)
class ScaleOutFailed:
    """A ``ScaleOut`` ended without its last instance: it could not start, it was lost
    before it joined and did not start again, or the executor cannot add any (attached
    servers); ``reason`` says which, and how many of its instances did arrive (earlier,
    each with ``from_scale_out`` false). The controller no longer waits for it and may
    scale out again at a later step."""

    time_s: float
    reason: str


@dataclass(frozen=True, slots=True)
class InstanceRetired:
    """An instance asked to retire (``ScaleIn``) has finished what it ran and stopped."""

    time_s: float
    instance_id: int


Event = (
    Start
    | SampleFinished
    | RequestsAborted
    | InstanceLost
    | TrainStepDone
    | WeightsLoaded
    | ContextSwitched
    | InstanceAdded
    | ScaleOutFailed
    | InstanceRetired
)

# -- commands -----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Dispatch:
    instance_id: int
    requests: tuple[Request, ...]


@dataclass(frozen=True, slots=True)
class TrainSamples:
    """Forward and backward over these completions, accumulated into optimizer step ``step``."""

    step: int
    completions: tuple[Completion, ...]


@dataclass(frozen=True, slots=True)
class OptimizerStep:
    step: int


@dataclass(frozen=True, slots=True)
class PushWeights:
    """Send weights ``version`` to every generation instance and load them as ``inflight`` says."""

    version: int
    inflight: InflightHandling


@dataclass(frozen=True, slots=True)
class SwitchContext:
    """Colocated only: offload one stage's state and onload the other's."""

    to: Phase


@dataclass(frozen=True, slots=True)
class ScaleOut:
    num_instances: int


@dataclass(frozen=True, slots=True)
class ScaleIn:
    """Retire these instances: they get no more requests, finish the ones they run (no
    request is dropped), then stop; the executor answers ``InstanceRetired`` for each."""

    instance_ids: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Finish:
    pass


Command = (
    Dispatch
    | TrainSamples
    | OptimizerStep
    | PushWeights
    | SwitchContext
    | ScaleOut
    | ScaleIn
    | Finish
)
