"""Seeded requests on vLLM-CPU with chunked prefill (runtime/cpu_seed_rewind.py): without
the rewind the engine dies at the first prompt split over steps; with it every request
gets the very tokens it gets when its prompt is prefilled at once."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from runtime.cpu_seed_rewind import SEED_REWIND_ENV

pytestmark = pytest.mark.live

SCRIPT = Path(__file__).with_name("seed_rewind_script.py")
REPO = SCRIPT.parents[2]


def _tokens(model_dir: str, rewind: bool, *budgets: int) -> dict:
    env = {k: v for k, v in os.environ.items() if k != SEED_REWIND_ENV}
    if rewind:
        env[SEED_REWIND_ENV] = "1"
    done = subprocess.run(
        [sys.executable, str(SCRIPT), model_dir, *map(str, budgets)],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_seeded_prompt_prefilled_in_chunks_gets_the_tokens_of_one_prefilled_at_once(model_dir):
    with_rewind = _tokens(model_dir, True, 2048, 16)
    whole, chunked = with_rewind["2048"], with_rewind["16"]
    assert isinstance(whole, list) and len(whole) == 8 and all(whole)
    assert chunked == whole
    # the same budget without the rewind: vLLM's CUDA-only rewind kills the CPU engine
    assert _tokens(model_dir, False, 16)["16"] == "RuntimeError: CPU Generator does not use offset"
