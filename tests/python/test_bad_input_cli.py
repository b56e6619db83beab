"""The CLI's side of docs/security.md: one-line errors for hostile headers, and the atomic
writes of the Python writers (the Rust writer of src/atomic.rs, seen from Python)."""

from __future__ import annotations

import os
import stat
import struct
import subprocess
import sys

import numpy as np
import pytest
from safetensors.numpy import save_file

import quantrs
from quantrs._core import _atomic_write, _AtomicFile
from quantrs.cli import main


def hostile(path, header: bytes) -> None:
    path.write_bytes(struct.pack("<Q", len(header)) + header)


@pytest.mark.parametrize("cmd", ["inspect", "quantize"])
def test_deeply_nested_header_is_one_line(tmp_path, capsys, cmd):
    src = tmp_path / "deep.safetensors"
    hostile(src, b"[" * 100_000 + b"]" * 100_000)
    argv = [cmd, str(src)] + (
        [str(tmp_path / "out.st"), "--no-progress", "--format", "int4"] if cmd == "quantize" else []
    )
    assert main(argv) == 1
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "nested too deeply" in err and "Traceback" not in err
    assert not (tmp_path / "out.st").exists()


def test_deeply_nested_quantrs_metadata_is_ignored(tmp_path, capsys):
    src = tmp_path / "m.safetensors"
    deep = "[" * 100_000 + "]" * 100_000
    save_file({"w": np.ones((2, 2), np.float32)}, str(src), metadata={"quantrs": deep})
    assert main(["inspect", str(src)]) == 0


def temps(d):
    return sorted(p for p in os.listdir(d) if "quantrs-tmp" in p)


def write(path, data: bytes) -> None:
    _atomic_write(path, data)


def test_cli_writer_removes_stale_temporaries_of_dead_writers(tmp_path):
    path = tmp_path / "o.st"
    code = (
        "import os, sys\n"
        "sys.path[:0] = " + repr(sys.path) + "\n"
        "import numpy as np\n"
        "from quantrs._core import _AtomicFile\n"
        f"f = _AtomicFile({str(path)!r})\n"
        "f.write(np.zeros(1000, np.uint8))\n"
        "os._exit(0)\n"  # dies before commit, as after kill -9
    )
    for _ in range(3):
        subprocess.run([sys.executable, "-c", code], check=True)
    assert len(temps(tmp_path)) == 3
    other = tmp_path / ".p.st.quantrs-tmp.4194305.0"  # another path's temporary
    other.write_bytes(b"x")
    write(path, b"new")
    assert path.read_bytes() == b"new"
    assert temps(tmp_path) == [other.name]


def test_cli_writer_unique_per_call(tmp_path):
    a, b = _AtomicFile(tmp_path / "x"), _AtomicFile(tmp_path / "x")
    assert a.tmp != b.tmp
    a.abort()
    b.abort()
    assert temps(tmp_path) == []


def test_cli_writer_streams_and_commits_once(tmp_path):
    path = tmp_path / "x"
    path.write_bytes(b"old")
    f = _AtomicFile(path)
    f.write(np.frombuffer(b"ab", np.uint8))
    f.write(np.frombuffer(b"cd", np.uint8))
    assert path.read_bytes() == b"old"
    f.commit()
    assert path.read_bytes() == b"abcd" and temps(tmp_path) == []
    with pytest.raises(quantrs.InvalidState, match="already committed"):
        f.write(np.zeros(1, np.uint8))
    g = _AtomicFile(path)
    g.write(np.zeros(3, np.uint8))
    del g  # an uncommitted writer that goes away deletes its temporary
    assert path.read_bytes() == b"abcd" and temps(tmp_path) == []


def test_cli_writer_modes_links_and_special_files(tmp_path):
    real = tmp_path / "real"
    real.write_bytes(b"old")
    os.chmod(real, 0o600)
    link = tmp_path / "link"
    link.symlink_to("real")
    write(link, b"new")
    assert link.is_symlink() and real.read_bytes() == b"new"
    assert stat.S_IMODE(os.stat(real).st_mode) == 0o600
    old = os.umask(0o022)
    try:
        write(tmp_path / "fresh", b"x")
    finally:
        os.umask(old)
    assert stat.S_IMODE(os.stat(tmp_path / "fresh").st_mode) == 0o644
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(OSError, match="not a regular file"):
        _AtomicFile(fifo)
    with pytest.raises(OSError, match="not a regular file"):
        _AtomicFile(tmp_path)


def test_demo_plot_is_written_atomically(tmp_path, monkeypatch):
    """write_plot renders into memory and writes through the atomic writer (a stand-in
    matplotlib, so this runs without it; test_cli.py renders a real PNG where installed)."""
    import types
    from unittest import mock

    from quantrs.cli._demo import Row
    from quantrs.cli._report import write_plot

    fig, ax = mock.MagicMock(), mock.MagicMock()
    fig.savefig.side_effect = lambda f, format: f.write(b"\x89PNG-" + format.encode())
    pyplot = types.ModuleType("matplotlib.pyplot")
    pyplot.subplots = lambda **kw: (fig, ax)
    pyplot.close = mock.MagicMock()
    mpl = types.ModuleType("matplotlib")
    mpl.use = lambda backend: None
    mpl.pyplot = pyplot
    monkeypatch.setitem(sys.modules, "matplotlib", mpl)
    monkeypatch.setitem(sys.modules, "matplotlib.pyplot", pyplot)
    path = tmp_path / "loss.png"
    path.write_bytes(b"old")
    write_plot([Row("float32", curve=[1.0, 0.5])], str(path))
    assert path.read_bytes() == b"\x89PNG-png" and temps(tmp_path) == []
    pyplot.close.assert_called_once_with(fig)
