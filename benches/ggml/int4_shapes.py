"""quantrs INT4 g32 (float32 and int8 activations) and NumPy float32 on the
shapes of ggml_mm.cpp (same arguments: IN OUT BATCH COPIES), the same rotation
of weight copies, the median of the same number of calls. Each entry gives the
median wall-clock ms and the process CPU ms per call: on a loaded machine run
both programs on one thread (``RAYON_NUM_THREADS=1`` here, ``GGML_MM_THREADS=1``
for ggml_mm) and compare CPU times."""

import sys
import time

import numpy as np

import quantrs


def median_ms(fn, copies: int, reps: int) -> tuple[float, float]:
    """(median wall ms, mean process CPU ms) per call."""
    for i in range(3 * copies):
        fn(i)
    times = []
    c0 = time.process_time()
    for i in range(reps):
        t0 = time.perf_counter()
        fn(i)
        times.append(time.perf_counter() - t0)
    cpu = (time.process_time() - c0) / reps
    return float(np.median(times)) * 1e3, cpu * 1e3


def main() -> None:
    inp, out, batch, copies = map(int, sys.argv[1:5])
    rng = np.random.default_rng(0)
    w = rng.standard_normal((inp, out), dtype=np.float32)  # QuantizedWeight's [in, out]
    qs = [quantrs.QuantizedWeight.quantize(w, group_size=32) for _ in range(copies)]
    wts = [np.ascontiguousarray(w.T) for _ in range(min(copies, 2))]
    x = rng.standard_normal((batch, inp), dtype=np.float32)
    reps = 10 if batch >= 64 else 60

    def ours(act):
        if batch == 1:
            return lambda i: qs[i % copies].matvec(x[0], activations=act)
        return lambda i: qs[i % copies].matmul(x, activations=act)

    if batch == 1:
        numpy_fn = lambda i: wts[i % len(wts)] @ x[0]  # noqa: E731
    else:
        numpy_fn = lambda i: x @ wts[i % len(wts)].T  # noqa: E731
    rows = {"numpy": median_ms(numpy_fn, len(wts), reps)}
    time.sleep(0.3)  # OpenBLAS's idle threads stop spinning
    rows["int4 g32"] = median_ms(ours("float32"), copies, reps)
    rows["int4 g32 a8"] = median_ms(ours("int8"), copies, reps)
    cells = " ".join(f"{k} {v:.3f} ms (cpu {c:.3f})" for k, (v, c) in rows.items())
    print(f"in={inp} out={out} b={batch} copies={copies} {cells}")


if __name__ == "__main__":
    main()
