"""A run keeps the lease of its servers (:mod:`runtime.lease`) while it holds them.

Joins and weight updates renew a server's lease, but a run whose steps are slower than the
lease (a big model, a long tail, a large ``pipeline.push_every``) went silent for longer,
and another run's join took its server in the middle of the run. :func:`keep_leases`
sends ``POST /renew`` with the run's token to each server every third of the lease the
server answers with, from the run's join to its end (the launcher's release stays). A
server that another run holds answers 409 naming it: that is logged once, and that server
is no longer renewed (it serves the other run now; the run's next push to it fails and the
run treats it as lost). A server that does not answer is left to the run's own fault
handling (:mod:`runtime.server_faults`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

import httpx

log = logging.getLogger(__name__)

RENEWALS_PER_LEASE = 3  # a renewal may be lost or late twice before the lease lapses
MIN_RENEW_EVERY_S = 0.1
IDLE_RENEW_EVERY_S = 60.0  # a server without a lease (TANDEM_LEASE_S=0): ask now and then


def renew_every_s(lease_s: float) -> float:
    """Seconds between two renewals of a lease of ``lease_s`` seconds."""
    if lease_s <= 0:
        return IDLE_RENEW_EVERY_S
    return max(MIN_RENEW_EVERY_S, lease_s / RENEWALS_PER_LEASE)


async def keep_leases(
    urls: Callable[[], list[str]], token: str | None, owner: str,
    http: httpx.AsyncClient | None = None,
) -> None:  # fmt: skip
    """Renew ``owner``'s lease on each of ``urls()`` (asked each round: servers come and go)
    until cancelled. ``http``: the client to send with (tests: an ASGI transport)."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    taken: set[str] = set()  # servers another run holds now: no longer renewed
    client = http or httpx.AsyncClient(timeout=5.0)
    try:
        while True:
            lease_s = [await _renew(client, u, headers, owner, taken) for u in urls()]
            await asyncio.sleep(renew_every_s(min((s for s in lease_s if s), default=0.0)))
    finally:
        if http is None:
            await client.aclose()


async def _renew(
    client: httpx.AsyncClient, url: str, headers: dict[str, str], owner: str, taken: set[str]
) -> float | None:
    """One renewal: the server's lease in seconds, or None where it was not renewed."""
    if url in taken:
        return None
    try:
        answer = await client.post(url.rstrip("/") + "/renew", json={"owner": owner},
                                   headers=headers)  # fmt: skip
    except httpx.HTTPError as err:  # a dead server: the run's fault handling sees to it
        log.debug("renewing the lease of %s failed: %s", url, err)
        return None
    if answer.status_code == 409:
        taken.add(url)
        log.warning("%s no longer serves this run: %s", url, _detail(answer))
        return None
    if answer.status_code != 200:  # a server older than the route (404), ...
        log.debug("renewing the lease of %s: %d %s", url, answer.status_code, answer.text)
        return None
    return float(answer.json().get("lease_s") or 0.0)


def _detail(answer: httpx.Response) -> str:
    try:
        return str(answer.json()["error"]["message"])
    except (ValueError, KeyError, TypeError):
        return answer.text


def start_keeping(
    urls: Callable[[], list[str]], token: str | None, owner: str | None
) -> asyncio.Task | None:
    """:func:`keep_leases` as a task of the running loop (None: a run without an owner)."""
    if owner is None:
        return None
    return asyncio.create_task(keep_leases(urls, token, owner))


async def stop_keeping(task: asyncio.Task | None) -> None:
    """Stop renewing (the run ends: its release, or the lease, frees the servers)."""
    if task is None:
        return
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
