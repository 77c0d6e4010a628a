"""Servers a run attaches to (``live.server_urls``) and the secrets it reaches them with.

Before its first request a run checks each attached server (:func:`check_attached`): that
it answers, serves no other run (:mod:`runtime.lease`), is not busy in a join
(:mod:`runtime.joining`), is not listed twice under two spellings, and takes the run's
token and API key; at its end it releases them (:func:`release_attached`). The token and
the key come from the spec or the environment, never from a file the run writes.
"""

from __future__ import annotations

import contextlib
import os
import secrets

import httpx

from policies.live_section import LiveSection
from policies.spec import SpecError
from runtime.errors import StartRefused
from runtime.joining import joiner
from runtime.procs import health_json
from runtime.tasks import TaskSet, check_context


def control_token(live: LiveSection) -> str:
    """The run's control-route token: ``live.token``, else ``TANDEM_TOKEN`` (the way to
    attach to ``tandem serve`` without the token on a command line or in spec.yaml), else a
    fresh one for the servers the run starts."""
    return given_token(live) or secrets.token_hex(16)


def given_token(live: LiveSection) -> str | None:
    """The token the user gave (``live.token`` or ``TANDEM_TOKEN``), if any."""
    return live.token or os.environ.get("TANDEM_TOKEN") or None


def inference_key(live: LiveSection) -> str | None:
    """The servers' API key: ``live.api_key``, else ``TANDEM_API_KEY``, else none."""
    return live.api_key or os.environ.get("TANDEM_API_KEY") or None


Shapes = dict[str, tuple[int, ...]]  # a model's parameter names and shapes


class ServerListedTwice(StartRefused, SpecError):
    """Two URLs of ``live.server_urls`` reach one server: a spec error (exit 2), as one URL
    written twice is, and refused before the run started (its directory gets nothing)."""


def check_attached(
    urls: list[str], token: str | None, owner: str | None = None, api_key: str | None = None,
    tasks: TaskSet | None = None, params: Shapes | None = None, timeout_s: float = 5.0,
) -> None:  # fmt: skip
    """Each server of ``live.server_urls`` answers ``/health``, serves no other run than
    ``owner`` (runtime.lease) and is in no join (runtime.joining), takes ``token`` on its
    control routes and ``api_key`` on its inference routes, or a :class:`StartRefused`
    naming the first that does not (before the run waits on a weight group the server
    never joins). The token is tried with a GET of ``/init_process_group``: past the guard that POST route answers 405, at it 401/403;
    the API key with ``GET /v1/models``, whose ``max_model_len`` must hold ``tasks``'
    longest prompt and answer (:func:`runtime.tasks.check_context`); and it serves a model
    with the parameters ``params`` (the trainer's ``model.path``): names and shapes. Two
    URLs that reach one server (the same ``server_id``) are a :class:`ServerListedTwice`."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    key = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    ids: dict[str, int] = {}  # each server's /health server_id: where it was listed first
    for i, url in enumerate(urls):
        base, name = url.rstrip("/"), f"live.server_urls[{i}] {url}"
        try:
            health = httpx.get(base + "/health", timeout=timeout_s)
            control = httpx.get(base + "/init_process_group", headers=headers, timeout=timeout_s)
            models = httpx.get(base + "/v1/models", headers=key, timeout=timeout_s)
        except httpx.HTTPError as err:
            health, control = f"{type(err).__name__}: {err}", None
        if control is None or health.status_code != 200:
            raise StartRefused(
                f"{name} does not answer /health "
                f"({health if control is None else health.status_code}); start it first "
                "(tandem serve MODEL_DIR --port PORT --token SECRET) or drop the key to have "
                "the run start its own servers"
            )
        state = health_json(health)
        _check_once(urls, i, state, ids)
        _check_free(name, state, owner)
        if control.status_code in (401, 403):
            what = "the run's token" if token else "the run, which was given no token"
            raise StartRefused(
                f"{name} refused {what} ({control.status_code} {control.text}); set "
                "live.token (or TANDEM_TOKEN) to the token the server was started with"
            )
        if control.status_code == 404:
            raise StartRefused(
                f"{name} has no /init_process_group: not a tandem server (tandem serve)"
            )
        if models.status_code in (401, 403):
            raise StartRefused(
                f"{name} refused the run's API key ({models.status_code}); set live.api_key (or "
                "TANDEM_API_KEY) to the key the server was started with (--api-key)"
            )
        if tasks is not None and (context := _max_model_len(models)) is not None:
            try:
                check_context(tasks, context, f"{name}'s max_model_len")
            except ValueError as err:
                raise StartRefused(f"{err} (tandem serve --max-model-len)") from None
        if params is not None:
            served = httpx.get(base + "/v1/tandem/params", headers=key, timeout=timeout_s)
            if served.status_code == 200:  # (a server older than the route: its updates check)
                _check_params(name, params, _shapes(served))


def _check_once(urls: list[str], i: int, state: dict, ids: dict[str, int]) -> None:
    """A :class:`ServerListedTwice` when ``urls[i]`` reaches a server an earlier URL of
    ``live.server_urls`` reached under another spelling (``localhost`` and ``127.0.0.1``):
    the same ``server_id`` on ``/health``. Before, its second join was refused (409) after
    the trainer had loaded. ``ids``: the ids seen so far, updated."""
    server_id = state.get("server_id")
    if not isinstance(server_id, str):  # a server older than the field: not told apart
        return
    if server_id in ids:
        first = ids[server_id]
        raise ServerListedTwice(
            f"live.server_urls: server_urls[{i}] {urls[i]} is server_urls[{first}] "
            f"{urls[first]} again (both answer as server {server_id}, pid {state.get('pid')}): "
            "a server joins a run's weight group once; list each server once"
        )
    ids[server_id] = i


def _check_free(name: str, state: dict, owner: str | None) -> None:
    """A :class:`StartRefused` when the server ``/health`` describes (``state``) serves
    another run (runtime.lease), or is busy in a join (runtime.joining): any join under way
    now is not this run's, and the server takes one at a time."""
    held, free_in_s = state.get("owner"), state.get("free_in_s")
    if held not in (None, owner) and (free_in_s or 0) > 0:
        raise StartRefused(
            f"{name} serves another run (owner {held}; free when that run ends, or in "
            f"{free_in_s:.0f} s if it died): give this run a server of its own"
        )
    joining = state.get("joining")
    if isinstance(joining, dict):
        who = _joiner(joining.get("owner"), owner)
        raise StartRefused(
            f"{name} is busy joining a weight group (rank {joining.get('rank')} of "
            f"{joining.get('world_size')}, for {who}; a stray or aborted /init_process_group "
            "blocks the server until it ends): it is free again within "
            f"{joining.get('ends_in_s', 0):.0f} s; wait for it or give this run another server"
        )


def _joiner(sender: str | None, owner: str | None) -> str:
    """Who sent a join under way, as the refusal names it."""
    if sender is not None and sender == owner:  # an earlier start stopped while it joined
        return f"{joiner(sender)}, an earlier start of this run"
    return joiner(sender)


def _shapes(answer: httpx.Response) -> Shapes:
    try:
        return {str(n): tuple(int(d) for d in shape) for n, shape in answer.json()["params"]}
    except (ValueError, KeyError, TypeError):
        return {}


def _check_params(name: str, params: Shapes, served: Shapes) -> None:
    """The trainer's model against the one ``name`` serves (else the pushes would set only
    the parameters they share, and the run train one model on another's samples)."""
    if served == params:
        return
    only_ours = [n for n in params if n not in served]
    only_served = [n for n in served if n not in params]
    reshaped = [n for n in params if n in served and served[n] != params[n]]
    if only_ours or only_served:
        first = (only_ours or only_served)[0]
        where = "model.path" if only_ours else "the served model"
        differs = f"{len(params)} parameters against {len(served)}; {first!r} only in {where}"
    else:
        first = reshaped[0]
        differs = f"{first!r} is {list(params[first])} against {list(served[first])} served"
    raise StartRefused(
        f"{name} serves another model than model.path ({differs}); serve the run's model "
        "(tandem serve MODEL_DIR) or set model.path to the served one"
    )


def _max_model_len(models: httpx.Response) -> int | None:
    """The context length a ``GET /v1/models`` answer gives for the served model, if any."""
    try:
        return int(models.json()["data"][0]["max_model_len"])
    except (ValueError, KeyError, IndexError, TypeError):
        return None


def release_attached(urls: list[str], token: str | None, owner: str | None) -> None:
    """Tell each attached server that the run ``owner`` ended (``POST /release``), so that
    the next run may join it at once; a server that does not answer is left to its lease."""
    if owner is None:
        return
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    for url in urls:
        with contextlib.suppress(httpx.HTTPError):
            httpx.post(
                url.rstrip("/") + "/release", json={"owner": owner}, headers=headers, timeout=5.0
            )
