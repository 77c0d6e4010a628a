"""A generation/trainer split the user gave that ``policies.allocation: balanced`` replaces.

``balanced`` (:class:`policies.allocation.BalancedAllocation`) re-splits the GPUs of one
datacenter's pool between generation and training, so ``cluster.generation.N.num_gpus``
and ``cluster.trainer.num_gpus`` set only the pool's total there; across datacenters (or
hardware) each is the most its stage gets, the faster stage being shrunk. A simulated run
(``tandem run``) or sweep given such a key warns, one line (:func:`replaced_split`).

"Given" means named by the command line (``--set``, a ``--grid`` axis), directly or in a
section it sets: a spec file's own counts are the config's, and a saved ``spec.yaml`` holds
the split that ran, so running either again must not warn. The live runtime does not
re-split, and a colocated mode runs both stages on every GPU before any allocation: no
warning for those.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from typing import Any

from policies.modes import MODES
from policies.results import split_metrics
from policies.spec import RunSpec, parse_override

SPLIT_KEY = re.compile(r"^cluster\.(generation\.\d+|trainer)\.num_gpus$")
FIXED_HINT = "--set policies.allocation=fixed keeps the split given"
RAN = "the split that ran: generation_gpus, trainer_gpus in the metrics"


def _flat(path: str, value: Any) -> list[str]:
    """Every key ``value`` sets under ``path`` (list items by index)."""
    if isinstance(value, dict):
        return [k for key, v in value.items() for k in _flat(f"{path}.{key}", v)]
    if isinstance(value, list):
        return [k for i, v in enumerate(value) for k in _flat(f"{path}.{i}", v)]
    return [path]


def split_keys_given(overrides: Iterable[str]) -> list[str]:
    """The ``cluster.generation.N.num_gpus`` / ``cluster.trainer.num_gpus`` keys the
    ``key=value`` ``overrides`` set, directly or inside a section they set, in order."""
    keys = []
    for text in overrides:
        path, value = parse_override(text, RunSpec)
        keys += [k for k in _flat(".".join(path), value) if SPLIT_KEY.match(k)]
    return list(dict.fromkeys(keys))


def _resplits(spec: RunSpec) -> bool:
    """Whether ``balanced`` re-splits a simulated run of ``spec``."""
    mode = MODES.get(spec.pipeline.mode)
    return spec.policies.allocation == "balanced" and not mode.colocated


def _one_place(spec: RunSpec) -> bool:
    pool, trainer = spec.cluster.generation[0], spec.cluster.trainer
    return (pool.datacenter, pool.hardware) == (trainer.datacenter, trainer.hardware)


def _total_gpus(spec: RunSpec) -> int:
    return sum(split_metrics(spec.cluster).values())


def replaced_split(specs: Sequence[RunSpec], keys: Sequence[str]) -> list[str]:
    """The warnings for ``keys`` (:func:`split_keys_given`) given to runs of ``specs`` (a
    run's one, or a sweep's points): a line for the points ``balanced`` re-splits in one
    place, naming the totals, and one for those it shrinks across places; none if no key
    was given or no spec re-splits."""
    named = " and ".join(keys)
    verb, are = ("sets", "is") if len(keys) == 1 else ("set", "are")
    resplit = [s for s in specs if _resplits(s)] if keys else []
    lines = []
    if totals := sorted({_total_gpus(s) for s in resplit if _one_place(s)}):
        lines.append(
            f"{named} under policies.allocation balanced {verb} only the pool's total "
            f"({', '.join(map(str, totals))} GPUs): balanced picks the generation/trainer "
            f"split ({RAN}); {FIXED_HINT}"
        )
    if any(not _one_place(s) for s in resplit):
        lines.append(
            f"{named} under policies.allocation balanced, with generation and training in "
            f"different datacenters or on different hardware, {are} the most a stage gets: "
            f"balanced shrinks the faster stage ({RAN}); {FIXED_HINT}"
        )
    return lines
