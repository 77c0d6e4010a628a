"""Prompt KV is shared only within one weight version.

vLLM caches the KV of full prompt blocks (prefix caching) and hands them to any later
request whose prompt starts with the same tokens and carries the same ``cache_salt``.
An in-flight update (``pause_generation(mode="keep", clear_cache=False)``) must keep the
KV of the sequences it pauses — PipelineRL's in-flight semantics — but a *new* request
after the update must not be conditioned on prompt KV computed with the old weights.

The choice: every request that reaches the engine, on any route (the actor's batch
route and vLLM's OpenAI routes alike), is salted with the weights served when it is
admitted (``tandem-v<version>.l<load>``, prepended to a salt of the caller's own): their
version number and the count of loads this server has made. The version alone was not
enough: a run attached to a long-lived server counts from 0 again, and so does a resumed
one, so update v10, v11, then v10 again reused prompt KV of the first v10's weights. GRPO
siblings of one version still share their prompt's blocks; nothing crosses an update.
Admission waits while an update is being loaded, so a request that arrives during the
pause is salted with the new version. The cost: after every update each prompt's first
request recomputes its full prompt blocks once (siblings and later requests of the same
version hit the cache again); prompts shorter than one block never shared anything.

:func:`prompt_version` then says which version a finished request's prompt KV came
from. A request admitted at version ``s`` but first scheduled after an update (it waited
in vLLM's queue across the update) computed its prompt with the newer weights, unless
it reused salt-``s`` blocks: then the oldest version its prompt KV may come from is
``s``. A sequence preempted by recompute after an update recomputes its KV with the new
weights under its old salt, as its generated tokens are; that is not tracked.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable
from dataclasses import dataclass, field

SALT_PREFIX = "tandem-v"


@dataclass(slots=True, frozen=True)
class ServedWeights:
    """The weights a request is admitted under."""

    version: int  # the number the trainer gave them; may repeat on one server
    load: int = 0  # loads of weights this server had made (0: its checkpoint); never repeats


def version_salt(served: ServedWeights, caller_salt: str | None = None) -> str:
    """The cache salt of a request admitted under ``served`` (the caller's salt kept after it)."""
    salt = f"{SALT_PREFIX}{served.version}.l{served.load}"
    return f"{salt}|{caller_salt}" if caller_salt else salt


def salt_version(salt: str | None) -> int | None:
    """The weight version a :func:`version_salt` names (None for any other salt)."""
    if not salt or not salt.startswith(SALT_PREFIX):
        return None
    head = salt[len(SALT_PREFIX) :].split("|", 1)[0].split(".", 1)[0]
    return int(head) if head.isdigit() else None


def salt_prompt(prompt: object, served: ServedWeights) -> object:
    """Set the weights' salt on an engine input (dict) or an ``EngineCoreRequest``, in
    place; a raw prompt string becomes a text prompt dict. Returns the prompt to pass on."""
    if isinstance(prompt, str):
        return {"prompt": prompt, "cache_salt": version_salt(served)}
    if isinstance(prompt, dict):
        prompt["cache_salt"] = version_salt(served, prompt.get("cache_salt"))
        return prompt
    if hasattr(prompt, "cache_salt"):  # EngineCoreRequest
        prompt.cache_salt = version_salt(served, prompt.cache_salt)
        return prompt
    raise TypeError(f"cannot salt a prompt of type {type(prompt).__name__}")


@dataclass(slots=True)
class VersionHistory:
    """When each weight version started serving, on the system-wide monotonic clock (the
    clock vLLM's engine core stamps ``scheduled_ts`` with)."""

    initial_version: int = 0
    _since_ts: list[float] = field(default_factory=list)
    _versions: list[int] = field(default_factory=list)

    def served(self, version: int, since_ts: float) -> None:
        self._since_ts.append(since_ts)
        self._versions.append(version)

    def version_at(self, ts: float) -> int:
        i = bisect.bisect_right(self._since_ts, ts)
        return self._versions[i - 1] if i else self.initial_version


def prompt_version(salted: int, scheduled: int | None, num_cached_tokens: int | None) -> int:
    """The (oldest) weight version a request's prompt KV was computed with.

    ``salted``: the version it was admitted (and salted) at; ``scheduled``: the version
    served when the engine first scheduled it (None if unknown); ``num_cached_tokens``:
    its prompt tokens that hit the prefix cache."""
    if scheduled is None or scheduled <= salted:
        return salted
    return salted if num_cached_tokens else scheduled


def install_salting(engine: object, admit: Callable) -> None:
    """Route every request the engine admits through ``admit`` (an async callable that
    returns the :class:`ServedWeights` to salt with, waiting while an update is loaded)."""
    original = engine.add_request

    async def add_request(request_id, prompt, *args, **kwargs):
        served = await admit()
        return await original(request_id, salt_prompt(prompt, served), *args, **kwargs)

    engine.add_request = add_request
