"""The convergence tasks: small NumPy models with exact, hand-written gradients.

Every task gives float32 parameters (``init``), the loss and gradients of a batch
(``loss_grad``), the batches of a run (``batches``: index arrays, or ``None`` for
full-batch), a held-out metric (``evaluate``) and its run settings (``steps``, ``lr``,
``schedule``, ``weight_decay``). Data and initial weights come from fixed seeds, so
every optimizer sees exactly the same problem and the same batch order.

Initialization follows PyTorch's ``nn.Linear`` (uniform in ``+-1/sqrt(fan_in)`` for
weights and biases), the setting of the issue this suite was built for.
"""

from __future__ import annotations

import numpy as np

F = np.float32


def linear_init(rng, fan_in, fan_out, bias=True):
    b = 1.0 / np.sqrt(fan_in)
    w = rng.uniform(-b, b, (fan_in, fan_out)).astype(F)
    return (w, rng.uniform(-b, b, fan_out).astype(F)) if bias else (w, None)


def mlp_init(sizes, seed=1):
    """``W{i}``, ``b{i}`` of an MLP with layer widths ``sizes`` (PyTorch's init)."""
    rng = np.random.default_rng(seed)
    p = {}
    for i, (a, b) in enumerate(zip(sizes[:-1], sizes[1:])):
        p[f"W{i}"], p[f"b{i}"] = linear_init(rng, a, b)
    return p


def softmax_xent(z, y):
    """Mean cross-entropy of logits ``z`` against labels ``y``, and d loss / d z."""
    z = z - z.max(1, keepdims=True)
    p = np.exp(z)
    p /= p.sum(1, keepdims=True)
    rows = np.arange(len(y))
    loss = float(-np.log(p[rows, y] + F(1e-12)).mean())
    p[rows, y] -= 1
    return loss, p / F(len(y))


class Task:
    """A model, its data, and how long and how fast to train it."""

    name = ""
    kind = ""
    steps = 1000
    lr = 1e-3
    schedule = "cosine"  # or "constant"
    weight_decay = 0.0
    metric = ""

    def init(self) -> dict[str, np.ndarray]:
        raise NotImplementedError

    def loss_grad(self, p, idx=None):
        raise NotImplementedError

    def batches(self, steps, seed=2):
        return [None] * steps

    def evaluate(self, p) -> float:
        raise NotImplementedError


class _Minibatch(Task):
    batch = 64

    def batches(self, steps, seed=2):
        rng = np.random.default_rng(seed)
        n = len(self.y)
        return [rng.integers(0, n, self.batch) for _ in range(steps)]


class _MLPClassifier(_Minibatch):
    """ReLU MLP ``sizes[0] -> ... -> sizes[-1]`` on Gaussian clusters."""

    kind = "mini-batch classifier"
    metric = "test accuracy"

    def __init__(self, sizes, n_train, n_test, spread, seed=0):
        rng = np.random.default_rng(seed)
        d, k = sizes[0], sizes[-1]
        centers = rng.standard_normal((k, d)) * spread
        y = rng.integers(0, k, n_train + n_test)
        x = (centers[y] + rng.standard_normal((len(y), d))).astype(F)
        self.X, self.y = x[:n_train], y[:n_train]
        self.Xt, self.yt = x[n_train:], y[n_train:]
        self.sizes = sizes

    def init(self):
        return mlp_init(self.sizes)

    def _forward(self, p, x):
        hs = [x]
        n = len(self.sizes) - 1
        for i in range(n):
            z = hs[-1] @ p[f"W{i}"] + p[f"b{i}"]
            hs.append(np.maximum(z, 0) if i < n - 1 else z)
        return hs

    def loss_grad(self, p, idx=None):
        x, y = (self.X, self.y) if idx is None else (self.X[idx], self.y[idx])
        hs = self._forward(p, x)
        loss, dz = softmax_xent(hs[-1], y)
        g = {}
        for i in reversed(range(len(self.sizes) - 1)):
            g[f"W{i}"] = hs[i].T @ dz
            g[f"b{i}"] = dz.sum(0)
            if i:
                dz = (dz @ p[f"W{i}"].T) * (hs[i] > 0)
        return loss, g

    def evaluate(self, p):
        return float(np.mean(self._forward(p, self.Xt)[-1].argmax(1) == self.yt))


class IssueMLP(_MLPClassifier):
    """The task of the issue: MLP 256-512-10 on 10 Gaussian clusters, batch 128, constant
    lr 1e-3, weight decay 0.01, 1500 steps (train loss approaches ~0.03)."""

    name = "issue_mlp"
    steps, lr, schedule, weight_decay, batch = 1500, 1e-3, "constant", 0.01, 128

    def __init__(self):
        super().__init__([256, 512, 10], n_train=24576, n_test=2048, spread=0.19)


class DeepClassifier(_MLPClassifier):
    """Three layers on 8 clusters, cosine schedule, trained to a low loss."""

    name = "deep_classifier"
    steps, lr, schedule, weight_decay, batch = 2000, 3e-3, "cosine", 0.01, 64

    def __init__(self):
        super().__init__([32, 128, 128, 8], n_train=2048, n_test=2048, spread=0.5)


class LongMLP(_MLPClassifier):
    """A long run: 6000 steps at a constant lr (v's decay matters most late in a run)."""

    name = "long_mlp"
    steps, lr, schedule, weight_decay, batch = 6000, 1e-3, "constant", 0.01, 64

    def __init__(self):
        super().__init__([64, 256, 10], n_train=4096, n_test=2048, spread=0.3)


class LeastSquares(Task):
    """Full-batch multi-output least squares ``Y = X W* + noise``, to the noise floor."""

    name = "least_squares"
    kind = "full-batch regression"
    metric = "test MSE"
    steps, lr, schedule = 1500, 1e-2, "cosine"

    def __init__(self, n=1024, d=128, k=32, seed=0):
        rng = np.random.default_rng(seed)
        x = rng.standard_normal((2 * n, d)).astype(F)
        w = rng.standard_normal((d, k)) / np.sqrt(d)
        y = (x @ w + 0.1 * rng.standard_normal((2 * n, k))).astype(F)
        self.X, self.Y, self.Xt, self.Yt = x[:n], y[:n], x[n:], y[n:]

    def init(self):
        d, k = self.X.shape[1], self.Y.shape[1]
        return {"W": np.zeros((d, k), F), "b": np.zeros(k, F)}

    def loss_grad(self, p, idx=None):
        r = self.X @ p["W"] + p["b"] - self.Y
        scale = F(2.0 / r.size)
        return float(np.mean(r * r)), {"W": scale * (self.X.T @ r), "b": scale * r.sum(0)}

    def evaluate(self, p):
        r = self.Xt @ p["W"] + p["b"] - self.Yt
        return float(np.mean(r * r))


class MLPRegression(Task):
    """Full-batch tanh MLP 8-128-128-1 fitting a smooth function."""

    name = "mlp_regression"
    kind = "full-batch regression"
    metric = "test MSE"
    steps, lr, schedule = 2000, 3e-3, "cosine"
    sizes = (8, 128, 128, 1)

    def __init__(self, n=512, seed=0):
        rng = np.random.default_rng(seed)
        x = rng.uniform(-1, 1, (2 * n, self.sizes[0])).astype(F)
        a = rng.standard_normal(self.sizes[0])
        y = np.sin(2 * x @ a) + 0.5 * np.cos(3 * x[:, 0] * x[:, 1])
        y = (y + 0.01 * rng.standard_normal(2 * n)).astype(F)[:, None]
        self.X, self.Y, self.Xt, self.Yt = x[:n], y[:n], x[n:], y[n:]

    def init(self):
        return mlp_init(self.sizes)

    def _forward(self, p, x):
        hs = [x]
        n = len(self.sizes) - 1
        for i in range(n):
            z = hs[-1] @ p[f"W{i}"] + p[f"b{i}"]
            hs.append(np.tanh(z) if i < n - 1 else z)
        return hs

    def loss_grad(self, p, idx=None):
        hs = self._forward(p, self.X)
        r = hs[-1] - self.Y
        dz = F(2.0 / r.size) * r
        g = {}
        for i in reversed(range(len(self.sizes) - 1)):
            g[f"W{i}"] = hs[i].T @ dz
            g[f"b{i}"] = dz.sum(0)
            if i:
                dz = (dz @ p[f"W{i}"].T) * (1 - hs[i] * hs[i])
        return float(np.mean(r * r)), g

    def evaluate(self, p):
        r = self._forward(p, self.Xt)[-1] - self.Yt
        return float(np.mean(r * r))


class LogisticRegression(Task):
    """Full-batch multinomial logistic regression, 128 features, 10 classes."""

    name = "logistic_regression"
    kind = "full-batch logistic regression"
    metric = "test accuracy"
    steps, lr, schedule, weight_decay = 1500, 1e-2, "cosine", 0.0

    def __init__(self, n=2048, d=128, k=10, seed=0):
        rng = np.random.default_rng(seed)
        x = rng.standard_normal((2 * n, d)).astype(F)
        w = rng.standard_normal((d, k)) * 0.3
        z = x @ w + rng.gumbel(size=(2 * n, k))
        y = z.argmax(1)
        self.X, self.y, self.Xt, self.yt = x[:n], y[:n], x[n:], y[n:]

    def init(self):
        d, k = self.X.shape[1], int(self.y.max()) + 1
        return {"W": np.zeros((d, k), F), "b": np.zeros(k, F)}

    def loss_grad(self, p, idx=None):
        loss, dz = softmax_xent(self.X @ p["W"] + p["b"], self.y)
        return loss, {"W": self.X.T @ dz, "b": dz.sum(0)}

    def evaluate(self, p):
        return float(np.mean((self.Xt @ p["W"] + p["b"]).argmax(1) == self.yt))


def generated_text(n_chars=60000, seed=0):
    """Deterministic English-like text from a small grammar (no downloads)."""
    rng = np.random.default_rng(seed)
    subj = "the cat|a dog|my old friend|the quiet river|her brother|the small bird|our teacher"
    verb = "sees|finds|follows|remembers|carries|watches|paints|hears"
    obj = "the red house|a long road|the morning light|an empty boat|the green hill|a letter"
    adv = "slowly|today|again|in the rain|at night|with care|every spring"
    parts = [s.split("|") for s in (subj, verb, obj, adv)]
    out, size = [], 0
    while size < n_chars:
        words = [p[rng.integers(len(p))] for p in parts]
        if rng.random() < 0.4:
            words.pop()
        s = " ".join(words) + (". " if rng.random() < 0.8 else ", and ")
        out.append(s)
        size += len(s)
    return "".join(out)[:n_chars]


class CharLM(_Minibatch):
    """A character language model (embedding, 8 characters of context, a ReLU layer of
    256, softmax) on generated text; the metric is test bits per character."""

    name = "char_lm"
    kind = "character LM"
    metric = "test bits/char"
    steps, lr, schedule, weight_decay, batch = 3000, 2e-3, "cosine", 0.01, 64
    ctx, emb, hidden = 8, 24, 256

    def __init__(self):
        text = generated_text()
        vocab = sorted(set(text))
        ids = np.array([vocab.index(c) for c in text], np.int64)
        self.v = len(vocab)
        win = np.lib.stride_tricks.sliding_window_view(ids, self.ctx + 1)
        cut = int(0.9 * len(win))
        self.C, self.y = win[:cut, :-1], win[:cut, -1]
        self.Ct, self.yt = win[cut:, :-1], win[cut:, -1]

    def init(self):
        rng = np.random.default_rng(1)
        p = {"E": (rng.standard_normal((self.v, self.emb)) * 0.5).astype(F)}
        p["W0"], p["b0"] = linear_init(rng, self.ctx * self.emb, self.hidden)
        p["W1"], p["b1"] = linear_init(rng, self.hidden, self.v)
        return p

    def _forward(self, p, c):
        x = p["E"][c].reshape(len(c), -1)
        h = np.maximum(x @ p["W0"] + p["b0"], 0)
        return x, h, h @ p["W1"] + p["b1"]

    def loss_grad(self, p, idx=None):
        c, y = (self.C, self.y) if idx is None else (self.C[idx], self.y[idx])
        x, h, z = self._forward(p, c)
        loss, dz = softmax_xent(z, y)
        dh = (dz @ p["W1"].T) * (h > 0)
        dx = (dh @ p["W0"].T).reshape(len(c), self.ctx, self.emb)
        de = np.zeros_like(p["E"])
        np.add.at(de, c, dx)
        g = {"E": de, "W0": x.T @ dh, "b0": dh.sum(0), "W1": h.T @ dz, "b1": dz.sum(0)}
        return loss, g

    def evaluate(self, p):
        _, _, z = self._forward(p, self.Ct)
        loss, _ = softmax_xent(z, self.yt)
        return loss / float(np.log(2))


TASKS = {
    t.name: t
    for t in (
        IssueMLP,
        DeepClassifier,
        LeastSquares,
        MLPRegression,
        LogisticRegression,
        CharLM,
        LongMLP,
    )
}
