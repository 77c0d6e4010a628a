"""Library progress bars stay off tandem's console (a user trial: every live run printed
``Loading weights: 0%|…|``, and ``tandem export`` ``Writing model shards``)."""

from __future__ import annotations

from pathlib import Path

import pytest
from transformers.utils import logging as hf_logging

from runtime.model import TinyModelConfig, build_tiny_model

BARS = ("Loading weights", "Writing model shards", "%|")


@pytest.fixture
def bars_on():
    """transformers' bars on, as in a fresh process (a switch is process-wide), then back."""
    was_on = hf_logging.is_progress_bar_enabled()
    hf_logging.enable_progress_bar()
    yield
    if not was_on:
        hf_logging.disable_progress_bar()


def _tiny(out: Path) -> Path:
    config = TinyModelConfig(hidden_size=16, intermediate_size=32, num_layers=1, sft_steps=0)
    build_tiny_model(config, out)
    return out


def test_the_trainer_loads_and_export_writes_a_model_without_a_progress_bar(
    tmp_path: Path, bars_on, capfd
) -> None:
    from runtime.export import _write_model
    from runtime.trainer import Trainer, TrainerConfig

    model_dir = str(_tiny(tmp_path / "model"))
    trainer = Trainer(TrainerConfig(model_dir=model_dir, batch_size=2))
    trainer.initialise()
    _write_model(model_dir, trainer.model.state_dict(), tmp_path / "out", "auto")
    printed = capfd.readouterr()
    assert not [bar for bar in BARS if bar in printed.err + printed.out]
    assert (tmp_path / "out" / "model.safetensors").is_file()
    assert hf_logging.get_verbosity() == hf_logging.WARNING  # its warnings still show
