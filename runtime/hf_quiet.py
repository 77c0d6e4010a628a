"""transformers' progress bars off in tandem's own processes.

A live run's trainer printed ``Loading weights: 0%|…|`` on the console at every start,
and ``tandem export`` ``Writing model shards``: bars of a few tensors that say nothing a
run's own progress bar and log do not. :func:`quiet_progress_bars` turns them off with
transformers' documented switch (``transformers.utils.logging.disable_progress_bar``,
which also turns off huggingface_hub's); its warnings and errors still show."""

from __future__ import annotations


def quiet_progress_bars() -> None:
    """No tqdm bars from transformers (or huggingface_hub) in this process from now on."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
