"""Direct weight loads rebuild vLLM's CPU kernel handles from the copied weights
(runtime/direct_load.py); the served model after a real push: tests/live/test_server_contract.py."""

from __future__ import annotations

import pytest
import torch

from runtime.direct_load import (
    DIRECT_ENV,
    direct_load,
    direct_load_from_env,
    keep_linear_weights,
    kernel_layers,
    load_into,
)


def test_env_reads_one_and_zero_and_names_the_variable_otherwise():
    assert direct_load_from_env({}) is False
    assert direct_load_from_env({DIRECT_ENV: "0"}) is False
    assert direct_load_from_env({DIRECT_ENV: "1"}) is True
    with pytest.raises(ValueError, match=DIRECT_ENV):
        direct_load_from_env({DIRECT_ENV: "yes"})


class _Linear(torch.nn.Module):
    def __init__(self, out_f: int, in_f: int) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(out_f, in_f), requires_grad=False)
        self.bias = None


class _Model(torch.nn.Module):
    """Two kernel layers; its checkpoint stores ``up`` as two halves (a shard mapping)."""

    def __init__(self) -> None:
        super().__init__()
        from vllm.model_executor.layers.utils import dispatch_cpu_unquantized_gemm

        self.down, self.up = _Linear(16, 32), _Linear(32, 16)
        for layer in (self.down, self.up):
            dispatch_cpu_unquantized_gemm(layer, remove_weight=False)

    def load_weights(self, weights):
        loaded = set()
        for name, t in weights:
            if name.startswith("up."):
                half = int(name[-1])
                self.up.weight[16 * half : 16 * (half + 1)].copy_(t)
                loaded.add("up.weight")
            else:
                getattr(self, name.split(".")[0]).weight.copy_(t)
                loaded.add(name)
        return loaded


def _checkpoint(seed: int) -> list[tuple[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    return [("down.weight", torch.randn(16, 32, generator=g)),
            ("up.0", torch.randn(16, 16, generator=g)), ("up.1", torch.randn(16, 16, generator=g))]  # fmt: skip


def _served(layer: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    return layer.cpu_linear(x, layer.weight, None)


def test_a_direct_load_serves_the_new_weights_through_rebuilt_handles():
    model = _Model()
    layers = kernel_layers(model)
    assert layers is not None and len(layers) == 2
    new = dict(_checkpoint(1))
    x = torch.randn(3, 32)
    before = _served(model.down, x)
    assert direct_load(model, layers, iter(new.items()))
    assert not torch.allclose(_served(model.down, x), before)  # handles hold their own copy
    assert torch.allclose(_served(model.down, x), x @ new["down.weight"].T, atol=1e-4)
    up = torch.cat([new["up.0"], new["up.1"]])
    y = torch.randn(2, 16)
    assert torch.allclose(_served(model.up, y), y @ up.T, atol=1e-4)


def test_a_load_that_leaves_a_parameter_out_falls_back_to_reload(monkeypatch):
    monkeypatch.setenv(DIRECT_ENV, "1")
    model = _Model()
    reloaded = []

    class Runner:
        def get_model(self):
            return model

        def reload_weights(self, weights_iterator):
            reloaded.append([n for n, _ in weights_iterator])

    partial = _checkpoint(2)[:1]  # no "up": the direct load cannot vouch for the model
    assert load_into(Runner(), partial) is False and reloaded == [["down.weight"]]
    assert load_into(Runner(), _checkpoint(3)) is True and len(reloaded) == 1


def test_a_dropped_kernel_weight_means_no_direct_load():
    model = _Model()
    model.up.weight = torch.nn.Parameter(torch.empty(0), requires_grad=False)
    assert kernel_layers(model) is None


def test_kept_weights_wrap_vllms_dispatch_once_and_keep_the_weight():
    from vllm.model_executor.layers import utils

    saved = utils.dispatch_cpu_unquantized_gemm
    try:
        assert keep_linear_weights() and keep_linear_weights()
        assert utils.dispatch_cpu_unquantized_gemm.tandem_original is saved  # not wrapped twice
        layer = _Linear(8, 8)
        utils.dispatch_cpu_unquantized_gemm(layer, remove_weight=True)
        assert layer.weight.shape == (8, 8) and hasattr(layer, "cpu_linear")
    finally:
        utils.dispatch_cpu_unquantized_gemm = saved
