"""Direct weight loads on vLLM's CPU worker: copy a pushed version into the live tensors.

vLLM's ``reload_weights`` (``vllm/model_executor/model_loader/reload``) loads layer by
layer: it puts each layer back on the meta device, materialises it, loads, re-runs the
layer's post-load processing and copies the result into the old storage. On the CPU
platform that processing packs every linear layer's weight into a oneDNN handle and
drops the plain tensor (``remove_weight=True``), so that machinery is the only way to
load those layers again. For the tiny model a reload cost 9–17 ms of the engine's core
per push, against ~1 ms for copying the bytes.

Servers tandem starts set ``TANDEM_DIRECT_LOAD=1``. The plugin (runtime/vllm_plugin.py)
then makes every CPU linear layer keep its plain weight beside its kernel handle (a
second host copy of the linear weights), and :func:`load_into` loads a version with the
model's own ``load_weights`` straight into the live tensors (its shard mapping puts
``q_proj``/``k_proj``/``v_proj`` into ``qkv_proj`` and so on) and rebuilds each layer's
handle from them. Alternated, same model and push (docs/live-throughput.md): 4.3 ms
against 11.4–11.8 ms, the same greedy tokens after either. A model the direct path
cannot serve (a dropped, quantised or non-2-D kernel weight; a load that leaves a
parameter out) goes through ``reload_weights`` as before.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Mapping

import torch

DIRECT_ENV = "TANDEM_DIRECT_LOAD"

logger = logging.getLogger(__name__)


def direct_load_from_env(environ: Mapping[str, str] = os.environ) -> bool:
    """Whether ``TANDEM_DIRECT_LOAD`` asks for direct loads ("1"; unset, "" or "0": no)."""
    raw = environ.get(DIRECT_ENV, "").strip()
    if raw not in ("", "0", "1"):
        raise ValueError(f"{DIRECT_ENV}={raw!r}: expected 1 (direct loads) or 0")
    return raw == "1"


def keep_linear_weights() -> bool:
    """Make vLLM's CPU linear layers built from now on keep their plain weights.

    Returns False (and logs why) when this vLLM has no CPU kernel dispatch to wrap."""
    from vllm.model_executor.layers import utils

    original = getattr(utils, "dispatch_cpu_unquantized_gemm", None)
    if original is None:
        logger.warning("this vLLM has no dispatch_cpu_unquantized_gemm: weights load by reload")
        return False
    if getattr(original, "tandem_original", None) is not None:
        return True  # already wrapped

    def dispatch(layer: torch.nn.Module, remove_weight: bool) -> None:
        original(layer, remove_weight=False)

    dispatch.tandem_original = original  # type: ignore[attr-defined]
    utils.dispatch_cpu_unquantized_gemm = dispatch
    return True


def kernel_layers(model: torch.nn.Module) -> list[torch.nn.Module] | None:
    """The layers whose weights feed a CPU kernel handle, or None when a direct load
    cannot serve this model (a kernel weight dropped, quantised or not 2-D)."""
    layers = [m for m in model.modules() if hasattr(m, "cpu_linear")]
    for layer in layers:
        weight = getattr(layer, "weight", None)
        if not isinstance(weight, torch.Tensor) or weight.ndim != 2 or weight.numel() == 0:
            return None
        if weight.is_meta or not weight.dtype.is_floating_point:
            return None
    return layers


def _dispatch():
    from vllm.model_executor.layers import utils

    current = utils.dispatch_cpu_unquantized_gemm
    return getattr(current, "tandem_original", current)


def direct_load(
    model: torch.nn.Module, layers: list[torch.nn.Module],
    weights: Iterable[tuple[str, torch.Tensor]],
) -> bool:  # fmt: skip
    """Copy ``weights`` (checkpoint names) into ``model``'s tensors, then rebuild the
    kernel handle of each of ``layers``. False when the load left a parameter out (the
    caller then loads the same weights through ``reload_weights``)."""
    with torch.no_grad():
        loaded = model.load_weights(weights)
        if loaded is None or not {n for n, _ in model.named_parameters()} <= set(loaded):
            return False
        dispatch = _dispatch()
        for layer in layers:  # a packed handle holds its own copy of the weight
            dispatch(layer, remove_weight=False)
    return True


def load_into(model_runner, weights: list[tuple[str, torch.Tensor]]) -> bool:
    """Load ``weights`` into the worker's model: directly when this server keeps its
    kernel weights (:func:`kernel_layers`), else by vLLM's ``reload_weights``. True when
    the direct path loaded them."""
    get_model = getattr(model_runner, "get_model", None)
    if direct_load_from_env() and get_model is not None:
        model = get_model()
        layers = kernel_layers(model)
        if layers is not None and direct_load(model, layers, iter(weights)):
            return True
    model_runner.reload_weights(weights_iterator=iter(weights))
    return False
