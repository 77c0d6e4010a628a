"""tandem's vLLM general plugin: an idle engine sleeps instead of spinning on its core.

vLLM's scheduler (engine core) and model worker talk through a shared-memory queue whose
reader busy-waits (``sched_yield`` in a loop) for ``busy_loop_s`` = 1 s after every message
before it parks on a socket (``SpinCondition`` in
``vllm/distributed/device_communicators/shm_broadcast.py``). On a GPU host that second is
spent on otherwise idle host cores; on the CPU host here it is spent on the core that
decodes or trains: a trainer given the idle engine's core ran 2–3x slower, and two
servers on one core spent part of their slices spinning (docs/live-throughput.md).

vLLM loads the ``vllm.general_plugins`` entry points in every process it starts (frontend,
engine core, workers) before it builds those queues; this one (``pyproject.toml``) sets
the spin to ``TANDEM_ENGINE_SPIN_MS`` milliseconds when that variable is set, and has a
parked reader re-read the queue every ``RECHECK_MS`` (vLLM: 5 s; with short spins readers
park often, and a lost wake-up then stalled a decode step for 5 s). Servers that
tandem starts set it (``python -m runtime.server --engine-spin-ms``); any other vLLM in the
same environment is left as it is.

The same servers set ``TANDEM_DIRECT_LOAD=1``: the plugin then has vLLM's CPU linear
layers keep their plain weights beside their kernel handles, so that a weight push can be
copied in place instead of reloaded layer by layer (runtime/direct_load.py), and
``TANDEM_CPU_SEED_REWIND=1``: a seeded request whose prompt is prefilled in chunks no
longer kills a CPU engine (runtime/cpu_seed_rewind.py).
"""

from __future__ import annotations

import inspect
import logging
import os
from collections.abc import Mapping

from runtime.cpu_seed_rewind import rewind_seeded_chunks, seed_rewind_from_env
from runtime.direct_load import direct_load_from_env, keep_linear_weights

SPIN_ENV = "TANDEM_ENGINE_SPIN_MS"
RECHECK_MS = 10  # a parked reader looks at the queue at least this often (vLLM's: 5000)

logger = logging.getLogger(__name__)


def spin_s_from_env(environ: Mapping[str, str] = os.environ) -> float | None:
    """The spin in seconds that ``TANDEM_ENGINE_SPIN_MS`` asks for; None when unset."""
    raw = environ.get(SPIN_ENV, "").strip()
    if not raw:
        return None
    try:
        ms = float(raw)
    except ValueError:
        raise ValueError(f"{SPIN_ENV}={raw!r}: expected milliseconds (a number >= 0)") from None
    if not ms >= 0:
        raise ValueError(f"{SPIN_ENV}={raw!r}: expected milliseconds (a number >= 0)")
    return ms / 1000.0


def set_reader_spin(spin_s: float) -> bool:
    """Make every shared-memory queue reader built from now on spin ``spin_s`` seconds.

    Returns False (and logs why) when this vLLM has no such setting to change."""
    from vllm.distributed.device_communicators import shm_broadcast

    cls = getattr(shm_broadcast, "SpinCondition", None)
    params = inspect.signature(cls.__init__).parameters if cls else {}
    if "busy_loop_s" not in params:
        logger.warning("this vLLM has no SpinCondition(busy_loop_s): engine spin left as is")
        return False
    names = [n for n in params if n != "self"]
    defaults = list(cls.__init__.__defaults__ or ())
    defaults[names.index("busy_loop_s") - (len(names) - len(defaults))] = spin_s
    cls.__init__.__defaults__ = tuple(defaults)
    if hasattr(shm_broadcast, "SHM_READER_RECHECK_INTERVAL_MS"):
        shm_broadcast.SHM_READER_RECHECK_INTERVAL_MS = RECHECK_MS
    return True


def register() -> None:
    """The entry point vLLM calls in each of its processes."""
    spin_s = spin_s_from_env()
    if spin_s is not None:
        set_reader_spin(spin_s)
    if direct_load_from_env():
        keep_linear_weights()
    if seed_rewind_from_env():
        rewind_seeded_chunks()
