"""Named random streams spawned from one seed: same seed and name ⇒ same draws."""

from __future__ import annotations

import hashlib

import numpy as np


class RngStreams:
    """Hands out one independent ``numpy.random.Generator`` per stream name.

    ``prefix`` is put before every name: :meth:`child` gives a family of streams (e.g.
    ``ranker-fit/workload-prompts``) that shares no draws with the unprefixed ones, so a
    component can redraw a whole workload without touching the run's own draws."""

    def __init__(self, seed: int, prefix: str = "") -> None:
        self.seed = seed
        self.prefix = prefix

    def get(self, name: str) -> np.random.Generator:
        digest = hashlib.sha256((self.prefix + name).encode()).digest()
        key = [int.from_bytes(digest[i : i + 4], "little") for i in range(0, 16, 4)]
        return np.random.default_rng(np.random.SeedSequence(self.seed, spawn_key=key))

    def child(self, name: str) -> RngStreams:
        """The streams ``<prefix><name>/<stream>`` of the same seed."""
        return RngStreams(self.seed, f"{self.prefix}{name}/")
