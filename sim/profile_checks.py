"""Checks of a profile before ``tandem calibrate`` fits it (format: docs/fidelity.md).

Each check raises a ValueError naming the file, the row (1 = the first row under the
header) and the column, or returns warnings for what is legal but implausible. A profile
that fits without complaint can still be wrong; these catch what a fit would hide: a
negative or zero duration, a batch of -1 sequences, milliseconds in a seconds column, a
decode table that cannot separate a step's fixed cost from its per-sequence cost.
"""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd

from policies.profile_source import ProfiledSetup
from sim.tables import hardware_table

PROFILE_KEYS = ("weight_bytes", "kv_capacity_tokens")  # profile.json numbers the model keeps
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


def check_decode_batches(frame: pd.DataFrame, source: str) -> None:
    """A decode fit needs two batch sizes or more: with one, its fixed and per-sequence
    terms are the same column and the fit splits the step between them arbitrarily."""
    sizes = sorted(set(frame["batch_size"]))
    if len(sizes) < 2:
        raise ValueError(
            f"{source}: column batch_size: every row has batch size {sizes[0]:g}; the decode "
            "fit needs at least 2 distinct batch sizes to separate a step's fixed cost from "
            "its per-sequence cost (profile more batch sizes)"
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


def known_hardware() -> list[str]:
    return [*hardware_table(), CPU]


def check_profile_info(profile: object, path: Path) -> None:
    """A ValueError naming ``path`` and the key unless ``profile`` (profile.json) has
    ``weight_bytes`` and ``kv_capacity_tokens`` as positive numbers, ``model.name``,
    ``hardware.kind`` (known hardware), and the profiled generation tp and trainer
    (``hardware.tp``, ``trainer.hardware``, ``trainer.num_gpus``, or an older
    ``tandem profile``'s ``spec.cluster``)."""
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
    _check_setup(ProfiledSetup.of(profile), path)


def _check_setup(setup: ProfiledSetup, path: Path) -> None:
    missing = setup.unknown_keys()
    if missing:
        raise ValueError(
            f"{path}: no {', '.join(missing)}: a profile must say what it measured (the "
            "model, the generation hardware and tensor-parallel size, the trainer's hardware "
            "and GPUs; docs/fidelity.md), or runs on other configurations are priced "
            "silently wrong"
        )
    known = known_hardware()
    for key, name in (("hardware.kind", setup.generation_hardware),
                      ("trainer.hardware", setup.trainer_hardware)):  # fmt: skip
        if str(name).lower() not in {k.lower() for k in known}:
            raise ValueError(f"{path}: {key} {name!r} is unknown; known: {', '.join(known)}")
    for key, count in (("hardware.tp", setup.generation_tp),
                       ("trainer.num_gpus", setup.trainer_num_gpus)):  # fmt: skip
        if count is None or count < 1:
            raise ValueError(f"{path}: {key} is {count!r}, not a positive whole number")
