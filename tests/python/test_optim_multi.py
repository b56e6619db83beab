"""The multi-tensor step (``_core.adam4bit_multi_step``, and ``quantrs.torch.AdamW4bit``'s
step through it): the same bits as one ``update`` + ``step`` per parameter, and every bad
input rejected with nothing changed."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import quantrs
import quantrs.torch as qt
from quantrs import _core

SHAPES = [(768,), (2,), (130, 128), (3, 16384 + 2)]


def _data(seed: int):
    rng = np.random.default_rng(seed)
    ws = [rng.standard_normal(s, dtype=np.float32) for s in SHAPES]
    gs = [(rng.standard_normal(s, dtype=np.float32) * 0.01) for s in SHAPES]
    return ws, gs


def _engines(cls=quantrs.AdamW4bit):
    return [cls(1e-3, 0.9, 0.999, 1e-8, 0.01) for _ in SHAPES]


@pytest.mark.parametrize("cls", [quantrs.AdamW4bit, quantrs.Adam4bit])
def test_same_bits_as_one_update_per_parameter(cls):
    ws, _ = _data(0)
    w1, w2 = [w.copy() for w in ws], [w.copy() for w in ws]
    e1, e2 = _engines(cls), _engines(cls)
    for t in range(3):
        _, gs = _data(t + 1)
        for e, w, g in zip(e1, w1, gs):
            e.update(w, g, name="w")
            e.step()
        _core.adam4bit_multi_step(e2, w2, gs, name="w")
    for a, b, e, f in zip(w1, w2, e1, e2):
        np.testing.assert_array_equal(a, b)
        sa, sb = e.state_dict(), f.state_dict()
        assert sa.keys() == sb.keys()
        for k in sa:
            np.testing.assert_array_equal(np.asarray(sa[k]), np.asarray(sb[k]))
    # The result is AdamW's: close to a float32 reference after one step from zero state.
    assert all(not np.array_equal(a, w) for a, w in zip(w2, ws))


def test_hyper_replaces_every_engines_settings():
    ws, gs = _data(3)
    e = _engines()
    _core.adam4bit_multi_step(e, ws, gs, name="w", hyper=(2e-3, 0.8, 0.99, 1e-6, 0.0))
    for x in e:
        assert x.get_lr() == pytest.approx(2e-3)
        c = x.config().optimizer
        assert (c.beta1, c.beta2, c.weight_decay) == pytest.approx((0.8, 0.99, 0.0))
    hs = [(1e-3 * (i + 1), 0.9, 0.999, 1e-8, 0.01) for i in range(len(SHAPES))]
    _core.adam4bit_multi_step(e, ws, gs, name="w", hyper=hs)
    assert [x.get_lr() for x in e] == pytest.approx([h[0] for h in hs])


def _bad_calls():
    ws, gs = _data(4)
    nan = [g.copy() for g in gs]
    nan[2][5, 7] = np.nan
    return [
        ("grads", lambda e: _core.adam4bit_multi_step(e, ws, gs[:-1])),
        ("params[2]", lambda e: _core.adam4bit_multi_step(e, ws, nan, name="w")),
        ("engines[1]", lambda e: _core.adam4bit_multi_step([e[0], 3, *e[2:]], ws, gs)),
        ("params[1]", lambda e: _core.adam4bit_multi_step(e, [ws[0], ws[0], *ws[2:]], gs)),
        ("params[3]", lambda e: _core.adam4bit_multi_step(e, ws, [*gs[:3], gs[3][:1]])),
        ("hyper", lambda e: _core.adam4bit_multi_step(e, ws, gs, hyper=(-1, 0.9, 0.9, 1, 0))),
        ("hyper", lambda e: _core.adam4bit_multi_step(e, ws, gs, hyper=[(1e-3, 0.9, 0.9, 1, 0)])),
    ]


@pytest.mark.parametrize("where,call", _bad_calls(), ids=lambda x: x if isinstance(x, str) else "")
def test_bad_inputs_name_the_index_and_change_nothing(where, call):
    ws, _ = _data(4)
    e = _engines()
    before = [w.copy() for w in ws]
    with pytest.raises((quantrs.QuantError, TypeError)) as info:
        call(e)
    assert where in str(info.value)
    assert all(x.num_parameters() == 0 for x in e)
    assert all(x.get_lr() == pytest.approx(1e-3) for x in e)
    for a, b in zip(ws, before):
        np.testing.assert_array_equal(a, b)


def test_torch_step_matches_the_numpy_engines():
    ws, gs = _data(5)
    ps = [torch.from_numpy(w.copy()).requires_grad_() for w in ws]
    opt = qt.AdamW4bit(ps, lr=1e-3, weight_decay=0.01)
    engines = _engines()
    wn = [w.copy() for w in ws]
    for t in range(3):
        _, gs = _data(10 + t)
        for p, g in zip(ps, gs):
            p.grad = torch.from_numpy(g.copy())
        opt.step()
        for e, w, g in zip(engines, wn, gs):
            e.update(w, g, name="w")
            e.step()
    for p, w in zip(ps, wn):
        np.testing.assert_array_equal(p.detach().numpy(), w)
    assert all(float(opt.state[p]["step"]) == 3.0 for p in ps)


def test_torch_bad_gradient_names_the_parameter_and_changes_nothing():
    ws, gs = _data(6)
    ps = [torch.from_numpy(w.copy()).requires_grad_() for w in ws]
    opt = qt.AdamW4bit([{"params": ps[:1]}, {"params": ps[1:], "weight_decay": 0.0}])
    for p, g in zip(ps, gs):
        p.grad = torch.from_numpy(g.copy())
    opt.step()
    after_one = [p.detach().clone() for p in ps]
    ps[3].grad[1, 4] = float("inf")
    with pytest.raises(quantrs.QuantError, match=r"parameter 3: .*grad"):
        opt.step()
    for p, a in zip(ps, after_one):
        assert torch.equal(p.detach(), a)
    assert all(float(opt.state[p]["step"]) == 1.0 for p in ps)
