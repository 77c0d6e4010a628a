"""A generation server's join of a weight group: how long it may take, its checks, and
the record of a join under way.

A join occupies the server's model worker until it succeeds or gives up: a caller that
disconnects does not cancel it, and a second join meanwhile is refused (409), naming it
on ``/health`` too (:class:`JoinUnderWay`; a run attaching to the server is refused at
once, ``runtime.attach.check_attached``). It has two deadlines
(:mod:`runtime.weight_group`): reaching the master (rank 0's store) within ``connect_s``
(``TANDEM_JOIN_CONNECT_S``, default ``JOIN_CONNECT_S``), so that a stray or aborted
``/init_process_group`` whose master never answers frees the server within seconds; then
the group's rendezvous within the join's ``timeout_s``, which is also the group's
collective timeout.
"""

from __future__ import annotations

import asyncio
import os
import socket
import time
from dataclasses import dataclass

RESOLVE_LIMIT_S = 10.0  # a name server that does not answer: refused, not waited on
# a join's master must answer within this (a trainer listens before it posts the join;
# one that posts first has this long to listen); at most the join's timeout_s
JOIN_CONNECT_S = 10.0
JOIN_CONNECT_ENV = "TANDEM_JOIN_CONNECT_S"  # read by the server; default JOIN_CONNECT_S


def join_connect_s_from_env() -> float:
    """``TANDEM_JOIN_CONNECT_S`` as a positive number of seconds (default ``JOIN_CONNECT_S``)."""
    raw = os.environ.get(JOIN_CONNECT_ENV) or str(JOIN_CONNECT_S)
    try:
        value = float(raw)
    except ValueError:
        value = float("nan")
    if not 0 < value <= 86_400:
        raise ValueError(f"{JOIN_CONNECT_ENV}={raw!r}: expected seconds > 0 (at most a day)")
    return value


def join_limit_s(timeout_s: float, connect_s: float) -> float:
    """The longest a worker's join may take: reaching the master within ``connect_s``,
    then gloo's rendezvous, which waits up to ``timeout_s`` for every rank's address and
    then connects to each (up to ``timeout_s`` more), plus 5 s of slack."""
    return connect_s + 2 * timeout_s + 5.0


@dataclass(slots=True, frozen=True)
class JoinUnderWay:
    """A join the server has taken and not finished: who asked, and by when it ends."""

    rank: int
    world_size: int
    owner: str | None  # the run that asked (runtime.lease); None: a caller without one
    ends_at: float  # time.monotonic() by which the worker has given up, at the latest

    def ends_in_s(self) -> float:
        return max(0.0, self.ends_at - time.monotonic())

    def describe(self) -> str:
        """E.g. ``rank 1 of 2 for owner 3fa2…, ending within 104 s``."""
        return (
            f"rank {self.rank} of {self.world_size} for {joiner(self.owner)}, ending within "
            f"{self.ends_in_s():.0f} s"
        )


def joiner(owner: str | None) -> str:
    """Who sent a join, as refusals name it (``owner``: its run, runtime.lease)."""
    return "a caller that gave no owner" if owner is None else f"owner {owner}"


async def check_resolves(host: str, port: int) -> None:
    """A ``ValueError`` naming ``host`` unless it resolves (the caller names the field):
    before, an unresolvable name failed in the worker after gloo's connect timeouts."""
    loop = asyncio.get_running_loop()
    try:
        async with asyncio.timeout(RESOLVE_LIMIT_S):
            await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError, TimeoutError) as err:
        why = f"not resolved within {RESOLVE_LIMIT_S:g} s" if isinstance(err, TimeoutError) else err
        raise ValueError(f"{host!r} does not resolve ({why})") from None
