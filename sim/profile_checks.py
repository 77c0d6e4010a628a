"""Checks of a profile before ``tandem calibrate`` fits it (format: docs/fidelity.md).

Each check raises a ValueError naming the file, the row (1 = the first row under the
header) and the column, or returns warnings for what is legal but implausible. A profile
that fits without complaint can still be wrong; these catch what a fit would hide: a
negative or zero duration, a batch of -1 sequences, milliseconds in a seconds column, a
table measured at one size, which cannot separate a fixed cost from a per-unit cost.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path

import pandas as pd

from policies.profile_source import ProfiledSetup
from sim.tables import Hardware, hardware_table

PROFILE_KEYS = ("weight_bytes", "kv_capacity_tokens")  # profile.json numbers the model keeps
SETUP_SECTIONS = ("model", "hardware", "trainer")  # profile.json objects of what it measured
CPU = "cpu"  # a CPU profile's hardware (hardware.csv lists GPUs only)

# the smallest value each input column may hold
INPUT_FLOORS = {"batch_size": 1, "num_tokens": 1, "num_bytes": 1, "context_tokens": 0}
WHOLE_COLUMNS = ("batch_size", "num_tokens", "num_bytes")
# a decode step above this is no engine's (a tiny model on two CPU cores takes ~10 ms)
MAX_PLAUSIBLE_DECODE_STEP_S = 2.0


def check_measurements(frame: pd.DataFrame, target: str, inputs: list[str], source: str) -> None:
    """Every ``target`` value a positive duration (or factor), every input at least its
    floor (whole where it counts things)."""
    for row, value in enumerate(frame[target]):
        if value <= 0:
            raise ValueError(
                f"{source}: row {row + 1}, column {target}: {value!r} is not positive (a "
                "measured time in seconds, or a slowdown factor; a differential timing "
                "swamped by noise comes out <= 0: profile again)"
            )
    for column in inputs:
        floor = INPUT_FLOORS.get(column, 0)
        for row, value in enumerate(frame[column]):
            whole = column not in WHOLE_COLUMNS or float(value).is_integer()
            if value < floor or not whole:
                kind = "a whole number" if column in WHOLE_COLUMNS else "a number"
                raise ValueError(
                    f"{source}: row {row + 1}, column {column}: {value!r} is not {kind} >= {floor}"
                )


# what a fit's per-unit term of each input column is per, and what to profile more of
PER_UNIT = {
    "batch_size": ("sequence", "batch sizes"),
    "num_tokens": ("token", "token counts"),
    "num_bytes": ("byte", "sizes"),
}


def inseparable_error(frame: pd.DataFrame, columns: list[str], fit: str, source: str) -> ValueError:
    """Why no candidate of operator ``fit`` can be fitted to ``frame``: first, the input
    column of one value (its fixed and per-unit terms are then the same column, and a fit
    splits the time between them arbitrarily: e.g. all of it per token, the fixed cost 0)."""
    for column in columns:
        values = sorted(set(frame[column]))
        if len(values) < 2:
            unit, what = PER_UNIT.get(column, ("unit", f"values of {column}"))
            return ValueError(
                f"{source}: column {column}: every row has {values[0]:g}; the {fit} fit needs "
                f"at least 2 distinct {what} to separate its fixed cost from its per-{unit} "
                f"cost (profile more {what})"
            )
    return ValueError(
        f"{source}: columns {', '.join(columns)} vary together: no fit of operator {fit} "
        "can separate their terms (profile sizes that vary independently)"
    )


def decode_warnings(frame: pd.DataFrame, source: str) -> list[str]:
    """Implausible decode steps: a step in seconds over ``MAX_PLAUSIBLE_DECODE_STEP_S``
    (milliseconds written in a seconds column)."""
    slowest = float(frame["step_s"].max())
    if slowest <= MAX_PLAUSIBLE_DECODE_STEP_S:
        return []
    return [
        f"{source}: column step_s: a decode step of {slowest:g} s (over "
        f"{MAX_PLAUSIBLE_DECODE_STEP_S:g} s, {1 / slowest:.2g} steps/s); step_s is in "
        "seconds: if these are milliseconds, divide them by 1000 and calibrate again"
    ]


def check_weight_sync(frame: pd.DataFrame, source: str) -> None:
    """``transfer_s`` is the whole push as the trainer sees it and contains the server's
    pause; if every push is shorter than its pause, the columns are not what they say
    (the simulated transfer outside the pause would be 0)."""
    if (frame["transfer_s"] < frame["pause_s"]).all():
        raise ValueError(
            f"{source}: columns transfer_s, pause_s: every row's transfer_s is shorter than "
            "its pause_s, but transfer_s is the whole push seen by the trainer and contains "
            "the server's pause (pause_s): check the columns"
        )


def known_hardware(table: Mapping[str, Hardware] | None = None) -> list[str]:
    """The hardware a profile may name: ``table``'s GPUs (hardware.csv, or a spec's
    ``sim.tables.hardware_of``) and ``cpu``."""
    return [*(hardware_table() if table is None else table), CPU]


def check_profile_info(
    profile: object, path: Path, hardware: Mapping[str, Hardware] | None = None
) -> None:
    """A ValueError naming ``path`` and the key unless ``profile`` (profile.json) has
    ``weight_bytes`` and ``kv_capacity_tokens`` as positive numbers, ``model.name``,
    ``hardware.kind`` (known hardware: ``hardware``'s GPUs, default hardware.csv's), and the
    profiled generation tp and trainer (``hardware.tp``, ``trainer.hardware``,
    ``trainer.num_gpus``, or an older ``tandem profile``'s ``spec.cluster``)."""
    if not isinstance(profile, dict):
        raise ValueError(f"{path}: not a JSON object")
    for key in PROFILE_KEYS:
        if key not in profile:
            raise ValueError(f"{path}: no {key} (not a complete `tandem profile`)")
        value = profile[key]
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ValueError(f"{path}: {key} is {value!r}, not a number")
        if not (0 < value < math.inf):
            raise ValueError(f"{path}: {key} is {value!r}, not a positive number")
    if not float(profile["kv_capacity_tokens"]).is_integer():
        raise ValueError(f"{path}: kv_capacity_tokens is {profile['kv_capacity_tokens']!r}, "
                         "not a whole number of tokens")  # fmt: skip
    _check_nesting(profile, path)
    _check_setup(ProfiledSetup.of(profile), path, known_hardware(hardware))


def _check_nesting(profile: dict, path: Path) -> None:
    """Refuse ``{"model.name": ...}``: the setup's keys are nested objects, and a flat key
    would be reported missing under the name it is written with."""
    for key in profile:
        section, dot, field = str(key).partition(".")
        if dot and section in SETUP_SECTIONS:
            raise ValueError(
                f"{path}: flat key {key!r} (one JSON key with a dot in it): write it nested, "
                f'{{"{section}": {{"{field}": ...}}}}, as docs/fidelity.md\'s example shows'
            )


def _check_setup(setup: ProfiledSetup, path: Path, known: list[str]) -> None:
    missing = setup.unknown_keys()
    if missing:
        raise ValueError(
            f"{path}: no {', '.join(missing)}: a profile must say what it measured (the "
            "model, the generation hardware and tensor-parallel size, the trainer's hardware "
            "and GPUs; docs/fidelity.md), or runs on other configurations are priced "
            'silently wrong; the keys are nested: {"model": {"name": ...}, "hardware": '
            '{"kind": ..., "tp": ...}, "trainer": {"hardware": ..., "num_gpus": ...}}'
        )
    for key, name in (("hardware.kind", setup.generation_hardware),
                      ("trainer.hardware", setup.trainer_hardware)):  # fmt: skip
        if str(name).lower() not in {k.lower() for k in known}:
            raise ValueError(
                f"{path}: {key} {name!r} is unknown; known: {', '.join(known)} (a GPU "
                "hardware.csv does not list: give the spec you will run with, whose "
                "sim.hardware rows describe it, as --spec SPEC or --set sim.hardware=[{name: "
                f"{name}, bf16_dense_tflops: ..., hbm_gb: ..., hbm_tb_per_s: ..., "
                "nvlink_gb_per_s: ...}])"
            )
    for key, count in (("hardware.tp", setup.generation_tp),
                       ("trainer.num_gpus", setup.trainer_num_gpus)):  # fmt: skip
        if count is None or count < 1:
            raise ValueError(f"{path}: {key} is {count!r}, not a positive whole number")
