"""vLLM on the CPU: a seeded request whose prompt is prefilled in chunks no longer kills
the engine.

vLLM samples a token for every scheduled request, also for one whose prompt is only partly
prefilled (chunked prefill), and throws that token away. For a seeded request it then
rewinds the request's generator so that the draw thrown away does not shift the
request's later tokens: ``gen.set_offset(gen.get_offset() - 4)`` in
``GPUModelRunner._bookkeeping_sync``. That is the CUDA (Philox) generator's interface; a
CPU generator has no offset, the call raises ``RuntimeError: CPU Generator does not use
offset`` and the engine dies (``EngineDeadError`` for every request). It happens as soon
as a prompt is split over engine steps: a burst of more prompt tokens than
``max_num_batched_tokens``, such as a few hundred prompts at once (``tandem run
streamrl-7b --live`` stopped so). tandem seeds every sample.

:func:`rewind_seeded_chunks` makes vLLM's CPU model runner do the same rewind with what a
CPU generator has: it saves the state of each thrown-away request's generator before
sampling and sets it back after, and keeps those generators out of the offset call.
A request's tokens are then the same whether its prompt was prefilled at once or in
chunks (``tests/live/test_cpu_seed_rewind.py``). The plugin (runtime/vllm_plugin.py)
applies it in servers tandem starts (``TANDEM_CPU_SEED_REWIND=1``).
"""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Mapping
from typing import Any

SEED_REWIND_ENV = "TANDEM_CPU_SEED_REWIND"
_PATCHED = "_tandem_seed_rewind"

logger = logging.getLogger(__name__)


def seed_rewind_from_env(environ: Mapping[str, str] = os.environ) -> bool:
    """Whether ``TANDEM_CPU_SEED_REWIND`` asks for the rewind ("1")."""
    return environ.get(SEED_REWIND_ENV, "").strip() == "1"


def rewind_seeded_chunks() -> bool:
    """Patch vLLM's CPU model runner (once); False off the CPU platform, and with a
    warning where this vLLM has no such runner or methods (nothing is changed then)."""
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return False  # CUDA generators have offsets: vLLM's own rewind works there
    try:
        from vllm.v1.worker.cpu_model_runner import CPUModelRunner
    except ImportError:
        logger.warning("this vLLM has no CPU model runner: seeded chunk rewind not applied")
        return False
    if getattr(CPUModelRunner, _PATCHED, False):
        return True
    if not all(hasattr(CPUModelRunner, m) for m in ("_sample", "_bookkeeping_sync")):
        logger.warning("this vLLM's model runner has no _sample/_bookkeeping_sync: not applied")
        return False
    CPUModelRunner._sample = _rewinding_sample(CPUModelRunner._sample)
    CPUModelRunner._bookkeeping_sync = _without_rewound(CPUModelRunner._bookkeeping_sync)
    setattr(CPUModelRunner, _PATCHED, True)
    return True


def _discarded(runner: Any) -> dict[int, Any]:
    """Index → generator of the seeded requests whose sampled token this step discards."""
    generators = runner.input_batch.generators
    mask = runner.discard_request_mask.np[: runner.input_batch.num_reqs]
    return {int(i): generators[int(i)] for i in mask.nonzero()[0] if int(i) in generators}


def _rewinding_sample(sample):
    @functools.wraps(sample)
    def wrapper(self, *args, **kwargs):
        states = {i: (g, g.get_state()) for i, g in _discarded(self).items()}
        try:
            return sample(self, *args, **kwargs)
        finally:
            for generator, state in states.values():
                generator.set_state(state)

    return wrapper


def _without_rewound(bookkeeping):
    @functools.wraps(bookkeeping)
    def wrapper(self, *args, **kwargs):
        generators = self.input_batch.generators
        rewound = _discarded(self)  # already set back by the sampling wrapper
        for i in rewound:
            del generators[i]
        try:
            return bookkeeping(self, *args, **kwargs)
        finally:
            generators.update(rewound)

    return wrapper
