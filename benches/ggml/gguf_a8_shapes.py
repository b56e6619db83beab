"""quantrs ``GgufWeight.matmul(x, activations="int8")`` on the shapes of ggml_mm.cpp
(same arguments: IN OUT BATCH TYPE [COPIES]), the same rotation of weight copies and the
same number of calls: the quantrs side of docs/benchmarks.md, "Against llama.cpp
(ggml)", GGUF rows. The weight bytes are random codes with small finite scales (the
kernels' time does not depend on the values). Prints the median and fastest wall-clock
ms and the process CPU ms per call: on a loaded machine compare one thread
(``RAYON_NUM_THREADS=1`` here, ``GGML_MM_THREADS=1`` for ggml_mm) by CPU time, and two
threads by the fastest calls."""

import sys
import time

import numpy as np

import quantrs

# type -> (weights per block, bytes per block, byte offsets of the half scales)
TYPES = {
    "q4_0": (32, 18, [0]),
    "q4_1": (32, 20, [0, 2]),
    "q5_0": (32, 22, [0]),
    "q5_1": (32, 24, [0, 2]),
    "q8_0": (32, 34, [0]),
    "q4_k": (256, 144, [0, 2]),
    "q5_k": (256, 176, [0, 2]),
    "q6_k": (256, 210, [208]),
}


def weight(name: str, out: int, inp: int, rng) -> object:
    elems, size, halves = TYPES[name]
    b = rng.integers(0, 256, (out, inp // elems, size), dtype=np.uint8)
    for o in halves:  # 2**-7: small finite scales
        b[..., o : o + 2] = np.full(b.shape[:2], 0x2000, "<u2")[..., None].view(np.uint8)
    return quantrs.GgufWeight.from_bytes(name, (out, inp), b.reshape(out, -1))


def main() -> None:
    inp, out, batch = map(int, sys.argv[1:4])
    name = sys.argv[4].lower() if len(sys.argv) > 4 else "q4_0"
    copies = int(sys.argv[5]) if len(sys.argv) > 5 else 1
    rng = np.random.default_rng(0)
    ws = [weight(name, out, inp, rng) for _ in range(copies)]
    x = rng.standard_normal((batch, inp), dtype=np.float32)
    reps = 10 if batch >= 64 else 60
    for i in range(3 * copies):
        ws[i % copies].matmul(x, activations="int8")
    times = []
    c0 = time.process_time()
    for i in range(reps):
        t0 = time.perf_counter()
        ws[i % copies].matmul(x, activations="int8")
        times.append(time.perf_counter() - t0)
    cpu = (time.process_time() - c0) / reps * 1e3
    times.sort()
    print(
        f"quantrs a8 {name} in={inp} out={out} b={batch} copies={copies} "
        f"median {times[len(times) // 2] * 1e3:.3f} ms min {times[0] * 1e3:.3f} ms "
        f"cpu {cpu:.3f} ms/call"
    )


if __name__ == "__main__":
    main()
