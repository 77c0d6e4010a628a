"""Checks on token counts read from users' files (trace lengths), shared by the simulator's
trace workload and the ranker's traces: a length must be a whole number of tokens >= 1.

Without the check an empty CSV cell became ``-9223372036854775808`` after ``int64`` (numpy
only warns), and a zero, negative or fractional length passed as if it were one.
"""

from __future__ import annotations

import numpy as np
import pandas as pd


def check_token_counts(frame: pd.DataFrame, column: str, where: str) -> None:
    """Refuse ``frame[column]`` unless every value is a whole number >= 1; the error starts
    with ``where`` (the file) and names the first bad data row, counted from 1."""
    tokens = pd.to_numeric(frame[column], errors="coerce")
    bad = ~(tokens.notna() & (tokens >= 1) & (tokens == tokens.round()))
    if not bad.any():
        return
    rows = np.flatnonzero(bad.to_numpy())
    value = frame[column].iloc[rows[0]]
    shown = f"{value:g}" if isinstance(value, (int, float, np.number)) else repr(value)
    more = f" ({len(rows)} bad rows)" if len(rows) > 1 else ""
    raise ValueError(
        f"{where} data row {rows[0] + 1}: {column} {shown} is not a whole number of "
        f"tokens >= 1{more}"
    )
