"""Every m method converges within 2 % of the float32 AdamW oracle's final loss on the suite
(least squares, logistic regression, a small MLP; SPEC section 6)."""

from __future__ import annotations

import pytest

import quantrs
from quantrs.reference import optim as R

_BASE: dict[str, float] = {}


def base_loss(name):
    if name not in _BASE:
        steps, lr = R.CONVERGENCE_SETTINGS[name]
        _BASE[name] = R.train(R.CONVERGENCE_TASKS[name](), R.AdamWReference(lr), steps, lr)
    return _BASE[name]


@pytest.mark.kernel
@pytest.mark.parametrize("task", list(R.CONVERGENCE_TASKS))
@pytest.mark.parametrize("method", ["nf4", "int4", "dynamic", "int8"])
def test_converges_within_two_percent(task, method):
    steps, lr = R.CONVERGENCE_SETTINGS[task]
    opt = quantrs.AdamW4bit.with_quantization_config(
        quantrs.Adam4bitOptimizerConfig(lr), quantrs.AdvancedQuantizationConfig(method)
    )
    loss = R.train(R.CONVERGENCE_TASKS[task](), opt, steps, lr)
    assert loss <= 1.02 * base_loss(task), (loss, base_loss(task))


@pytest.mark.parametrize("vmap", ["linear", "log", "sqrt_log"])
def test_other_variance_maps_converge_on_the_mlp(vmap):
    steps, lr = R.CONVERGENCE_SETTINGS["mlp"]
    opt = quantrs.AdamW4bit.with_quantization_config(
        quantrs.Adam4bitOptimizerConfig(lr), quantrs.AdvancedQuantizationConfig(variance_map=vmap)
    )
    loss = R.train(R.MLP(), opt, steps, lr)
    assert loss <= 1.02 * base_loss("mlp")


def test_rank1_normalization_converges_on_the_mlp():
    steps, lr = R.CONVERGENCE_SETTINGS["mlp"]
    opt = quantrs.AdamW4bit.with_quantization_config(
        quantrs.Adam4bitOptimizerConfig(lr),
        quantrs.AdvancedQuantizationConfig(rank1_normalization=True),
    )
    loss = R.train(R.MLP(), opt, steps, lr)
    assert loss <= 1.02 * base_loss("mlp")
