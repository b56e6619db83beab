"""The serving fast path's cached kernel call (``_layer_io.serve``): made once per layer,
made again when what it read changes (a buffer replaced, a storage swapped under a
buffer, ``Int4Linear.activations`` set), and equal to the checked custom-op route."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

import quantrs.torch as qt

torch.manual_seed(0)


def _layers():
    lin = nn.Linear(64, 24)
    return {
        "int4": qt.Int4Linear.from_linear(lin),
        "int8": qt.Int8Linear.from_linear(lin),
        "fp8": qt.FP8Linear.from_linear(lin),
        "gguf": qt.quantize_(nn.Sequential(lin), "int4_asym", 32)[0],
    }


@pytest.mark.parametrize("name", list(_layers()))
@torch.no_grad()
def test_cache_is_made_once_and_equals_the_op_route(name):
    m = _layers()[name]
    x = torch.randn(3, 64)
    y = m(x)
    hit = m.__dict__["_views"]
    assert torch.equal(m(x), y) and m.__dict__["_views"] is hit
    # float64 in takes the checked route through the custom op: the same kernel
    assert torch.equal(m(x.double()).float(), y)


@pytest.mark.parametrize("name", list(_layers()))
@torch.no_grad()
def test_storage_swapped_under_a_buffer_is_seen(name):
    m = _layers()[name]
    first = next(iter(m.__dict__["_buffers"]))  # the weight codes, the first view
    x = torch.randn(2, 64)
    y0 = m(x)
    buf = getattr(m, first)
    fresh = buf.clone()
    if fresh.is_floating_point():
        fresh.mul_(2)
    else:
        fresh.copy_(torch.from_numpy(np.roll(fresh.numpy(), 1, axis=0)))
    buf.data = fresh  # same tensor object, new storage
    assert m.__dict__["_views"][2][0].ctypes.data != buf.data_ptr()
    y1 = m(x)
    assert m.__dict__["_views"][2][0].ctypes.data == buf.data_ptr()
    assert not torch.equal(y0, y1)


@torch.no_grad()
def test_setting_int4_activations_rebuilds_the_call():
    lin = nn.Linear(64, 24)
    m, want = qt.Int4Linear.from_linear(lin), qt.Int4Linear.from_linear(lin, activations="int8")
    x = torch.randn(2, 64)
    y_float = m(x)
    m.activations = "int8"
    assert m.activations == "int8" and "activations='int8'" in repr(m)
    assert torch.equal(m(x), want(x)) and not torch.equal(m(x), y_float)
    with pytest.raises(Exception, match="activations"):
        m.activations = "bf16"
    assert m.activations == "int8"
