"""QAT end to end: thread-count determinism (subprocesses) and a small
training task where QAT int4 beats post-training quantization."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import quantrs
from quantrs import qat
from quantrs.reference import qat as ref

_SCRIPT = textwrap.dedent(
    """
    import hashlib, numpy as np, quantrs
    n = 300_001
    w = np.random.default_rng(0).standard_normal(n)
    out = hashlib.sha256()
    for target in ["int8", "int4", "fp8_e4m3"]:
        wt = w.copy()
        cfg = quantrs.QatConfig(target, rounding="stochastic", lr=1e-2)
        opt = quantrs.QatOptimizer(wt, cfg, rng=123)
        for s in range(3):
            opt.step(wt, np.cos(wt + s))
        out.update(wt.tobytes())
        out.update(opt.quantized_weights.tobytes())
    print(out.hexdigest(), quantrs.build_info()["threads"])
    """
)


@pytest.mark.kernel
def test_same_bits_with_one_and_two_threads():
    digests = {}
    for threads in ["1", "2"]:
        env = dict(os.environ, RAYON_NUM_THREADS=threads)
        res = subprocess.run(
            [sys.executable, "-c", _SCRIPT], env=env, capture_output=True, text=True, check=True
        )
        digest, used = res.stdout.split()
        assert used == threads
        digests[threads] = digest
    assert digests["1"] == digests["2"]


def _task(seed, wseed, n=2000, d=16, c=10.0):
    """Logistic regression on features sharing a strong common factor.

    ``x = c * z + e`` with ``z`` one shared N(0, 1) per sample; the label
    depends on ``e`` only. The float solution must keep ``sum(w)`` near 0:
    the common factor amplifies every rounding error that does not cancel,
    which is where independent rounding (PTQ) hurts and training through the
    quantizer can help.
    """
    rng = np.random.default_rng(seed)
    e = rng.standard_normal((n, d))
    x = c * rng.standard_normal((n, 1)) + e
    w_true = np.random.default_rng(wseed).standard_normal(d)
    y = (e @ w_true + 0.1 * rng.standard_normal(n) > 0).astype(np.float64)
    return x, y


def _loss_grad(x, y, w):
    z = x @ w
    loss = float(np.mean(np.logaddexp(0.0, z) - y * z))
    return loss, x.T @ (1.0 / (1.0 + np.exp(-z)) - y) / len(y)


def train_float(x, y, steps, lr):
    d = x.shape[1]
    w, m, v = np.zeros(d), np.zeros(d), np.zeros(d)
    for t in range(1, steps + 1):
        w, m, v = ref.adamw_step(w, _loss_grad(x, y, w)[1], m, v, t, lr=lr)
    return w


def train_qat(x, y, steps, lr):
    w = np.full(x.shape[1], 0.01)
    opt = quantrs.QatOptimizer(w, quantrs.QatConfig("int4", lr=lr), rng=0)
    for _ in range(steps):
        p = opt.quant_params()
        # Forward with the quantized weights; the gradient passes straight
        # through to the master, masked outside the representable range.
        g = _loss_grad(x, y, opt.quantized_weights)[1]
        opt.step(w, qat.fake_quant_backward(g, w, p.lo, p.hi))
    return opt.quantized_weights.copy()


def test_qat_int4_beats_post_training_quantization():
    rows = []
    for wseed in range(100, 106):
        x, y = _task(0, wseed)
        xt, yt = _task(1, wseed)
        w_float = train_float(x, y, 1500, 1e-2)
        # 300 QAT steps: later, without weight decay, the largest master weight keeps
        # growing on this nearly separable task, the per-tensor int4 scale grows with it
        # and the trajectory becomes chaotic (a different BLAS kernel's rounding in the
        # gradient moves the step-1500 test loss by 2x), so the claim is checked where
        # it is robust.
        w_qat = train_qat(x, y, 300, 1e-2)
        test_loss = [
            _loss_grad(xt, yt, w)[0] for w in (w_float, qat.fake_quant(w_float, "int4"), w_qat)
        ]
        rows.append(test_loss)
    rows = np.array(rows)
    print("\ntest loss per task: float, PTQ int4, QAT int4\n", np.round(rows, 3))
    float_loss, ptq, qat_loss = rows.T
    assert np.all(float_loss < ptq)  # int4 costs something ...
    assert np.median(qat_loss) < 0.75 * np.median(ptq)  # ... QAT recovers part of it
    assert np.sum(qat_loss < ptq) >= 4


def test_hashes_differ_between_seeds():
    # Guard for the determinism test above: the digest sees the randomness.
    def digest(seed):
        w = np.linspace(-1, 1, 10_000)
        opt = quantrs.QatOptimizer(w, quantrs.QatConfig("int8", rounding="stochastic"), rng=seed)
        return hashlib.sha256(opt.quantized_weights.tobytes()).hexdigest()

    assert digest(1) != digest(2)
