"""Spec keys that change nothing in a run: a key set away from its default where the spec's
other choices never read it (``policies.elastic.*`` and ``sim.instance_start_s`` under a
``fixed`` allocation, ``policies.predictor_recall`` with the ``oracle`` predictor...).

Such a spec is valid and runs, but the user likely meant something else, so ``tandem run``
and ``tandem sweep`` warn, one line a key (:func:`log_inert_keys`). A key at its default is
never reported: a saved ``spec.yaml`` holds every key, and running it again must not warn.

``live.*`` and the live-only keys elsewhere (``workload.tasks``, ``algorithm.learning_rate``,
``algorithm.clip_epsilon``) are not reported in a simulated run: one spec commonly describes
both runs (``experiments/configs/live-tiny.yaml``), and simulating it first is the usual
check. Likewise the simulator's own keys (``workload.kind`` and its parameters) are not
reported in a live run.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from policies.length_readers import reads_lengths
from policies.spec import RunSpec

log = logging.getLogger(__name__)

Reason = Callable[[RunSpec], str | None]  # why the keys do nothing in this spec, or None


@dataclass(frozen=True, slots=True)
class InertRule:
    """``keys`` do nothing where ``reason`` gives a reason."""

    keys: tuple[str, ...]
    reason: Reason
    simulated_only: bool = False  # the live runtime does not read these keys at all
    live_only: bool = False  # the simulator reads these keys where the live runtime does not


def _not_elastic(spec: RunSpec) -> str | None:
    allocation = spec.policies.allocation
    return None if allocation == "elastic" else f"policies.allocation is {allocation!r}"


def _not_noisy_oracle(spec: RunSpec) -> str | None:
    predictor = spec.policies.length_predictor
    return None if predictor == "noisy-oracle" else f"policies.length_predictor is {predictor!r}"


def _not_skewness_aware(spec: RunSpec) -> str | None:
    dispatch = spec.policies.dispatch
    return None if dispatch == "skewness-aware" else f"policies.dispatch is {dispatch!r}"


def _lengths_unread(spec: RunSpec) -> str | None:
    p = spec.policies
    if reads_lengths(p.dispatch, p.scheduling):
        return None
    return (
        f"policies.dispatch {p.dispatch!r} and policies.scheduling {p.scheduling!r} read "
        "no predicted lengths"
    )


def _kind_is_not(kind: str) -> Reason:
    def reason(spec: RunSpec) -> str | None:
        actual = spec.workload.kind
        return None if actual == kind else f"workload.kind is {actual!r}"

    return reason


def _attached(spec: RunSpec) -> str | None:
    urls = spec.live.server_urls
    if not urls:
        return None
    return f"live.server_urls is set: the run attaches to its {len(urls)} server(s), starts none"


RULES: tuple[InertRule, ...] = (
    InertRule(
        (
            "policies.elastic.max_extra_instances",
            "policies.elastic.gpus_per_step",
            "policies.elastic.retire",
        ),
        _not_elastic,
    ),
    InertRule(("sim.instance_start_s",), _not_elastic, simulated_only=True),  # added instances
    InertRule(("policies.predictor_recall",), _not_noisy_oracle),
    InertRule(("policies.dispatch_objective", "policies.long_tail_fraction"), _not_skewness_aware),
    InertRule(("policies.length_predictor",), _lengths_unread),
    InertRule(
        ("workload.lognormal_median_tokens", "workload.lognormal_sigma"),
        _kind_is_not("lognormal"),
        simulated_only=True,
    ),
    InertRule(
        ("workload.pareto_alpha", "workload.pareto_min_tokens"),
        _kind_is_not("pareto"),
        simulated_only=True,
    ),
    InertRule(("workload.trace_path",), _kind_is_not("trace"), simulated_only=True),
    InertRule(("live.num_servers",), _attached, live_only=True),
)


def _value(spec: RunSpec, key: str) -> object:
    node: object = spec
    for part in key.split("."):
        node = getattr(node, part)
    return node


def _text(value: object) -> str:
    """A value as it is written in YAML (``true``, ``0.5``, ``noisy-oracle``)."""
    if isinstance(value, bool):
        return str(value).lower()
    return str(value)


def inert_keys(spec: RunSpec, live: bool = False) -> list[str]:
    """One line per key of ``spec`` set away from its default that the run never reads:
    the key, its value and why it has no effect."""
    defaults = RunSpec()
    lines = []
    for rule in RULES:
        if (rule.simulated_only and live) or (rule.live_only and not live):
            continue
        changed = [k for k in rule.keys if _value(spec, k) != _value(defaults, k)]
        if changed and (why := rule.reason(spec)) is not None:
            lines += [f"{k}={_text(_value(spec, k))} has no effect: {why}" for k in changed]
    return lines


def log_inert_keys(specs: Iterable[RunSpec], live: bool = False) -> list[str]:
    """Warn once for each inert key line of any of ``specs`` (a sweep's points share most
    of theirs); the lines, in the order first seen."""
    lines = list(dict.fromkeys(line for spec in specs for line in inert_keys(spec, live)))
    for line in lines:
        log.warning("%s", line)
    return lines
