"""The shipped specs (``experiments/configs/*.yaml``) and spec lookup by name or path."""

from __future__ import annotations

from importlib import resources
from pathlib import Path

from policies.spec import SpecError


def config_path(name: str | Path) -> Path:
    """A spec path, or the name of a shipped config (``streamrl-7b``, ``live-tiny``...)."""
    path = Path(name)
    if path.exists():
        return path
    shipped = Path(str(resources.files("experiments") / "configs" / f"{path.stem}.yaml"))
    if shipped.exists():
        return shipped
    raise SpecError(f"spec {str(name)!r} is neither a file nor a shipped config")
