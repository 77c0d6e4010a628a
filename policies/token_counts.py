"""Reading users' length tables (traces) and checking their token counts, shared by the
simulator's trace workload and the ranker's traces: the file must hold a CSV or Parquet
table, and a length must be a whole number of tokens >= 1.

Without the check an empty CSV cell became ``-9223372036854775808`` after ``int64`` (numpy
only warns), and a zero, negative or fractional length passed as if it were one. A CSV's
``prompt`` column is read as text: ``NA``, ``null`` and the like stay text, and a blank cell
is the empty string (pandas' default read them all as NaN).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

TEXT_COLUMNS = ("prompt",)


def read_length_table(path: Path, where: str) -> pd.DataFrame:
    """The table in ``path`` (Parquet if it ends in ``.parquet``, else CSV); a ValueError
    starting with ``where`` (the spec key and the file) if it holds no table: without it an
    empty file read "No columns to parse from file", naming neither key nor file."""
    kind = "Parquet" if path.suffix == ".parquet" else "CSV"
    try:
        return pd.read_parquet(path) if kind == "Parquet" else _read_csv(path)
    except pd.errors.EmptyDataError:
        raise ValueError(f"{where}: empty file (no header row, no rows)") from None
    except (ValueError, OSError) as err:  # pandas' ParserError, pyarrow's ArrowInvalid
        reason = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise ValueError(f"{where}: not a {kind} table ({reason})") from None


def _read_csv(path: Path) -> pd.DataFrame:
    frame = pd.read_csv(path)
    text = [c for c in TEXT_COLUMNS if c in frame.columns]
    if text:  # again, without NA detection: only the text columns
        frame[text] = pd.read_csv(path, usecols=text, dtype=str, keep_default_na=False)
    return frame


def check_token_counts(frame: pd.DataFrame, column: str, where: str) -> None:
    """Refuse ``frame[column]`` unless every value is a whole number >= 1; the error starts
    with ``where`` (the file) and names the first bad data row, counted from 1."""
    check_whole_numbers(frame, column, where, minimum=1, unit="of tokens ")


def check_whole_numbers(
    frame: pd.DataFrame, column: str, where: str, minimum: int = 0, unit: str = ""
) -> None:
    """Refuse ``frame[column]`` unless every value is a whole number >= ``minimum`` (an id,
    an iteration); the error is :func:`check_token_counts`'s, ``unit`` after "number"."""
    tokens = pd.to_numeric(frame[column], errors="coerce")
    bad = ~(tokens.notna() & (tokens >= minimum) & (tokens == tokens.round()))
    if not bad.any():
        return
    rows = np.flatnonzero(bad.to_numpy())
    value = frame[column].iloc[rows[0]]
    shown = f"{value:g}" if isinstance(value, (int, float, np.number)) else repr(value)
    more = f" ({len(rows)} bad rows)" if len(rows) > 1 else ""
    raise ValueError(
        f"{where} data row {rows[0] + 1}: {column} {shown} is not a whole number "
        f"{unit}>= {minimum}{more}"
    )
