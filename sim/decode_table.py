"""A measured decode table (``sim.cost_model: profiled:TABLE.csv``), read and checked.

The table has ``batch_size`` and ``decode_step_ms`` columns (StreamRL's ``ptl_7b_h800.csv``
is one), one row per batch size, and may say what it measured in the columns ``model``,
``hardware`` and ``tp`` (the same value on every row, as calibration data keyed by
model and hardware): each one present is checked against the spec, and a run of another
model, generation hardware or tensor-parallel size is refused. A table without them (an
older one, StreamRL's) still loads, with a warning that it is not checked.
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pandas as pd

from policies.spec import RunSpec

log = logging.getLogger(__name__)

COLUMNS = ("batch_size", "decode_step_ms")
SETUP_COLUMNS = ("model", "hardware", "tp")  # optional: what the table measured


def read_decode_table(path: Path, key: str = "sim.cost_model") -> pd.DataFrame:
    """``path``'s rows sorted by batch size; a ValueError naming ``key``, the file, the row
    (1 = the first row under the header) and the column of anything that is not a
    positive finite number, a batch size that is not a whole number, a repeated batch
    size, or a table with no rows."""
    try:
        frame = pd.read_csv(path)
    except (pd.errors.EmptyDataError, pd.errors.ParserError, UnicodeDecodeError) as err:
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


def check_decode_table_setup(frame: pd.DataFrame, path: Path, spec: RunSpec) -> None:
    """Refuse a table whose ``model``, ``hardware`` or ``tp`` column holds another value than
    the spec's ``model.name``, a generation pool's hardware (any case) or tp, naming the
    spec key, the file and the column; or holds more than one value (a table measures one
    configuration). Warn, naming the file, of the setup columns the table lacks."""
    in_file_order = frame.sort_index()
    setup = {c: _one_value(in_file_order, c, path) for c in SETUP_COLUMNS if c in frame.columns}
    if "model" in setup and setup["model"] != spec.model.name:
        raise ValueError(_differs("model.name", spec.model.name, path, "model", setup["model"]))
    tp = _tp(setup["tp"], path) if "tp" in setup else None
    for i, pool in enumerate(spec.cluster.generation):
        if "hardware" in setup and pool.hardware.lower() != setup["hardware"].lower():
            key = f"cluster.generation.{i}.hardware"
            raise ValueError(_differs(key, pool.hardware, path, "hardware", setup["hardware"]))
        if tp is not None and pool.tp != tp:
            raise ValueError(_differs(f"cluster.generation.{i}.tp", pool.tp, path, "tp", str(tp)))
    missing = [c for c in SETUP_COLUMNS if c not in setup]
    if missing:
        log.warning(
            "sim.cost_model: %s has no column(s) %s, so it is not checked against the spec's "
            "model, generation hardware and tp (add them, one value on every row: "
            "docs/fidelity.md)",
            path, ", ".join(missing),
        )  # fmt: skip


def _one_value(frame: pd.DataFrame, column: str, path: Path) -> str:
    """The one value of ``column`` on every row, as text; a ValueError naming the row that
    differs from the first, or an empty cell."""
    values = frame[column].astype(str).str.strip()
    for row, (value, empty) in enumerate(zip(values, frame[column].isna() | (values == ""))):
        if empty:
            raise ValueError(f"sim.cost_model: {path}: row {row + 1}, column {column}: empty")
        if value != values.iloc[0]:
            raise ValueError(
                f"sim.cost_model: {path}: row {row + 1}, column {column}: {value!r}, but row "
                f"1 says {values.iloc[0]!r} (a decode table measures one model, hardware and "
                "tp: one value on every row)"
            )
    return values.iloc[0]


def _tp(value: str, path: Path) -> int:
    try:
        tp = float(value)
    except ValueError:
        tp = 0.0
    if not (tp >= 1 and tp.is_integer()):
        raise ValueError(f"sim.cost_model: {path}: column tp: {value!r} is not a whole number >= 1")
    return int(tp)


def _differs(key: str, spec_value: object, path: Path, column: str, value: str) -> str:
    return (
        f"{key}: {spec_value!r}, but the decode table {path} was measured with {column} "
        f"{value!r} (its column {column}); measure a table for this setup, or use a "
        "roofline cost model"
    )
