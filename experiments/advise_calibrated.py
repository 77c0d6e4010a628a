"""What ``tandem advise`` may search on a calibrated cost model (``profiled:DIR``).

A calibrated model prices generation only as profiled (its hardware, its tensor-parallel
size) and training only on the profiled trainer hardware, scaled over GPU counts
(``policies.calibrated``). So the tp axis is fixed at the profiled tp, and a placement
that generates or trains on other hardware is left out; where the profile does not
record its trainer's GPUs, training cannot be scaled and the trainer keeps the input's
GPUs. Each restriction is reported with the space's left-out lines.
"""

from __future__ import annotations

from dataclasses import replace

from experiments.advise_space import Candidate, Inventory, SearchAxes, Structure
from policies.calibrated import CalibratedCosts, ProfiledSetup


def profiled_setup(cost: object) -> ProfiledSetup | None:
    """The configuration a calibrated ``cost`` was measured on; None for other models."""
    return cost.setup if isinstance(cost, CalibratedCosts) else None


def fix_tp(axes: SearchAxes, setup: ProfiledSetup, input_tp: int) -> tuple[SearchAxes, str]:
    """``axes`` with tp fixed at the profiled one (the input's where not recorded)."""
    tp = setup.generation_tp or input_tp
    why = "profiled" if setup.generation_tp else "input's (the profile records no tp)"
    note = (
        f"tp other than {tp}: fixed at the {why} tp, since a calibrated cost model prices "
        "only the tensor-parallel size it was profiled at"
    )
    return replace(axes, tps=(tp,)), note


def priceable(
    found: list[Candidate], inv: Inventory, setup: ProfiledSetup, the_input: Candidate | None
) -> tuple[list[Candidate], list[str]]:
    """The candidates a calibrated model can price, and a line for each kind left out."""
    keep = [c for c in found if _hardware_ok(c.structure, inv, setup)]
    notes = []
    if len(keep) < len(found):
        notes.append(
            f"placements generating on other hardware than the profiled "
            f"{setup.generation_hardware} or training on other than the profiled "
            f"{setup.trainer_hardware}: a calibrated cost model cannot price them"
        )
    if setup.trainer_num_gpus is None and the_input is not None:
        gpus = the_input.structure.trainer_gpus
        before = len(keep)
        keep = [c for c in keep if c.structure.trainer_gpus == gpus]
        if len(keep) < before:
            notes.append(
                f"trainer sizes other than the input's {gpus} GPUs: the profile records no "
                "trainer.num_gpus, so training cannot be scaled to other GPU counts"
            )
    return keep, notes


def _hardware_ok(s: Structure, inv: Inventory, setup: ProfiledSetup) -> bool:
    gen = {g.hardware.lower() for g, n in zip(inv.groups, s.generation_gpus) if n}
    trainer = inv.groups[0 if s.colocated else s.trainer_group].hardware.lower()
    wanted_gen = (setup.generation_hardware or "").lower()
    wanted_trainer = (setup.trainer_hardware or "").lower()
    gen_ok = not wanted_gen or gen <= {wanted_gen}
    return gen_ok and (not wanted_trainer or trainer == wanted_trainer)
