"""Reading a run's record tables back (``samples.parquet``, ``events.parquet``) as rows of
the records they were written from (:meth:`policies.results.RunResult.load`), refusing a
table that lacks a column its record needs by name, where the record's constructor failed
with ``missing 1 required positional argument``."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any


def record_rows(path: Path, record: type) -> list[dict[str, Any]]:
    """The rows of the parquet table at ``path``, plain (:func:`plain`); a ``ValueError``
    naming the file and the columns ``record`` (a dataclass) needs that it lacks."""
    import pandas as pd

    frame = pd.read_parquet(path)
    needed = [
        f.name
        for f in dataclasses.fields(record)
        if f.init and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
    ]
    if missing := [name for name in needed if name not in frame.columns]:
        raise ValueError(
            f"{path}: no column {', '.join(missing)} (a {record.__name__} needs it): not a "
            "table tandem wrote, or one edited since"
        )
    return [plain(row) for row in frame.to_dict("records")]


def plain(row: dict[str, Any]) -> dict[str, Any]:
    """A parquet row with missing values as None, numpy scalars as Python ones and numpy
    arrays (a list column: ``completion_token_ids``) as tuples."""
    return {k: _plain_value(v) for k, v in row.items()}


def _plain_value(value: Any) -> Any:
    import numpy as np
    import pandas as pd

    if isinstance(value, np.ndarray):
        return tuple(value.tolist())
    return None if pd.isna(value) else getattr(value, "item", lambda: value)()
