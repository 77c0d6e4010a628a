"""The names of a run's resources, as ``events.parquet`` and the timelines spell them.

Every span belongs to one resource: a generation instance (``gen-<i>``), the trainer
(``trainer``) or a network link between two datacenters (``link-<a>-<b>``).
"""

from __future__ import annotations

TRAINER = "trainer"
GENERATION_PREFIX = "gen-"
LINK_PREFIX = "link-"


def generation_resource(instance_id: int) -> str:
    return f"{GENERATION_PREFIX}{instance_id}"


def link_resource(source_datacenter: str, target_datacenter: str) -> str:
    return f"{LINK_PREFIX}{source_datacenter}-{target_datacenter}"


def is_generation(resource: str) -> bool:
    return resource.startswith(GENERATION_PREFIX)


def is_link(resource: str) -> bool:
    return resource.startswith(LINK_PREFIX)


def instance_of(resource: str) -> int:
    """The instance id of a generation resource (``gen-3`` -> 3)."""
    return int(resource.removeprefix(GENERATION_PREFIX))
