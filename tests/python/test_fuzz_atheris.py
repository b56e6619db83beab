"""The atheris targets of tests/fuzz/atheris_targets.py, each run in a
subprocess under a memory cap (RLIMIT_AS = the process's size after imports
plus 256 MiB, set by the target itself through QUANTRS_FUZZ_CAP_MB), for
QUANTRS_FUZZ_SECONDS each (default 8: about 40 s in all)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

atheris = pytest.importorskip("atheris")

SCRIPT = Path(__file__).resolve().parents[1] / "fuzz" / "atheris_targets.py"
TARGETS = [
    "int4_from_bytes",
    "layer_deserialize",
    "optimizer_setstate",
    "qat_from_bytes",
    "cli_inspect",
    "gguf_load",
]
SECONDS = int(os.environ.get("QUANTRS_FUZZ_SECONDS", "8"))
CAP = 256 << 20

# Run inside the child: cap the address space at its current size plus CAP,
# then hand over to the target script.
LAUNCH = """
import resource, runpy, sys
import quantrs, numpy, atheris  # loaded before the cap is measured
import quantrs.cli, quantrs.formats.gguf
def vm_size():
    for line in open('/proc/self/status'):
        if line.startswith('VmSize:'):
            return int(line.split()[1]) * 1024
cap = vm_size() + {cap}
resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name='__main__')
"""


@pytest.mark.slow
@pytest.mark.parametrize("target", TARGETS)
def test_atheris_target(target, tmp_path):
    corpus = tmp_path / "corpus"
    subprocess.run([sys.executable, str(SCRIPT), target, "--seeds", str(corpus)], check=True)
    env = dict(os.environ, RAYON_NUM_THREADS="1")
    r = subprocess.run(
        [
            sys.executable,
            "-c",
            LAUNCH.format(cap=CAP),
            str(SCRIPT),
            target,
            f"-max_total_time={SECONDS}",
            "-rss_limit_mb=0",
            "-malloc_limit_mb=0",
            str(corpus),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=SECONDS * 4 + 60,
    )
    tail = (r.stdout + r.stderr)[-3000:]
    assert r.returncode == 0, tail
    done = [line for line in tail.splitlines() if "Done" in line and "runs" in line]
    assert done, tail
    print(target, done[-1])
