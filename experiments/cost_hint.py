"""How to give a GPU's price (``cost_per_machine_rel_h20``) on the command line: what
``tandem run`` and ``tandem advise --objective cost-normalized`` say when one is missing."""

from __future__ import annotations

import yaml

from policies.spec import RunSpec

PLACEHOLDER = "…"  # the user's figure: an 8-GPU machine's cost, in 8-GPU H20 machines


def cost_hint(spec: RunSpec, missing: list[str]) -> str:
    """The ``--set`` overrides that price each GPU of ``missing``: a GPU the spec's
    ``sim.hardware`` defines gets its row's key (replacing the list would drop the row's
    figures); one only hardware.csv lists gets a row, the list's own rows kept before it."""
    rows = [r.name for r in spec.sim.hardware]
    sets = [
        f"--set sim.hardware.{rows.index(name)}.cost_per_machine_rel_h20={PLACEHOLDER}"
        for name in missing
        if name in rows
    ]
    added = [
        {"name": name, "cost_per_machine_rel_h20": PLACEHOLDER}
        for name in missing
        if name not in rows
    ]
    if added:
        kept = [r.model_dump(mode="json", exclude_none=True) for r in spec.sim.hardware]
        text = yaml.safe_dump(
            [*kept, *added],
            default_flow_style=True,
            sort_keys=False,
            width=1_000_000,
            allow_unicode=True,
        ).strip()
        sets.insert(0, f"--set sim.hardware='{text}'")
    return " ".join(sets)
