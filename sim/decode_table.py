"""A measured decode table (``sim.cost_model: profiled:TABLE.csv``), read and checked.

The table has ``batch_size`` and ``decode_step_ms`` columns (StreamRL's ``ptl_7b_h800.csv``
is one), one row per batch size. It names neither model nor hardware, so nothing checks
that it belongs to the spec's: the run's summary says the decode steps come from it.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

COLUMNS = ("batch_size", "decode_step_ms")


def read_decode_table(path: Path, key: str = "sim.cost_model") -> pd.DataFrame:
    """``path``'s rows sorted by batch size; a ValueError naming ``key``, the file, the row
    (1 = the first row under the header) and the column of anything that is not a
    positive finite number, a batch size that is not a whole number, a repeated batch
    size, or a table with no rows."""
    try:
        frame = pd.read_csv(path)
    except (pd.errors.EmptyDataError, pd.errors.ParserError) as err:
        raise ValueError(f"{key}: {path}: not a CSV table ({str(err).strip()})") from None
    missing = [c for c in COLUMNS if c not in frame.columns]
    if missing:
        raise ValueError(
            f"{key}: {path}: missing column(s) {', '.join(missing)} (a decode table has "
            f"{', '.join(COLUMNS)})"
        )
    if frame.empty:
        raise ValueError(f"{key}: {path}: no rows under the header (a decode table needs 1+)")
    for column in COLUMNS:
        values = pd.to_numeric(frame[column], errors="coerce").to_numpy(float)
        bad = ~(np.isfinite(values) & (values > 0))
        if column == "batch_size":
            bad |= np.isfinite(values) & (values != np.round(values))
        if bad.any():
            row = int(np.argmax(bad))
            raise ValueError(
                f"{key}: {path}: row {row + 1}, column {column}: {frame[column].iloc[row]} "
                f"is not a positive {'whole ' if column == 'batch_size' else ''}number"
            )
        frame[column] = values
    repeated = frame["batch_size"].duplicated()
    if repeated.any():
        row = int(np.argmax(repeated.to_numpy()))
        raise ValueError(
            f"{key}: {path}: row {row + 1}, column batch_size: batch size "
            f"{int(frame['batch_size'].iloc[row])} appears twice (one row per batch size)"
        )
    return frame.sort_values("batch_size")
