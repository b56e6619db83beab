"""The `quantrs` command line: entry points, `demo`, `bench`, the embedded data set."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
import textwrap
from importlib import resources

import numpy as np
import pytest

import quantrs
from quantrs.cli import _mlp, main

BUILT = {
    "AdamW4bit": hasattr(quantrs, "AdamW4bit"),
    "QAT": hasattr(quantrs, "QatOptimizer"),
    "INT4": hasattr(quantrs, "QuantizedWeight"),
    "FP8": hasattr(quantrs, "PerTensorFP8Linear"),
}


def _built(method: str) -> bool:
    for key, ok in BUILT.items():
        if key in method:
            return ok
    return True  # the float32 NumPy baseline


def demo(capsys, *argv) -> list[dict]:
    assert main(["demo", "--json", *argv]) == 0
    return json.loads(capsys.readouterr().out)["rows"]


# --- entry points ------------------------------------------------------------------------


@pytest.mark.parametrize("sub", [[], ["demo"], ["quantize"], ["inspect"], ["bench"]])
def test_help_of_every_subcommand(sub, capsys):
    with pytest.raises(SystemExit) as e:
        main([*sub, "--help"])
    assert e.value.code == 0
    assert capsys.readouterr().out.startswith(f"usage: quantrs {' '.join(sub)}".rstrip())


@pytest.mark.parametrize("script", [False, True])
def test_entry_points(script):
    if script:
        exe = shutil.which("quantrs")
        if exe is None:
            pytest.skip("quantrs console script not on PATH")
        cmd = [exe]
    else:
        cmd = [sys.executable, "-m", "quantrs"]
    out = subprocess.run([*cmd, "--help"], capture_output=True, text=True, check=True)
    assert out.stdout.startswith("usage: quantrs")
    bad = subprocess.run(
        [*cmd, "inspect", "/nonexistent.safetensors"], capture_output=True, text=True
    )
    assert bad.returncode == 1
    assert bad.stderr == "quantrs inspect: error: /nonexistent.safetensors: no such file\n"


def test_no_command_prints_help(capsys):
    assert main([]) == 2
    assert "COMMAND" in capsys.readouterr().out


def test_version(capsys):
    assert main(["--version"]) == 0
    assert quantrs.__version__ in capsys.readouterr().out


# --- data ----------------------------------------------------------------------------------


def test_embedded_digits_file_matches_its_readme():
    data = resources.files("quantrs").joinpath("data")
    digest = hashlib.sha256(data.joinpath("digits.npz").read_bytes()).hexdigest()
    readme = data.joinpath("README.md").read_text()
    assert f"`{digest}`" in readme
    assert "BSD 3-Clause" in readme


def test_embedded_digits():
    xtr, ytr, xte, yte = _mlp.load_digits()
    assert len(xtr) + len(xte) == 1797 and xte.shape == (359, 64)
    assert xtr.dtype == np.float32 and 0 <= xtr.min() and xtr.max() == 1
    assert np.array_equal(np.bincount(yte), np.bincount(yte, minlength=10))
    assert np.all(np.abs(np.bincount(yte) - 36) <= 1)  # stratified
    # every pixel is an integer count 0..16, as in the original data set
    assert np.array_equal(xtr * 16, np.round(xtr * 16))


def test_reference_adamw_matches_formula():
    rng = np.random.default_rng(0)
    p = rng.standard_normal(50).astype(np.float32)
    p64 = p.astype(np.float64)
    opt = _mlp.AdamW(lr=1e-2, weight_decay=0.1)
    m = v = np.zeros(50)
    for t in range(1, 6):
        g = rng.standard_normal(50).astype(np.float32)
        opt.update("p", p, g)
        opt.step()
        m = 0.9 * m + 0.1 * g
        v = 0.999 * v + 0.001 * g.astype(np.float64) ** 2
        p64 = p64 - 1e-2 * 0.1 * p64
        p64 = p64 - 1e-2 * (m / (1 - 0.9**t)) / (np.sqrt(v / (1 - 0.999**t)) + 1e-8)
    np.testing.assert_allclose(p, p64, rtol=1e-5, atol=1e-6)
    assert opt.state_bytes() == 2 * 50 * 4


def test_mlp_gradients_match_finite_differences():
    rng = np.random.default_rng(1)
    w = {k: v.astype(np.float64) for k, v in _mlp.init_params(8, rng).items()}
    w["b1"] += 0.1
    x = rng.random((5, 64))
    y = rng.integers(0, 10, 5)
    _, grads = _mlp.loss_and_grads(w, x, y)
    for k in w:
        flat = w[k].reshape(-1)
        for i in rng.choice(flat.size, 4, replace=False):
            old = flat[i]
            flat[i] = old + 1e-6
            lp = _mlp.softmax_xent(_mlp.forward(w, x), y)[0]
            flat[i] = old - 1e-6
            lm = _mlp.softmax_xent(_mlp.forward(w, x), y)[0]
            flat[i] = old
            assert abs(grads[k].reshape(-1)[i] - (lp - lm) / 2e-6) < 1e-4, (k, i)


# --- demo -----------------------------------------------------------------------------------


def test_demo_end_to_end_small(capsys):
    rows = demo(capsys, "--epochs", "2", "--seed", "3")
    by = {r["method"]: r for r in rows}
    assert len(rows) == 7
    assert list(by)[:2] == ["float32 AdamW (NumPy)", "AdamW4bit"]
    base = by["float32 AdamW (NumPy)"]
    assert base["accuracy"] > 80 and len(base["curve"]) == 2
    assert base["curve"][1] < base["curve"][0]
    n_params = 64 * 64 + 64 + 64 * 10 + 10
    assert base["state_bytes"] == 8 * n_params
    for r in rows:
        if _built(r["method"]):
            assert r["note"] == "" and r["accuracy"] > 50 and np.isfinite(r["loss"]), r
        else:
            assert r["note"] == "n/a (not built)" and r["accuracy"] is None, r
    if BUILT["AdamW4bit"]:
        # 4-bit state: at most ~1.1 bytes per parameter (codes + block scales)
        assert by["AdamW4bit"]["state_bytes"] <= 1.1 * n_params
    # the text table has one line per row
    assert main(["demo", "--epochs", "1"]) == 0
    out = capsys.readouterr().out
    assert all(r["method"] in out for r in rows)


def test_demo_is_deterministic(capsys):
    a = demo(capsys, "--epochs", "2", "--seed", "5")
    b = demo(capsys, "--epochs", "2", "--seed", "5")
    c = demo(capsys, "--epochs", "2", "--seed", "6")
    for r in a + b + c:
        r.pop("seconds")
    assert a == b
    assert a[0]["curve"] != c[0]["curve"]


@pytest.mark.skipif(not BUILT["AdamW4bit"], reason="AdamW4bit not built")
def test_demo_adamw4bit_accuracy_within_one_point(capsys):
    rows = {r["method"]: r for r in demo(capsys)}  # default settings
    ref, ours = rows["float32 AdamW (NumPy)"], rows["AdamW4bit"]
    assert ref["accuracy"] > 95
    assert ours["accuracy"] >= ref["accuracy"] - 1.0, (ours, ref)


def test_demo_plot(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    out = tmp_path / "curves.png"
    assert main(["demo", "--epochs", "2", "--plot", str(out)]) == 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert f"written to {out}" in capsys.readouterr().err


def test_demo_plot_without_matplotlib(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import now raises ImportError
    out = tmp_path / "curves.png"
    assert main(["demo", "--epochs", "1", "--plot", str(out)]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "needs matplotlib" in err
    assert not out.exists()


def test_demo_plot_into_missing_directory(tmp_path, capsys):
    assert main(["demo", "--epochs", "1", "--plot", str(tmp_path / "no" / "x.png")]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "does not exist" in err


def test_demo_bad_epochs(capsys):
    with pytest.raises(SystemExit) as e:
        main(["demo", "--epochs", "0"])
    assert e.value.code == 2
    assert "must be >= 1" in capsys.readouterr().err


# --- bench ----------------------------------------------------------------------------------

SCRIPT_TAIL = textwrap.dedent(
    """
    if __name__ == "__main__":
        import json, sys
        print("chatter before the rows")
        print(json.dumps(run("--quick" in sys.argv)))
    """
)
GOOD_BENCH = (
    textwrap.dedent(
        """
        def run(quick=False):
            n = 10 if quick else 1000
            return [
                {"bench": f"op n={n}", "ours_ms": 1.0, "baseline": "numpy", "baseline_ms": 4.0},
                {"name": "op2", "ours_ms": 2.0, "baseline_ms": 1.0, "ratio": 0.5, "gb/s": 3.5},
                {"bench": "machine read", "ours_ms": None, "baseline_ms": None, "bw": 20.0},
            ]
        """
    )
    + SCRIPT_TAIL
)


def test_bench_convention(tmp_path, capsys):
    (tmp_path / "bench_good.py").write_text(GOOD_BENCH)
    assert main(["bench", "--dir", str(tmp_path), "--quick", "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert res["failures"] == []
    r0, r1, r2 = res["rows"]
    assert r0["suite"] == "good" and r0["bench"] == "op n=10" and r0["ratio"] == 4.0
    assert r1["bench"] == "op2" and r1["ratio"] == 0.5 and r1["gb/s"] == 3.5
    assert r2["ratio"] is None and r2["bw"] == 20.0
    assert main(["bench", "--dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "op n=1000" in out and "4.00x" in out and "gb/s=3.5" in out
    assert out.startswith("quantrs {")


def test_bench_broken_suite_reported_not_fatal(tmp_path, capsys):
    (tmp_path / "bench_good.py").write_text(GOOD_BENCH)
    (tmp_path / "bench_nojson.py").write_text("print('hello')\n")
    (tmp_path / "bench_raises.py").write_text("raise RuntimeError('boom')\n")
    (tmp_path / "bench_badrow.py").write_text("print('[{\"x\": 1}]')\n")
    assert main(["bench", "--dir", str(tmp_path), "--quick"]) == 1
    out = capsys.readouterr().out
    assert "FAILED nojson: printed no JSON list" in out
    assert "FAILED raises: exit status 1: RuntimeError: boom" in out
    assert "FAILED badrow: row {'x': 1} has no 'bench' name" in out
    assert "op n=10" in out
    assert main(["bench", "--dir", str(tmp_path), "--only", "good"]) == 0
    assert main(["bench", "--dir", str(tmp_path), "--only", "zzz"]) == 1
    assert "no bench script" in capsys.readouterr().err


def test_bench_without_benches_dir(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("QUANTRS_BENCHES", raising=False)
    monkeypatch.setattr("quantrs.cli._bench.__file__", str(tmp_path / "a" / "b" / "c" / "d.py"))
    assert main(["bench"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no benches/ directory" in err
    assert main(["bench", "--dir", str(tmp_path / "nope")]) == 1
    assert "not a directory" in capsys.readouterr().err
