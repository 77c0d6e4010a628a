"""The shipped specs (``experiments/configs/*.yaml``) and spec lookup by name or path."""

from __future__ import annotations

from importlib import resources
from pathlib import Path

from policies.spec import SpecError


def shipped_names() -> list[str]:
    configs = Path(str(resources.files("experiments") / "configs"))
    return sorted(p.stem for p in configs.glob("*.yaml"))


def config_path(name: str | Path) -> Path:
    """A spec file, or the name of a shipped config (``streamrl-7b``, ``live-tiny``...).

    Exact: anything with a path separator or a suffix (``runs/x/spec.yaml``, ``my.yaml``)
    is a path and must exist as a file; only a bare name (no separator, no suffix) is
    looked up among the shipped configs, then as a file of that name."""
    text = str(name)
    path = Path(text)
    if "/" in text or path.suffix:
        if path.is_dir():
            raise SpecError(f"spec {text!r} is a directory, not a YAML file")
        if not path.exists():
            raise SpecError(f"spec file {text!r} does not exist")
        return path
    shipped = Path(str(resources.files("experiments") / "configs" / f"{text}.yaml"))
    if shipped.exists():
        return shipped
    if path.is_file():
        return path
    raise SpecError(
        f"spec {text!r} is neither a file nor a shipped config ({', '.join(shipped_names())})"
    )
