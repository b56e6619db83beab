"""``quantrs demo``: train a small MLP on the embedded digits five ways, serve it two ways.

Training rows (same initial weights and mini-batch order for each, from ``--seed``):

- float32 AdamW in NumPy (:class:`._mlp.AdamW`), the baseline;
- ``AdamW4bit`` (4-bit optimizer state);
- ``QatOptimizer`` with targets int8 / int4 / fp8_e4m3 for the two weight matrices:
  the forward pass uses the optimizer's fake-quantized view, and the gradient with
  respect to that view is applied to the full-precision master (straight-through
  estimator). Biases stay float32 and use the NumPy AdamW, as in common QAT recipes
  (biases are added in the accumulator's precision at inference).

Serving rows take the float32-trained weights and run inference through
``QuantizedWeight`` (INT4, group 32, ``matmul``) and ``PerTensorFP8Linear`` (FP8 E4M3,
static activation scales ``absmax / 448`` calibrated on the training inputs of each
layer). Their loss and accuracy use the quantized model; their time is quantization
plus inference on both splits.

A type that is not in the installed build gets an honest "n/a (not built)" row.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from . import _mlp
from ._mlp import F32

EPOCHS = 50  # the float32 run has converged by then (train loss ~0.008)
LR = 2e-3
WEIGHT_DECAY = 1e-4
BATCH = 32
HIDDEN = 64
QAT_TARGETS = ("int8", "int4", "fp8_e4m3")
NOT_BUILT = "n/a (not built)"


@dataclass
class Row:
    method: str
    loss: float | None = None
    accuracy: float | None = None
    state_bytes: int | None = None
    model_bytes: int | None = None
    seconds: float | None = None
    curve: list[float] = field(default_factory=list)
    note: str = ""


# --- trainers: weights() for the forward pass, apply(grads) for the update ----------


class FloatTrainer:
    def __init__(self, params):
        self.p = params
        self.opt = _mlp.AdamW(LR, WEIGHT_DECAY)

    def weights(self):
        return self.p

    def apply(self, grads):
        for k, g in grads.items():
            self.opt.update(k, self.p[k], g)
        self.opt.step()

    def state_bytes(self) -> int:
        return self.opt.state_bytes()


class AdamW4bitTrainer(FloatTrainer):
    def __init__(self, params):
        from .. import AdamW4bit

        self.p = params
        self.opt = AdamW4bit(learning_rate=LR, weight_decay=WEIGHT_DECAY)

    def apply(self, grads):
        for k, g in grads.items():
            self.opt.update(self.p[k], g, name=k)
        self.opt.step()

    def state_bytes(self) -> int:
        return int(self.opt.memory_usage().total_bytes)


class QatTrainer:
    def __init__(self, params, target: str, seed: int):
        from .. import QatConfig, QatOptimizer

        self.p = params
        self.target = target
        self.bias_opt = _mlp.AdamW(LR, WEIGHT_DECAY)
        self.master = {k: params[k].reshape(-1).copy() for k in ("W1", "W2")}
        cfg = QatConfig(target, lr=LR, weight_decay=WEIGHT_DECAY)
        self.qat = {k: QatOptimizer(m, cfg, rng=seed) for k, m in self.master.items()}

    def weights(self):
        w = dict(self.p)
        for k, opt in self.qat.items():
            w[k] = np.asarray(opt.quantized_weights, F32).reshape(self.p[k].shape)
        return w

    def apply(self, grads):
        for k, opt in self.qat.items():
            opt.step(self.master[k], grads[k].reshape(-1).astype(self.master[k].dtype))
        for k in ("b1", "b2"):
            self.bias_opt.update(k, self.p[k], grads[k])
        self.bias_opt.step()

    def model_bytes(self) -> int:
        """Deployed size: the quantized weights packed (int4: half a byte per weight)
        with one float32 scale each, and float32 biases."""
        per_weight = 0.5 if self.target == "int4" else 1.0
        packed = sum(int(m.size * per_weight) + 4 for m in self.master.values())
        return packed + self.p["b1"].nbytes + self.p["b2"].nbytes

    def state_bytes(self) -> int:
        qat = sum(_qat_state_bytes(o, m) for o, m in zip(self.qat.values(), self.master.values()))
        return qat + self.bias_opt.state_bytes()


def _qat_state_bytes(opt, master: np.ndarray) -> int:
    """m, v and the quantized view, from the live buffers where the binding exposes
    them (``moments()``), else from their size: all three have the master's dtype."""
    moments = getattr(opt, "moments", None)
    if callable(moments):
        live = [np.asarray(a) for a in moments()] + [np.asarray(opt.quantized_weights)]
        return sum(a.nbytes for a in live)
    return 3 * master.nbytes


def _train(trainer, data, epochs: int, seed: int) -> tuple[list[float], float]:
    x, y = data[0], data[1]
    rng = np.random.default_rng(seed + 1)  # the same batch order for every method
    curve = []
    t0 = time.perf_counter()
    for _ in range(epochs):
        order = rng.permutation(len(y))
        losses = []
        for b0 in range(0, len(y), BATCH):
            idx = order[b0 : b0 + BATCH]
            loss, grads = _mlp.loss_and_grads(trainer.weights(), x[idx], y[idx])
            trainer.apply(grads)
            losses.append(loss)
        curve.append(float(np.mean(losses)))
    return curve, time.perf_counter() - t0


def _score(row: Row, predict, data) -> None:
    row.loss, _ = _mlp.evaluate(predict(data[0]), data[1])
    _, row.accuracy = _mlp.evaluate(predict(data[2]), data[3])


def _run_trainer(method: str, make, data, epochs: int, seed: int) -> tuple[Row, dict | None]:
    """Train one way; return the row and the trained float parameters."""
    row = Row(method)
    params = _mlp.init_params(HIDDEN, np.random.default_rng(seed))
    try:
        trainer = make(params)
    except ImportError:
        row.note = NOT_BUILT
        return row, None
    row.curve, row.seconds = _train(trainer, data, epochs, seed)
    w = trainer.weights()
    _score(row, lambda x: _mlp.forward(w, x), data)
    row.state_bytes = trainer.state_bytes()
    model_bytes = getattr(trainer, "model_bytes", None)
    row.model_bytes = model_bytes() if model_bytes else sum(a.nbytes for a in w.values())
    return row, params


# --- serving ----------------------------------------------------------------------------


def _serve(name: str, build, p, data) -> Row:
    """Score the layers ``build(p, data)`` makes: ``(predict, model_bytes)``; the time
    includes the quantization."""
    row = Row(name)
    t0 = time.perf_counter()
    try:
        predict, row.model_bytes = build(p, data)
    except ImportError:
        row.note = NOT_BUILT
        return row
    _score(row, predict, data)
    row.seconds = time.perf_counter() - t0
    return row


def _int4_layers(p, data):
    from .. import QuantizedWeight

    # The rtn grid, the one the QAT int4 row trains on: the two rows differ by training
    # only.
    q1 = QuantizedWeight.quantize(p["W1"], group_size=32, method="rtn")
    q2 = QuantizedWeight.quantize(p["W2"], group_size=32, method="rtn")

    def predict(x):
        h = np.maximum(q1.matmul(x) + p["b1"], 0)
        return q2.matmul(h) + p["b2"]

    return predict, q1.nbytes + q2.nbytes + p["b1"].nbytes + p["b2"].nbytes


def _fp8_layers(p, data):
    from .. import PerTensorFP8Linear

    x_train = data[0]
    s1 = F32(np.abs(x_train).max() / F32(448))
    l1 = PerTensorFP8Linear.from_float(p["W1"].T, bias=p["b1"], activation_scale=s1)
    h_train = np.maximum(x_train @ p["W1"] + p["b1"], 0)  # calibrate on float activations
    s2 = F32(np.abs(h_train).max() / F32(448))
    l2 = PerTensorFP8Linear.from_float(p["W2"].T, bias=p["b2"], activation_scale=s2)

    def predict(x):
        return l2.forward(np.maximum(l1.forward(x), 0))

    return predict, p["W1"].size + p["W2"].size + 4 * 4 + p["b1"].nbytes + p["b2"].nbytes


def run_demo(seed: int = 0, epochs: int = EPOCHS) -> tuple[dict, list[Row]]:
    """The settings and all rows of the demo table, in order (deterministic for a seed)."""
    data = _mlp.load_digits()
    settings = {
        "seed": seed,
        "epochs": epochs,
        "train": len(data[1]),
        "test": len(data[3]),
        "hidden": HIDDEN,
        "batch": BATCH,
        "lr": LR,
        "weight_decay": WEIGHT_DECAY,
    }
    row, float_params = _run_trainer("float32 AdamW (NumPy)", FloatTrainer, data, epochs, seed)
    rows = [row]
    rows.append(_run_trainer("AdamW4bit", AdamW4bitTrainer, data, epochs, seed)[0])
    for target in QAT_TARGETS:
        make = lambda p, t=target: QatTrainer(p, t, seed)  # noqa: E731
        rows.append(_run_trainer(f"QAT {target}", make, data, epochs, seed)[0])
    rows.append(_serve("serve INT4 (QuantizedWeight g32)", _int4_layers, float_params, data))
    rows.append(_serve("serve FP8 (PerTensorFP8Linear W8A8)", _fp8_layers, float_params, data))
    return settings, rows
