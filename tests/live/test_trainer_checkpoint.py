"""A checkpoint holds the trainer's state at the step it was asked for, even though the
writer thread writes it while training goes on."""

import json
from pathlib import Path

import pytest
import torch

from runtime.trainer import TrainerConfig, TrainItem
from runtime.trainer_proc import TrainerWorker

pytestmark = pytest.mark.live


def _items(vocab: int, seed: int) -> list[TrainItem]:
    g = torch.Generator().manual_seed(seed)
    return [
        TrainItem(
            sample_id=i, prompt_ids=tuple(torch.randint(3, vocab, (6,), generator=g).tolist()),
            output_ids=tuple(torch.randint(3, vocab, (9,), generator=g).tolist()),
            logprobs_old=tuple([-2.0] * 9), advantage=1.0 if i % 2 else -1.0, reward=0.0,
            version_start=0,
        )
        for i in range(8)
    ]  # fmt: skip


class _LateWriter:
    """A checkpoint writer that runs its writes only at close: as late as can be."""

    def __init__(self) -> None:
        self.writes: list = []

    def submit(self, write) -> None:
        self.writes.append(write)

    def close(self) -> None:
        for write in self.writes:
            write()


def test_a_checkpoint_holds_the_state_of_its_step_while_training_goes_on(model_dir, tmp_path):
    vocab = json.loads((Path(model_dir) / "config.json").read_text())["vocab_size"]
    worker = TrainerWorker(
        TrainerConfig(model_dir, batch_size=8, learning_rate=1e-2, keep_checkpoints=2)
    )
    worker.writer = _LateWriter()
    worker.trainer.initialise()
    worker.train(_items(vocab, 0), 0.0)
    worker.step(0, 0.0)
    at_step_0 = {n: t.clone() for n, t in worker.trainer.named_weights()}
    path = tmp_path / "last.pt"
    worker.checkpoint(str(path), {"next_step": 1})
    worker.train(_items(vocab, 1), 0.0)  # step 1 changes the weights before the file is written
    worker.step(1, 0.0)
    moved = [n for n, t in worker.trainer.named_weights() if not torch.equal(t, at_step_0[n])]
    assert moved, "step 1 did not change the weights: the test could not tell"
    worker.close()
    saved = torch.load(path, weights_only=False)
    assert saved["data"] == {"next_step": 1}
    assert saved["version"] == 1
    for name, tensor in at_step_0.items():
        assert torch.equal(saved["model"][name], tensor), name
    assert (tmp_path / "step-000000.pt").exists()
