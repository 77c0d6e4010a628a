"""Which run a generation server serves: one at a time.

Two runs attached to one ``tandem serve`` (``live.server_urls``) both joined its weight
group and both pushed weights: each run's samples came partly from the other run's
weights (a mean staleness of -2.4 in one run), at ~1 sample/s, and both exited 0. Now a
run names itself (its *owner* id, :func:`owner_of`: the same for a run directory and its
resume) when it joins, and the server keeps a :class:`RunLease`:

* ``/init_process_group`` from another owner is refused (409) while the lease is held;
  a join that succeeds claims it, one that fails leaves it as it was;
* only control routes (the token, :mod:`runtime.guard`) take or renew it: the holder's
  joins, weight updates and ``POST /renew`` (:meth:`RunLease.renew_by`), which a run
  sends every third of the lease while it holds the server (:mod:`runtime.lease_keeper`),
  so that a run whose steps are slower than the lease keeps it too. Generation (``/v1/tandem/generate``, vLLM's routes) is an
  inference route, open without a token, so it never touches the lease: before, any
  caller's generate request renewed it, and kept a dead run's hold alive for ever;
* the holder's end releases it (``POST /release``), and a holder that died frees it
  ``TANDEM_LEASE_S`` seconds (default 300) after its last join, update or renewal;
* ``/health`` gives the holder and the seconds until the lease is free, so that a run
  attaching to the server is refused at once, by name (``runtime.attach.check_attached``).
"""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

LEASE_ENV = "TANDEM_LEASE_S"
DEFAULT_LEASE_S = 300.0


def owner_of(run_dir: str | Path) -> str:
    """A run's owner id: from its directory, so that a resumed run takes its server back."""
    return hashlib.sha256(str(Path(run_dir).resolve()).encode()).hexdigest()[:16]


def lease_s_from_env() -> float:
    raw = os.environ.get(LEASE_ENV, "").strip()
    try:
        value = float(raw) if raw else DEFAULT_LEASE_S
    except ValueError:
        raise ValueError(f"{LEASE_ENV}={raw!r}: expected seconds (a number >= 0)") from None
    if not value >= 0:
        raise ValueError(f"{LEASE_ENV}={raw!r}: expected seconds (a number >= 0)")
    return value


class LeaseHeld(ValueError):
    """Another run holds the server."""


@dataclass(slots=True)
class RunLease:
    lease_s: float = DEFAULT_LEASE_S
    clock: Callable[[], float] = time.monotonic
    owner: str | None = None  # the run whose weight group this is (None: free)
    seen_s: float = field(default=0.0)  # the holder's last call, on ``clock``

    def free_in_s(self) -> float:
        """Seconds until another run may join (0: now)."""
        if self.owner is None:
            return 0.0
        return max(0.0, self.lease_s - (self.clock() - self.seen_s))

    def check(self, owner: str | None) -> None:
        """A :class:`LeaseHeld` naming the holder while a run other than ``owner`` holds it."""
        if self.owner is not None and owner != self.owner and self.free_in_s() > 0:
            raise LeaseHeld(
                f"this server serves another run (owner {self.owner}, last call "
                f"{self.clock() - self.seen_s:.0f} s ago); it is free when that run ends, or "
                f"{self.free_in_s():.0f} s from now if it died ({LEASE_ENV} on the server)"
            )

    def claim(self, owner: str | None) -> None:
        """``owner`` has joined: it holds the server from now (after :meth:`check`)."""
        self.check(owner)
        self.owner, self.seen_s = owner, self.clock()

    def renew(self) -> None:
        """The holder pushed a weight update (a control call: token checked)."""
        if self.owner is not None:
            self.seen_s = self.clock()

    def renew_by(self, owner: str | None) -> None:
        """``owner`` says it is alive (a control call: token checked): a :class:`LeaseHeld`
        naming the holder unless ``owner`` holds the lease (a lapsed one no other run took
        is its still)."""
        if owner is None or owner != self.owner:
            held = "nobody" if self.owner is None else f"owner {self.owner}"
            raise LeaseHeld(
                f"owner {owner} does not hold this server ({held} does): join it again to hold it"
            )
        self.seen_s = self.clock()

    def release(self, owner: str | None) -> bool:
        """The holder ended: the server is free at once. False for any other caller."""
        if owner is None or owner != self.owner:
            return False
        self.owner = None
        return True
