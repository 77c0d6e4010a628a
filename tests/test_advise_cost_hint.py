"""The hint for a GPU without a price works when followed. Seen: for a GPU the spec defines
in ``sim.hardware``, advise said ``--set sim.hardware='[{name: MYGPU, ...}]'``, which
replaced the row and then failed for want of its figures."""

from __future__ import annotations

import re
import shlex

import pytest

from experiments.advise_plan import SpaceOptions, plan_space
from experiments.summary_format import cost_note
from policies.spec import RunSpec, override_spec, spec_from_dict
from tests.test_advise_space import small_spec

MYGPU = {"name": "MYGPU", "bf16_dense_tflops": 400, "hbm_gb": 80, "hbm_tb_per_s": 2.0,
         "nvlink_gb_per_s": 600}  # fmt: skip
OPTIONS = SpaceOptions(objective="cost-normalized", axes=("dispatch=round-robin", "tp=1"))


def _spec(trainer: str) -> RunSpec:
    data = small_spec().model_dump(mode="json")
    data["cluster"]["generation"][0]["hardware"] = "MYGPU"
    data["cluster"]["trainer"]["hardware"] = trainer
    data["sim"]["hardware"] = [MYGPU]
    return spec_from_dict(data)


def _follow(hint: str, spec: RunSpec) -> RunSpec:
    """``spec`` with the hint's ``--set`` overrides, a price given for each ``…``."""
    words = shlex.split(hint.replace("…", "1.5"))
    assert words[::2] == ["--set"] * (len(words) // 2), hint
    return override_spec(spec, words[1::2])


@pytest.mark.parametrize("trainer", ["MYGPU", "H100-SXM"])  # sim.hardware's, hardware.csv's
def test_the_advise_hint_prices_the_gpu_when_followed(trainer):
    spec = _spec(trainer)
    with pytest.raises(ValueError, match="give it with") as refused:
        plan_space(spec, OPTIONS)
    hint = re.search(r"give it with (.*)\)$", str(refused.value)).group(1)
    assert "--set sim.hardware.0.cost_per_machine_rel_h20=…" in hint
    priced = _follow(hint, spec)
    assert plan_space(priced, OPTIONS).candidates  # no longer refused
    assert priced.sim.hardware[0].bf16_dense_tflops == 400  # the row kept its figures


def test_the_run_summary_hint_prices_the_gpu_when_followed():
    spec = _spec("H100-SXM")
    metrics = {"cost_normalized_throughput": None, "sim_wall_s": 1.0}
    note = cost_note(spec, metrics)
    assert note is not None and "for MYGPU, H100-SXM" in note
    hint = re.search(r"give it with (.*)\)$", note).group(1)
    assert cost_note(_follow(hint, spec), metrics) is None
