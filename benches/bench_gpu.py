"""GPU benchmarks (docs/gpu.md), every ratio measured in the same run:

    python benches/bench_gpu.py [--quick] [--json]

- copy: a device-to-device copy of 1 GiB (torch ``copy_``), GB/s counting the
  bytes read and written: the machine's reference bandwidth.
- INT4 matvec at batch 1 on 4096x11008 and 8192x28672 (in x out, group 32):
  GB/s over the bytes the kernel must move (packed weights, scales, x, y)
  and that as a fraction of the copy bandwidth.
- INT4 matmul and FP8 W8A8 forward on 4096 -> 11008 at batch 16..4096, in
  TFLOP/s (2 * batch * in * out per call), next to ``torch.matmul`` in bf16
  and ``torch._scaled_mm`` (E4M3 x E4M3, per-tensor scales, bf16 out) on the
  same shapes.
- the 4-bit AdamW step against torch.optim.AdamW (fused / foreach) on 2^24 and
  2^28 parameters and a GPT-2-small parameter list: benches/bench_gpu_optim.py.

quantrs kernels are timed with ``quantrs._core._cuda_bench`` (calls queued
back to back between two CUDA events: kernel time, launches pipelined);
torch is timed the same way with CUDA events around the same number of
calls. Each measurement is the median of 5 event-timed runs. A part that
fails prints its error in the table and the rest still runs.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import traceback

import bench_gpu_optim
import numpy as np


def _events_ms(torch, fn, iters: int, runs: int = 5) -> float:
    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(runs):
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(iters):
            fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / iters)
    return statistics.median(times)


def _ours_ms(core, obj, x, iters: int, runs: int = 5) -> float:
    return statistics.median(1e3 * core._cuda_bench(obj, x, iters) for _ in range(runs))


def copy_bandwidth(torch) -> float:
    n = 1 << 30
    src = torch.empty(n, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    ms = _events_ms(torch, lambda: dst.copy_(src), 10)
    return 2 * n / (ms * 1e-3) / 1e9


def int4_matvec_rows(torch, quantrs, copy_gbs: float, quick: bool) -> list[dict]:
    core = quantrs._core
    rows = []
    shapes = [(4096, 11008)] if quick else [(4096, 11008), (8192, 28672)]
    rng = np.random.default_rng(0)
    for k, n in shapes:
        try:
            w = rng.standard_normal((k, n), dtype=np.float32)
            q = quantrs.QuantizedWeight.quantize(w, group_size=32).to("cuda")
            del w
            x = torch.randn((1, k), device="cuda")
            ms = _ours_ms(core, q, x, 200)
            moved = q.nbytes + 4 * (k + n)
            gbs = moved / (ms * 1e-3) / 1e9
            rows.append(
                {
                    "bench": f"int4 matvec {k}x{n} b=1",
                    "ours_ms": ms,
                    "ours": f"{gbs:.0f} GB/s",
                    "baseline": f"copy {copy_gbs:.0f} GB/s",
                    "ratio": gbs / copy_gbs,
                }
            )
        except Exception as e:  # keep the table going
            rows.append({"bench": f"int4 matvec {k}x{n} b=1", "error": repr(e)})
            traceback.print_exc()
    return rows


def matmul_rows(torch, quantrs, quick: bool) -> list[dict]:
    core = quantrs._core
    k, n = 4096, 11008
    rows = []
    rng = np.random.default_rng(1)
    w = rng.standard_normal((n, k), dtype=np.float32) * 0.02  # [out, in]
    batches = [16, 256, 4096] if quick else [16, 64, 256, 1024, 2048, 4096]
    q4 = quantrs.QuantizedWeight.quantize(np.ascontiguousarray(w.T), group_size=32).to("cuda")
    fp8 = quantrs.PerTensorFP8Linear.from_float(w, activation_scale=0.05).to("cuda")
    w_bf16 = torch.from_numpy(w.T.copy()).to("cuda", torch.bfloat16)  # [in, out]
    w_e4m3 = torch.from_numpy(w).to("cuda").to(torch.float8_e4m3fn)  # [out, in]
    one = torch.ones((), device="cuda")
    for b in batches:
        flop = 2 * b * k * n
        iters = max(3, min(200, int(2e12 / flop)))
        x = torch.randn((b, k), device="cuda")
        xb = x.to(torch.bfloat16)
        xe = (x * 0.1).to(torch.float8_e4m3fn)

        def tf(ms, flop=flop):
            return flop / (ms * 1e-3) / 1e12

        row = {"bench": f"matmul {k}->{n} b={b}"}
        try:
            row["bf16_tflops"] = tf(_events_ms(torch, lambda xb=xb: xb @ w_bf16, iters))
        except Exception as e:
            row["bf16_tflops"] = repr(e)
        try:

            def scaled(xe=xe):
                return torch._scaled_mm(
                    xe, w_e4m3.t(), scale_a=one, scale_b=one, out_dtype=torch.bfloat16
                )

            row["scaled_mm_tflops"] = tf(_events_ms(torch, scaled, iters))
        except Exception as e:
            row["scaled_mm_tflops"] = repr(e)
        for name, obj in (("int4_tflops", q4), ("fp8_w8a8_tflops", fp8)):
            try:
                row[name] = tf(_ours_ms(core, obj, x, iters))
            except Exception as e:
                row[name] = repr(e)
                traceback.print_exc()
        rows.append(row)
    return rows


def _fmt(v) -> str:
    if isinstance(v, float):
        return f"{v:.3f}" if v < 10 else f"{v:.1f}"
    return str(v)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    import torch

    import quantrs
    import quantrs.cuda

    if not quantrs.cuda_available() or not torch.cuda.is_available():
        print("bench_gpu: no CUDA device:", quantrs.cuda.unavailable_reason())
        return 0

    info = quantrs.cuda.device_info(0)
    print(f"device: {info['name']} ({info['arch']}), NVRTC {info['nvrtc_version']}")
    copy = copy_bandwidth(torch)
    mv = int4_matvec_rows(torch, quantrs, copy, args.quick)
    try:
        mm = matmul_rows(torch, quantrs, args.quick)
    except Exception as e:
        mm = [{"bench": "matmul", "error": repr(e)}]
        traceback.print_exc()
    opt_rows = bench_gpu_optim.step_rows(torch, quantrs, copy, args.quick, _events_ms)
    qat_rows = bench_gpu_optim.qat_rows(torch, quantrs, args.quick, _events_ms)
    if args.json:
        out = {"copy_gbs": copy, "matvec": mv, "matmul": mm, "optim": opt_rows, "qat": qat_rows}
        print(json.dumps(out, indent=1))
    print(f"\ndevice-to-device copy: {copy:.0f} GB/s (read + write)")
    print(f"\n{'INT4 matvec':34} {'ms':>8} {'quantrs':>12} {'baseline':>16} {'of copy':>8}")
    for r in mv:
        if "error" in r:
            print(f"{r['bench']:34} ERROR {r['error']}")
        else:
            print(
                f"{r['bench']:34} {r['ours_ms']:8.4f} {r['ours']:>12} {r['baseline']:>16} "
                f"{r['ratio']:8.2f}"
            )
    cols = ["bf16_tflops", "int4_tflops", "scaled_mm_tflops", "fp8_w8a8_tflops"]
    print(
        f"\n{'matmul (TFLOP/s)':28} {'torch bf16':>11} {'quantrs int4':>13} "
        f"{'_scaled_mm':>11} {'quantrs fp8':>12} {'fp8/scaled':>11}"
    )
    for r in mm:
        if "error" in r:
            print(f"{r['bench']:28} ERROR {r['error']}")
            continue
        vals = [_fmt(r.get(c, "-")) for c in cols]
        a, s = r.get("fp8_w8a8_tflops"), r.get("scaled_mm_tflops")
        ratio = f"{a / s:.3f}" if isinstance(a, float) and isinstance(s, float) else "-"
        print(
            f"{r['bench']:28} {vals[0]:>11} {vals[1]:>13} {vals[2]:>11} {vals[3]:>12} {ratio:>11}"
        )
    print(f"\nquantrs FP8 W8A8 GEMM path: {quantrs.cuda.device_info(0)['fp8_gemm']}")
    bench_gpu_optim.print_rows(opt_rows)
    bench_gpu_optim.print_qat_rows(qat_rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
