"""Argument types of the command line that refuse a value out of range by name
(``tandem sweep: error: argument --workers: expected an integer >= 1, got 0``), where a
plain ``int`` let ``--workers 0`` fall back to the default or ``--point-timeout -1`` fail
every point."""

from __future__ import annotations

import argparse
from collections.abc import Callable


def _bounded(kind: type, low: float, strict: bool, high: float | None = None) -> Callable:
    noun = "an integer" if kind is int else "a number"
    above = f"> {low:g}" if strict else f">= {low:g}"
    expected = f"{noun} {above}" + (f" and <= {high:g}" if high is not None else "")

    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}") from None
        if (value <= low if strict else value < low) or (high is not None and value > high):
            raise argparse.ArgumentTypeError(f"expected {expected}, got {text}")
        return value

    parse.__name__ = f"{kind.__name__} {above}"  # how argparse names the type
    return parse


positive_int = _bounded(int, 1, strict=False)
non_negative_int = _bounded(int, 0, strict=False)
positive_float = _bounded(float, 0, strict=True)
share = _bounded(float, 0, strict=False, high=1)  # a fraction, 0..1
port = _bounded(int, 1, strict=False, high=65535)


def positive_ints(text: str) -> tuple[int, ...]:
    """``1,8,64``: distinct positive integers, in increasing order."""
    values = []
    for part in text.split(","):
        try:
            values.append(positive_int(part.strip()))
        except argparse.ArgumentTypeError as err:
            raise argparse.ArgumentTypeError(f"{err} in {text!r}") from None
    return tuple(sorted(set(values)))


positive_ints.__name__ = "comma-separated integers >= 1"


def path_text(text: str) -> str:
    """A path argument (``--out``): an empty one (``--out "$UNSET"``) is refused, where it
    read as no ``--out`` (a run went to its default directory) or as ``.``."""
    if not text.strip():
        raise argparse.ArgumentTypeError(f"expected a path, got {text!r}")
    return text


path_text.__name__ = "path"  # how argparse names the type


def ray_address(text: str) -> str:
    """``--ray ADDRESS`` in a form Ray takes, refused by the parser at once (the run's own
    check came only after seconds of imports)."""
    from runtime.ray_session import LOCAL_RAY, ray_endpoint

    if text != LOCAL_RAY:
        try:
            ray_endpoint(text)
        except ValueError as err:
            raise argparse.ArgumentTypeError(str(err).removeprefix("--ray ")) from None
    return text
