"""The report: sections (a figure, its data tables, the published claims beside ours).

Every table in ``report.md`` is one CSV file next to it rendered row for row (numbers to
four significant digits) and tagged ``<!-- table: NAME.csv -->``, so a test can check the
report against the data the figures were drawn from.
"""

from __future__ import annotations

import math
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from policies.results import write_atomic


@dataclass(frozen=True, slots=True)
class Table:
    name: str  # the CSV's stem; the figure of the same stem is drawn from it
    frame: pd.DataFrame


@dataclass(frozen=True, slots=True)
class Claim:
    claim: str  # the published statement, as the paper states it
    published: str  # its number(s)
    ours: str  # the same quantity from our runs
    verdict: str  # "consistent", "we disagree", "qualitative only", "not checked: why"
    why: str  # the mechanism behind an agreement or a disagreement


@dataclass(slots=True)
class Section:
    title: str
    question: str  # what the figure answers
    figures: list[str]  # PNG file names
    tables: list[Table]
    claims: list[Claim] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # setup and findings, one paragraph each


@dataclass(frozen=True, slots=True)
class Assumption:
    parameter: str
    value: str
    source: str


def cell(value: object) -> str:
    """A table cell: floats to 4 significant digits, missing values as an em dash."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "—"
    if isinstance(value, bool):
        return str(value)
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value).replace("|", "\\|")


def markdown_table(frame: pd.DataFrame) -> str:
    head = "| " + " | ".join(frame.columns) + " |"
    rule = "|" + "|".join("---" for _ in frame.columns) + "|"
    rows = ["| " + " | ".join(cell(v) for v in row) + " |" for row in frame.itertuples(False)]
    return "\n".join([head, rule, *rows])


def write_csv(frame: pd.DataFrame, path: Path) -> Path:
    write_atomic(path, frame.to_csv(index=False).encode())
    return path


def claims_frame(sections: list[Section]) -> pd.DataFrame:
    rows = [
        {
            "section": s.title,
            "claim": c.claim,
            "published": c.published,
            "ours": c.ours,
            "verdict": c.verdict,
        }
        for s in sections
        for c in s.claims
    ]
    return pd.DataFrame(rows, columns=["section", "claim", "published", "ours", "verdict"])


def _section_md(index: int, s: Section) -> list[str]:
    lines = [f"## {index}. {s.title}", "", f"*Question:* {s.question}", ""]
    for figure in s.figures:
        lines += [f"![{s.title}]({figure})", ""]
    for note in s.notes:
        lines += [note, ""]
    for c in s.claims:
        lines += [
            f"> **Published:** {c.claim} — {c.published}",
            ">",
            f"> **Ours:** {c.ours} — **{c.verdict}.** {c.why}",
            "",
        ]
    for t in s.tables:
        lines += [f"<!-- table: {t.name}.csv -->", markdown_table(t.frame), ""]
        lines += [f"Data: [`{t.name}.csv`]({t.name}.csv)", ""]
    return lines


PACKAGE_ROOT = Path(__file__).resolve().parents[2]  # the checkout holding experiments/


def git_commit(repo: Path = PACKAGE_ROOT) -> str:
    """The short HEAD commit of ``repo`` (by default tandem's own checkout, whatever the
    working directory); ``unknown`` when ``repo`` is not the top of a git checkout (an
    installed package inside some other repository gets ``unknown``, not its commit)."""
    try:
        out = subprocess.run(
            ["git", "-C", str(repo), "rev-parse", "--show-toplevel", "--short", "HEAD"],
            capture_output=True,
            text=True,
            timeout=5,
        )
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    lines = out.stdout.splitlines()
    if out.returncode != 0 or len(lines) != 2 or Path(lines[0]).resolve() != repo.resolve():
        return "unknown"
    return lines[1]


def write_report(
    out: Path,
    title: str,
    intro: list[str],
    sections: list[Section],
    assumptions: list[Assumption],
) -> Path:
    """Write every table's CSV, ``claims.csv``, ``assumptions.csv`` and ``report.md``."""
    for s in sections:
        for t in s.tables:
            write_csv(t.frame, out / f"{t.name}.csv")
    claims = claims_frame(sections)
    write_csv(claims, out / "claims.csv")
    table_of_assumptions = pd.DataFrame([vars_of(a) for a in assumptions])
    write_csv(table_of_assumptions, out / "assumptions.csv")
    stamp = time.strftime("%Y-%m-%d %H:%M")
    lines = [f"# {title}", "", f"Generated {stamp} from commit `{git_commit()}`.", ""]
    lines += [*intro, ""]
    lines += ["## Published claims and ours", "", "<!-- table: claims.csv -->"]
    lines += [markdown_table(claims), ""]
    for i, s in enumerate(sections, 1):
        lines += _section_md(i, s)
    lines += ["## Modelling assumptions and their sources", "", "<!-- table: assumptions.csv -->"]
    lines += [markdown_table(table_of_assumptions), ""]
    path = out / "report.md"
    write_atomic(path, "\n".join(lines).encode())
    return path


def vars_of(a: Assumption) -> dict[str, str]:
    return {"parameter": a.parameter, "value": a.value, "source": a.source}


def ratio_range(values: list[float]) -> str:
    """``lo–hi×`` of a list of ratios (or ``x×`` when there is one)."""
    finite = [v for v in values if math.isfinite(v)]
    if not finite:
        return "—"
    lo, hi = min(finite), max(finite)
    return f"{lo:.2f}×" if math.isclose(lo, hi, rel_tol=5e-3) else f"{lo:.2f}–{hi:.2f}×"


MAX_TOLERANCE = 0.10  # an "up to X" claim: our largest within 10 % of X


def max_verdict(ours: list[float], published_max: float) -> str:
    """An "up to X" claim: ``consistent`` when our largest lies within
    :data:`MAX_TOLERANCE` of X, else which side we fall (a range that merely overlaps
    ``[1, X]`` says nothing about the largest gain)."""
    hi = max(ours)
    if hi < published_max * (1 - MAX_TOLERANCE):
        return "we disagree (ours lower)"
    if hi > published_max * (1 + MAX_TOLERANCE):
        return "we disagree (ours higher)"
    return f"consistent (largest within {MAX_TOLERANCE:.0%})"


def range_verdict(ours: list[float], published_lo: float, published_hi: float) -> str:
    """``consistent`` when our range overlaps the published one, else which side we fall."""
    lo, hi = min(ours), max(ours)
    if hi < published_lo:
        return "we disagree (ours lower)"
    if lo > published_hi:
        return "we disagree (ours higher)"
    return "consistent (ranges overlap)"
