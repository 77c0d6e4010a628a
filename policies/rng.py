"""Named random streams spawned from one seed: same seed and name ⇒ same draws."""

from __future__ import annotations

import hashlib

import numpy as np


class RngStreams:
    """Hands out one independent ``numpy.random.Generator`` per stream name."""

    def __init__(self, seed: int) -> None:
        self.seed = seed

    def get(self, name: str) -> np.random.Generator:
        digest = hashlib.sha256(name.encode()).digest()
        key = [int.from_bytes(digest[i : i + 4], "little") for i in range(0, 16, 4)]
        return np.random.default_rng(np.random.SeedSequence(self.seed, spawn_key=key))
