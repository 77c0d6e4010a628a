"""The request and response bodies of the generation server's contract
(:mod:`runtime.server`): each refuses a field it does not know."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


# the longest a join or an update may be given: past it a deadline overflowed (1e300:
# "Python int too large") or came out in the past (1e12: an immediate timeout)
MAX_TIMEOUT_S = 86_400.0
# the most ranks a weight group may have (10**20 failed in the worker: "can't serialize")
MAX_WORLD_SIZE = 65_536


class InitGroupBody(_Body):
    master_addr: str
    master_port: int = Field(ge=1, le=65535)
    rank: int = Field(ge=1, description="this server's rank; the trainer is rank 0")
    world_size: int = Field(ge=2, le=MAX_WORLD_SIZE)
    backend: str = Field("gloo", pattern="^(gloo|nccl)$")  # and one the device runs
    timeout_s: float = Field(60.0, gt=0, le=MAX_TIMEOUT_S)
    owner: str | None = Field(None, max_length=64, description="the run's id (runtime.lease)")


class ReleaseBody(_Body):
    owner: str = Field(max_length=64)


class RenewResponse(_Body):
    owner: str
    lease_s: float  # the holder renews well within this (runtime.lease_keeper)


class ParamBody(_Body):
    name: str
    shape: list[int]
    dtype: str


class BucketBody(_Body):
    dtype: str
    num_tensors: int = Field(ge=1)
    num_bytes: int = Field(ge=0)
    blake2b: str = Field(pattern="^[0-9a-f]{32}$", description="16-byte BLAKE2b, hex")


class WeightUpdateBody(_Body):
    version: int = Field(ge=0)
    params: list[ParamBody] = Field(min_length=1, description="in broadcast order")
    buckets: list[BucketBody] | None = Field(
        None, description="what the sender broadcasts, bucket by bucket; required (verified), "
        "checked after params so that a bad param is named first",
    )  # fmt: skip
    timeout_s: float = Field(
        120.0,
        gt=0,
        le=MAX_TIMEOUT_S,
        description="the route answers within this; the receive gets 3/4 of it",
    )


class UpdateResponse(_Body):
    version: int
    num_tensors: int
    pause_s: float
    stages_ms: dict[str, float]


class HealthResponse(_Body):
    status: str
    version: int
    num_updates: int
    last_pause_s: float | None
    pauses_for_updates: bool  # False: an update loads between two engine steps unpaused
    pid: int  # the server's process: a launcher tells its own server from another's
    owner: str | None  # the run this server serves (runtime.lease); None: free
    free_in_s: float  # until another run may join
    stalled_s: float | None  # holding requests without an engine step this long (503)
    server_id: str  # random, per server process: two URLs that give one id reach one server
    joining: JoiningState | None  # a join under way (it blocks the server); None: none


class JoiningState(_Body):
    """A join the server has taken and not finished (runtime.joining): one at a time."""

    rank: int
    world_size: int
    owner: str | None  # the run that asked; None: a caller that gave no owner
    ends_in_s: float  # the join has succeeded or given up within this, at the latest
