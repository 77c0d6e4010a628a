"""One short live run on the shared server, tracked, traced and exported:

* every step's scalars in the TensorBoard file, as the trainer reported them;
* ``run.log`` and a valid ``trace.json`` in the run directory;
* ``tandem export`` of the last and of an earlier kept step: a Hugging Face directory
  that ``transformers`` loads, with the trainer's logits (from the checkpoint's state
  dict) and the base model's config and tokenizer files.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from trace_format import validate_trace

from experiments.cli import main
from experiments.tracking import tracker_for
from policies.spec import load_spec
from runtime.checkpoints import CHECKPOINT_DIR, kept_steps, step_checkpoint
from runtime.launcher import run_live
from runtime.tasks import TaskSet

pytestmark = pytest.mark.live

CONFIG = Path(__file__).resolve().parents[2] / "experiments" / "configs" / "live-tiny.yaml"
STEPS = 3


@pytest.fixture(scope="module")
def tracked_run(server, token, tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("tracked") / "run"
    spec = load_spec(
        CONFIG,
        [f"run.iterations={STEPS}", "algorithm.batch_size=8", "run.tracking=tensorboard",
         "live.keep_checkpoints=2", f"live.server_urls=[{server}]", f"live.token='{token}'"],
    )  # fmt: skip
    with tracker_for(spec, run_dir) as tracker:
        result = run_live(spec, run_dir, on_step=tracker)
        tracker.finish(result.metrics)
    return run_dir, result


def _scalars(log_dir: Path) -> dict[str, dict[int, float]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(log_dir))
    acc.Reload()
    return {tag: {e.step: e.value for e in acc.Scalars(tag)} for tag in acc.Tags()["scalars"]}


def test_a_live_run_logs_every_step_run_log_and_trace(tracked_run):
    run_dir, result = tracked_run
    tags = _scalars(run_dir / "tensorboard")
    for s in result.steps:
        k = s["step"]
        assert tags["reward"][k] == pytest.approx(s["mean_reward"])
        assert tags["loss"][k] == pytest.approx(s["loss"])
        if s["clip_fraction"] is None:  # every sample skipped (advantage 0): no weights
            assert k not in tags.get("clip_fraction", {}) and s["num_skipped"] == 8
        else:
            assert tags["clip_fraction"][k] == pytest.approx(s["clip_fraction"])
            assert 0.0 <= tags["clip_fraction"][k] <= 1.0
        assert tags["lag/mean"][k] == pytest.approx(s["mean_lag"])
        assert tags["throughput/samples"][k] == 8
        assert tags["time/generation_s"][k] > 0 and tags["time/train_s"][k] > 0
        # each window's share, as the finished run's events.parquet gives it afterwards; the
        # window's ends are read back from float32 tags (~2e-7 s off at a few seconds), so
        # a share of a 0.1 s window may be off by ~5e-6
        lo = tags["time/run_s"][k - 1] if k else 0.0
        hi = tags["time/run_s"][k]
        for resource, kinds in (("gen-0", {"decode"}), ("trainer", {"train"})):
            busy = _busy_s(result.spans, resource, kinds, lo, hi)
            assert tags[f"utilization/{resource}"][k] == pytest.approx(busy / (hi - lo), abs=2e-5)
        pause = _busy_s(result.spans, "gen-0", {"weight_sync"}, lo, hi)
        assert tags["time/pause_s"][k] == pytest.approx(pause, abs=2e-6)
        assert k in tags["staleness/max"]
    assert sum(tags["utilization/gen-0"].values()) > 0
    assert "kl" not in tags  # no reference model: kl_coef 0
    log = (run_dir / "run.log").read_text()
    assert "server(s)" in log and "live run done" in log and f"step {STEPS - 1}: 8 samples" in log
    tracks = validate_trace(json.loads((run_dir / "trace.json").read_text()))
    assert {"gen-0", "trainer", "samples 0", "steps 0"} <= set(tracks.values())


def _busy_s(spans, resource: str, kinds: set[str], lo: float, hi: float) -> float:
    """Seconds of [lo, hi] that ``resource`` spent in spans of ``kinds`` (merged)."""
    clipped = sorted(
        (max(lo, s.start_s), min(hi, s.end_s))
        for s in spans
        if s.resource == resource and str(s.kind) in kinds
    )
    total, end = 0.0, lo
    for a, b in clipped:
        if b > max(a, end):
            total += b - max(a, end)
            end = b
    return total


def _logits(model, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=ids).logits


def test_export_writes_a_transformers_model_with_the_trainers_logits(
    tracked_run, model_dir, tmp_path, capsys
):
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    run_dir, _ = tracked_run
    assert kept_steps(run_dir / CHECKPOINT_DIR) == [1, 2]  # the newest two of three
    last, earlier = tmp_path / "last", tmp_path / "step1"
    assert main(["export", str(run_dir), "--out", str(last)]) == 0
    assert main(["export", str(run_dir), "--out", str(earlier), "--step", "1"]) == 0
    tokenizer = AutoTokenizer.from_pretrained(last)
    prompt = TaskSet(0, 4, 64).prompts[0].text
    ids = torch.tensor([tokenizer.encode(prompt, add_special_tokens=False)])
    exported = AutoModelForCausalLM.from_pretrained(last).eval()
    for step, directory in ((2, last), (1, earlier)):
        trainer = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(model_dir)).eval()
        state = torch.load(step_checkpoint(run_dir, step), weights_only=True)
        trainer.load_state_dict(state["model"])
        loaded = AutoModelForCausalLM.from_pretrained(directory).eval()
        assert torch.allclose(_logits(loaded, ids), _logits(trainer, ids), atol=1e-6, rtol=0)
        info = json.loads((directory / "tandem_export.json").read_text())
        assert (info["step"], info["version"]) == (step, step + 1)
        # absolute, and the step's own file (last.pt moves on when the run is resumed)
        assert info["checkpoint"] == str(step_checkpoint(run_dir, step).resolve())
        assert info["run_dir"] == str(run_dir.resolve())
    base = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    assert not torch.allclose(_logits(exported, ids), _logits(base, ids))  # it trained
    loaded1 = AutoModelForCausalLM.from_pretrained(earlier).eval()
    assert not torch.allclose(_logits(exported, ids), _logits(loaded1, ids))
    # what runtime/model.py wrote for the tiny model, and what vLLM loads it with
    config = json.loads((last / "config.json").read_text())
    base_config = json.loads((Path(model_dir) / "config.json").read_text())
    config.pop("transformers_version", None)
    base_config.pop("transformers_version", None)
    assert config == base_config
    for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        assert (last / name).read_bytes() == (Path(model_dir) / name).read_bytes(), name
    assert (last / "model.safetensors").exists() and not list(last.glob("*.bin"))
    capsys.readouterr()
    assert main(["export", str(run_dir), "--out", str(tmp_path / "x"), "--step", "0"]) == 2
    assert "kept steps: 1, 2" in capsys.readouterr().out
    assert main(["export", str(run_dir), "--out", str(last)]) == 2  # never over a model
