"""Test-wide settings: hypothesis profiles (the suite runs on small, shared CI machines).

The default profile is derandomized: every run (a fresh CI clone included, which has no
``.hypothesis`` database) draws the same examples, so a property test cannot pass on one
run and fail on the next. ``HYPOTHESIS_PROFILE=thorough`` runs every property test with
far more examples, drawn at random (and replayed from the local database), to search.
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings
from hypothesis.database import DirectoryBasedExampleDatabase

QUIET = {  # wall time is noisy on a loaded machine; sizes keep examples small
    "deadline": None,
    "suppress_health_check": [HealthCheck.too_slow, HealthCheck.data_too_large],
}
# the same examples on every run (a derandomized profile keeps no database): CI is not flaky
settings.register_profile("default", derandomize=True, **QUIET)
settings.register_profile(
    "thorough",
    max_examples=1000,
    derandomize=False,  # random examples, to search; failures replay from the database
    database=DirectoryBasedExampleDatabase(".hypothesis/examples"),
    **QUIET,
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))
