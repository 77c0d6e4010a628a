"""Test-wide settings: hypothesis profiles (the suite runs on small, shared CI machines).

``HYPOTHESIS_PROFILE=thorough`` runs every property test with ten times more examples.
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

settings.register_profile(
    "default",
    deadline=None,  # wall time is noisy on a loaded machine; sizes keep examples small
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.register_profile(
    "thorough",
    parent=settings.get_profile("default"),
    max_examples=1000,
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))
