"""Control calls to every generation server at once: one thread per server, each
posting one JSON body, so a slow server does not hold up the others' requests (the
trainer's weight-group calls, :mod:`runtime.trainer_proc`)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httpx

from runtime.errors import LiveRunError


@dataclass(slots=True, frozen=True)
class ServerAddr:
    base_url: str  # http://127.0.0.1:8400
    token: str | None
    owner: str | None = None  # the run's id, sent when it joins (runtime.lease)


def _post(
    http: httpx.Client, server: ServerAddr, route: str, body: dict, out: list, i: int,
    timeout_s: float,
) -> None:  # fmt: skip
    headers = {"Authorization": f"Bearer {server.token}"} if server.token else {}
    try:
        resp = http.post(server.base_url + route, json=body, headers=headers, timeout=timeout_s)
        out[i] = resp
    except Exception as err:  # reported by the caller
        out[i] = err


def fan_out(
    http: httpx.Client, servers: list[ServerAddr], route: str, bodies: list[dict],
    timeout_s: float,
) -> tuple[list[threading.Thread], list[Any]]:  # fmt: skip
    """Post ``bodies[i]`` to ``servers[i]``'s ``route``, each in its own thread, now; the
    threads and the list their responses (or errors) land in, for :func:`answers`."""
    out: list[Any] = [None] * len(servers)
    threads = [
        threading.Thread(target=_post, args=(http, s, route, b, out, i, timeout_s), daemon=True)
        for i, (s, b) in enumerate(zip(servers, bodies))
    ]
    for t in threads:
        t.start()
    return threads, out


def answers(threads: list[threading.Thread], out: list, route: str) -> list[dict | str]:
    """Each server's JSON answer, or a one-line reason where it failed."""
    for t in threads:
        t.join()
    results: list[dict | str] = []
    for r in out:
        if isinstance(r, Exception) or r is None:
            results.append(f"{route} failed: {type(r).__name__}: {r}")
        elif r.status_code != 200:
            results.append(f"{route} answered {r.status_code}: {r.text[:500]}")
        else:
            results.append(r.json())
    return results


def join_unless_refused(
    work: Callable[[], None], threads: list[threading.Thread], out: list, route: str
) -> None:
    """Run ``work``, a rendezvous that the servers just posted ``route`` to (:func:`fan_out`)
    must join too (the weight group), then read their answers. A server that answers with
    an error first, and so will not join, ends the wait at once with a
    :class:`LiveRunError` naming it (``work`` is left to its own timeout); before, the
    trainer waited out the rendezvous (60 s) and raised a traceback."""
    failed: list[BaseException] = []

    def run() -> None:
        try:
            work()
        except BaseException as err:  # noqa: BLE001 - raised in the caller's thread
            failed.append(err)

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    while worker.is_alive():
        worker.join(0.05)
        _raise_refusal(out, route)
    if failed:  # the rendezvous failed: a server's answer says why, where it has one
        for t in threads:
            t.join()
        _raise_refusal(out, route)
        raise failed[0]
    join_answers(threads, out, route)


def _raise_refusal(out: list, route: str) -> None:
    for i, r in enumerate(out):
        if isinstance(r, Exception) or (r is not None and r.status_code != 200):
            reason = answers([], [r], route)[0]
            silent = [str(j) for j, other in enumerate(out) if other is None]
            waited = (
                f"; generation server {', '.join(silent)} has not answered {route} (the "
                "group waits for every server)"
                if silent
                else ""
            )
            raise LiveRunError(
                f"generation server {i} did not join the weight group: {reason}{waited}"
            )


def join_answers(threads: list[threading.Thread], out: list, route: str) -> list[dict]:
    """As :func:`answers`, raising on the first server that failed (naming it)."""
    results = answers(threads, out, route)
    for i, r in enumerate(results):
        if isinstance(r, str):
            raise RuntimeError(f"server {i}: {r}")
    return results  # type: ignore[return-value]
