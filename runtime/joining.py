"""A generation server's join of a weight group: how long it may take, its checks, and
the record of a join under way.

A join occupies the server's model worker until it succeeds or gives up
(:func:`join_limit_s`): a caller that disconnects does not cancel it, and a second join
meanwhile is refused (409). So a stray or aborted ``/init_process_group`` (one whose
master never answers) blocks the server for up to that limit; ``/health`` says so
(:class:`JoinUnderWay`), and a run attaching to the server is refused at once, naming it
(``runtime.attach.check_attached``), instead of failing after its trainer loaded.
"""

from __future__ import annotations

import asyncio
import socket
import time
from dataclasses import dataclass

RESOLVE_LIMIT_S = 10.0  # a name server that does not answer: refused, not waited on


def join_limit_s(timeout_s: float) -> float:
    """The longest a worker's join may take: gloo's store client tries to connect twice,
    each for up to ``timeout_s``, with a back-off below ``timeout_s`` between (a port where
    nothing listens, timeout 3 s: 5.5 s idle, over 8 s on a busy machine), then the
    group's rendezvous may take ``timeout_s`` more."""
    return 3 * timeout_s + 5.0


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
