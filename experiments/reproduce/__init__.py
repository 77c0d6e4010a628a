"""Paper reproductions: ``tandem reproduce streamrl`` and ``tandem reproduce pipelinerl``.

Each study simulates a list of points derived from the shipped configs, in parallel,
then writes figures (PNG), the data behind each figure (CSV) and ``report.md``.
"""

from __future__ import annotations

from pathlib import Path

from rich.console import Console

STUDIES = ("streamrl", "pipelinerl")


def reproduce(
    study: str, out: Path, quick: bool, workers: int, console: Console | None = None
) -> Path:
    """Run ``study`` and write its report into ``out``; returns the path of ``report.md``."""
    out.mkdir(parents=True, exist_ok=True)
    if study == "streamrl":
        from experiments.reproduce.streamrl import build
    elif study == "pipelinerl":
        from experiments.reproduce.pipelinerl import build
    else:
        raise ValueError(f"unknown study {study!r}; choose one of {', '.join(STUDIES)}")
    return build(out, quick, workers, console)
