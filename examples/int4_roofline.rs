//! How close can an INT4 matvec come to this machine's read rate, and what
//! keeps ours from it?
//!
//!     cargo run --release --example int4_roofline [-- ROUNDS]
//!
//! `benches/bench_int4.py` holds the 4096x11008 group-32 matvec to 75% of a
//! 1 GiB multi-threaded read. This tool runs a ladder of passes over the same
//! bytes, from a bare read to the crate's kernel, interleaved round by round
//! (a drifting shared machine affects all alike), on every core, rotating
//! over >= 96 MiB of weight copies so that every call reads from DRAM:
//!
//! - `read`: a contiguous sum of one copy's bytes (nibbles + scales) in the
//!   kernel's 16 pieces: what any kernel could hope for;
//! - `dots`: the same read with the 8 `vpdpbusd` per 64 bytes of nibbles that
//!   a four-limb VNNI kernel must issue, and nothing else;
//! - `dots, kernel order`: `dots` in the kernel's order (per group, 64
//!   columns at a time down its 16 packed rows) with its prefetches;
//! - `kernel-shaped`: contiguous, four lines unpacked as the kernel does, then
//!   32 `vpdpbusd` into 16 accumulators, four stores per 1 KiB;
//! - `kernel replica`: `kernel-shaped` plus the kernel's other work (limbs
//!   broadcast from memory, nibble masks, the interleaved scale stream, the
//!   full per-group epilogue with its `y` read-modify-write);
//! - `kernel`: `QuantizedWeight::matvec`;
//! - `dots, hot`: `dots`' dot products over 512 KiB that stay in L2.
//!
//! It prints each pass's median time, GB/s of weight bytes and the median
//! per-round fraction of the probe. The README ("Why INT4 matvec still misses
//! its bar") gives the figures measured with it.

use std::hint::black_box;
use std::time::Instant;

use quantrs::par::for_each_block;
use quantrs::QuantizedWeight;

const IN_FEAT: usize = 4096;
const OUT_FEAT: usize = 11008;
const GROUP: usize = 32;
/// Enough copies that none is still in the (32 MiB) L3 when it comes round.
const ROTATE_BYTES: usize = 96 << 20;
const PROBE_BYTES: usize = 1 << 30;
/// Pieces each pass is cut into (the kernel's 8 row blocks x 2 column parts).
const PIECES: usize = 16;
const CALLS_PER_ROUND: usize = 20;

#[derive(Clone, Copy, PartialEq)]
enum Pass {
    Read,
    Dots,
    DotsKernelOrder,
    KernelShaped,
    KernelReplica,
    Kernel,
    DotsHot,
}

const PASSES: [(Pass, &str); 7] = [
    (Pass::Read, "read"),
    (Pass::Dots, "dots"),
    (Pass::DotsKernelOrder, "dots, kernel order"),
    (Pass::KernelShaped, "kernel-shaped"),
    (Pass::KernelReplica, "kernel replica"),
    (Pass::Kernel, "kernel"),
    (Pass::DotsHot, "dots, hot"),
];

fn main() {
    let rounds: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(20)
        .max(1);
    let vnni = dots::available();
    if !vnni {
        println!("no AVX-512 VNNI on this CPU: only read and kernel are measured");
    }
    // Deterministic weights in [-1, 1] and an `x` whose groups all take the
    // VNNI kernel's integer form.
    let w: Vec<f32> = (0..IN_FEAT * OUT_FEAT)
        .map(|i| (((i as u64).wrapping_mul(2_654_435_761) >> 7) % 2001) as f32 / 1000.0 - 1.0)
        .collect();
    let qw = QuantizedWeight::quantize_grouped(&w, IN_FEAT, OUT_FEAT, GROUP).expect("quantize");
    drop(w);
    let copies: Vec<QuantizedWeight> = (0..ROTATE_BYTES.div_ceil(qw.nbytes()))
        .map(|_| qw.clone())
        .collect();
    let x: Vec<f32> = (0..IN_FEAT)
        .map(|i| ((i % 17) as f32 - 8.0) / 8.0)
        .collect();
    let mut y = vec![0.0f32; OUT_FEAT];
    let probe_buf = vec![1u64; PROBE_BYTES / 8];
    let hot = vec![0x5Au8; 1 << 19];
    let nbytes = qw.nbytes() as f64;

    let mut secs: Vec<Vec<f64>> = vec![Vec::new(); PASSES.len()];
    let mut fracs: Vec<Vec<f64>> = vec![Vec::new(); PASSES.len()];
    let mut probes = Vec::new();
    for _ in 0..rounds {
        let t = median_secs(3, || {
            black_box(sum_all(&probe_buf));
        });
        let probe = PROBE_BYTES as f64 / t / 1e9;
        probes.push(probe);
        for (v, &(pass, _)) in PASSES.iter().enumerate() {
            if !vnni && !matches!(pass, Pass::Read | Pass::Kernel) {
                continue;
            }
            let mut next = 0;
            let mut call = || {
                let c = &copies[next % copies.len()];
                next += 1;
                match pass {
                    Pass::Read => stream(c, Work::Read),
                    Pass::Dots => stream(c, Work::Dots),
                    Pass::DotsKernelOrder => kernel_order(c),
                    Pass::KernelShaped => stream(c, Work::KernelShaped),
                    Pass::KernelReplica => stream(c, Work::KernelReplica),
                    Pass::Kernel => c.matvec(&x, &mut y).expect("matvec"),
                    Pass::DotsHot => hot_dots(&hot, qw.data.len()),
                }
            };
            call();
            let t = median_secs(CALLS_PER_ROUND, &mut call);
            secs[v].push(t);
            fracs[v].push(nbytes / t / 1e9 / probe);
        }
    }
    // Rounds whose probe read faster than the run's median, and the rest:
    // the machine's memory speed drifts, and the bar is hardest to meet when
    // the probe is fast.
    let probe_median = median(&probes);
    let fast: Vec<bool> = probes.iter().map(|&p| p > probe_median).collect();
    println!(
        "{IN_FEAT}x{OUT_FEAT} g{GROUP}: {:.1} MB a call, {} copies, {rounds} rounds, {} threads",
        nbytes / 1e6,
        copies.len(),
        rayon::current_num_threads()
    );
    let fast_probe: Vec<f64> = probes
        .iter()
        .copied()
        .filter(|&p| p > probe_median)
        .collect();
    println!(
        "probe (1 GiB, all cores): median {:.1} GB/s (fast half {:.1}), range {:.1}-{:.1}",
        probe_median,
        if fast_probe.is_empty() {
            f64::NAN
        } else {
            median(&fast_probe)
        },
        probes.iter().cloned().fold(f64::INFINITY, f64::min),
        probes.iter().cloned().fold(0.0, f64::max)
    );
    println!(
        "{:<18} | {:>6} | {:>5} | {:>8} | {:>9} | {:>9} | p10-p90",
        "pass", "ms", "GB/s", "of probe", "slow half", "fast half"
    );
    for (v, &(_, name)) in PASSES.iter().enumerate() {
        if secs[v].is_empty() {
            continue;
        }
        let t = median(&secs[v]);
        let half = |want: bool| {
            let f: Vec<f64> = fracs[v]
                .iter()
                .zip(&fast)
                .filter(|(_, &is_fast)| is_fast == want)
                .map(|(&f, _)| f)
                .collect();
            if f.is_empty() {
                f64::NAN
            } else {
                median(&f)
            }
        };
        let mut f = fracs[v].clone();
        f.sort_by(f64::total_cmp);
        let at = |q: f64| f[((f.len() - 1) as f64 * q).round() as usize];
        println!(
            "{name:<18} | {:>6.3} | {:>5.1} | {:>8.3} | {:>9.3} | {:>9.3} | {:.2}-{:.2}",
            t * 1e3,
            nbytes / t / 1e9,
            median(&f),
            half(false),
            half(true),
            at(0.1),
            at(0.9)
        );
    }
}

/// The bench's probe: a sum on every core, 64 KiB pieces.
fn sum_all(buf: &[u64]) -> u64 {
    use rayon::prelude::*;
    buf.par_chunks(1 << 13)
        .map(|c| c.iter().fold(0u64, |a, &v| a.wrapping_add(v)))
        .reduce(|| 0, u64::wrapping_add)
}

/// One copy's nibbles (with `work`) and scales in `PIECES` contiguous pieces
/// on every core.
fn stream(qw: &QuantizedWeight, work: Work) {
    let data = &qw.data;
    let scales = bytes_of(&qw.scales);
    let piece = data.len().div_ceil(PIECES).next_multiple_of(256);
    let spiece = scales.len().div_ceil(PIECES).next_multiple_of(256);
    for_each_block(PIECES, |p| {
        let d = &data[(p * piece).min(data.len())..((p + 1) * piece).min(data.len())];
        let s = &scales[(p * spiece).min(scales.len())..((p + 1) * spiece).min(scales.len())];
        black_box(dots::run(d, s, work));
    });
}

/// `dots` in the kernel's order: per piece (8 blocks of 16 groups x 2 column
/// halves), group by group, 64 columns at a time down the group's 16 packed
/// rows, prefetching 512 bytes ahead along each row and the scales 2 KiB
/// ahead, as the kernel does.
fn kernel_order(qw: &QuantizedWeight) {
    let n = qw.out_feat;
    let rows_per_group = GROUP / 2;
    let groups_per_block = qw.num_groups.div_ceil(8);
    let width = n.div_ceil(2).next_multiple_of(64);
    for_each_block(PIECES, |p| {
        let (b, c0) = (p / 2, (p % 2) * width);
        let cols = c0..(c0 + width).min(n);
        let mut acc = 0;
        for g in b * groups_per_block..((b + 1) * groups_per_block).min(qw.num_groups) {
            let rows = &qw.data[g * rows_per_group * n..(g + 1) * rows_per_group * n];
            let srow = bytes_of(&qw.scales[g * n..(g + 1) * n]);
            acc ^= dots::run_kernel_order(rows, srow, n, cols.clone());
        }
        black_box(acc);
    });
}

/// `dots`' dot products for `nbytes` of nibbles over a buffer that stays in
/// L2: their compute alone.
fn hot_dots(hot: &[u8], nbytes: usize) {
    let per_piece = nbytes.div_ceil(PIECES);
    for_each_block(PIECES, |_| {
        let mut left = per_piece;
        let mut acc = 0;
        while left > 0 {
            let n = left.min(hot.len());
            acc ^= dots::run(&hot[..n - n % 256], &[], Work::Dots);
            left -= n;
        }
        black_box(acc);
    });
}

fn bytes_of(v: &[f32]) -> &[u8] {
    // SAFETY: any f32 is 4 valid bytes; same allocation, same length in bytes.
    unsafe { std::slice::from_raw_parts(v.as_ptr() as *const u8, std::mem::size_of_val(v)) }
}

fn median_secs(n: usize, mut f: impl FnMut()) -> f64 {
    let mut t: Vec<f64> = (0..n)
        .map(|_| {
            let t0 = Instant::now();
            f();
            t0.elapsed().as_secs_f64()
        })
        .collect();
    t.sort_by(f64::total_cmp);
    t[n / 2]
}

fn median(v: &[f64]) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// What a contiguous pass does with the nibbles it reads (see the module docs).
#[derive(Clone, Copy, PartialEq)]
enum Work {
    Read,
    Dots,
    KernelShaped,
    KernelReplica,
}

#[cfg(target_arch = "x86_64")]
mod dots {
    use std::arch::x86_64::*;

    use super::Work;

    pub fn available() -> bool {
        quantrs::simd::has_avx512_vnni()
    }

    /// Stream `data` (a multiple of 256 bytes long) with `work`, and `scales`
    /// (for the replica interleaved, else after); a checksum comes back so
    /// that nothing is optimized away.
    pub fn run(data: &[u8], scales: &[u8], work: Work) -> u32 {
        if !available() {
            let sum = |b: &[u8]| b.iter().fold(0u32, |a, &v| a.wrapping_add(v as u32));
            return sum(data) ^ sum(scales);
        }
        assert!(data.len().is_multiple_of(256) && scales.len().is_multiple_of(64));
        let limbs: Vec<[i32; 8]> = (0..512).map(|i| [i; 8]).collect();
        // SAFETY: AVX-512 F/BW/VL/VNNI were detected at run time (FMA comes
        // with them on every such CPU).
        unsafe {
            match work {
                Work::Read => read_lines::<false>(data) ^ read_lines::<false>(scales),
                Work::Dots => read_lines::<true>(data) ^ read_lines::<false>(scales),
                Work::KernelShaped => {
                    kernel_like::<false>(data, scales, &limbs) ^ read_lines::<false>(scales)
                }
                Work::KernelReplica => kernel_like::<true>(data, scales, &limbs),
            }
        }
    }

    /// 64 bytes a step, prefetching 1 KiB ahead into L2; with DOTS, eight
    /// `vpdpbusd` per step into eight independent accumulators.
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
    unsafe fn read_lines<const DOTS: bool>(bytes: &[u8]) -> u32 {
        let limb = _mm512_set1_epi32(0x0103_0507);
        let mut acc = [_mm512_setzero_si512(); 8];
        let mut or = _mm512_setzero_si512();
        for line in bytes.chunks_exact(64) {
            // SAFETY: `line` is 64 readable bytes; a prefetch never faults.
            let v = unsafe {
                _mm_prefetch::<_MM_HINT_T1>(line.as_ptr().wrapping_add(1024) as *const i8);
                _mm512_loadu_si512(line.as_ptr() as *const _)
            };
            if DOTS {
                for a in acc.iter_mut() {
                    *a = _mm512_dpbusd_epi32(*a, v, limb);
                }
            } else {
                or = _mm512_or_si512(or, v);
            }
        }
        for a in acc {
            or = _mm512_xor_si512(or, a);
        }
        _mm512_reduce_or_epi32(or) as u32
    }

    /// The kernel's inner loop over contiguous bytes: four lines, the
    /// byte/word unpacks, 32 `vpdpbusd` into 16 accumulators; every 1 KiB
    /// (a group-32 strip) four vectors stored. With FULL, also the limbs
    /// broadcast from memory (8 a quad), the nibble masks, the scale stream
    /// read and prefetched alongside, and the kernel's whole epilogue (limb
    /// combine, conversion, 4x4 block transpose, `y` += part * scale).
    /// The decode and epilogue mirror `strip_vnni` in `src/int4/vnni.rs` on
    /// purpose (the same instructions over contiguous bytes): keep them in
    /// step when the kernel changes.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,fma")]
    unsafe fn kernel_like<const FULL: bool>(data: &[u8], scales: &[u8], limbs: &[[i32; 8]]) -> u32 {
        let fixed = _mm512_set1_epi32(0x0103_0507);
        let low = _mm512_set1_epi8(0x0F);
        let eight = _mm512_set1_epi8(8);
        let mut y = [0.0f32; 64];
        let mut acc = [[_mm512_setzero_si512(); 4]; 4];
        for (i, quad) in data.chunks_exact(256).enumerate() {
            // SAFETY: 256 readable bytes; prefetches never fault.
            let p = unsafe {
                let b = quad.as_ptr();
                for k in 0..4 {
                    _mm_prefetch::<_MM_HINT_T1>(b.wrapping_add(512 + 64 * k) as *const i8);
                }
                [0, 1, 2, 3].map(|k| _mm512_loadu_si512(b.add(64 * k) as *const _))
            };
            let a_lo = _mm512_unpacklo_epi8(p[0], p[1]);
            let a_hi = _mm512_unpackhi_epi8(p[0], p[1]);
            let b_lo = _mm512_unpacklo_epi8(p[2], p[3]);
            let b_hi = _mm512_unpackhi_epi8(p[2], p[3]);
            let z = [
                _mm512_unpacklo_epi16(a_lo, b_lo),
                _mm512_unpackhi_epi16(a_lo, b_lo),
                _mm512_unpacklo_epi16(a_hi, b_hi),
                _mm512_unpackhi_epi16(a_hi, b_hi),
            ];
            let q = &limbs[i % limbs.len()];
            for (m, zm) in z.into_iter().enumerate() {
                let (lo, hi) = if FULL {
                    (
                        _mm512_ternarylogic_epi32::<0x6A>(zm, low, eight),
                        _mm512_ternarylogic_epi32::<0x6A>(_mm512_srli_epi16::<4>(zm), low, eight),
                    )
                } else {
                    (zm, _mm512_srli_epi16::<4>(zm))
                };
                for l in 0..4 {
                    let (e, o) = if FULL {
                        (_mm512_set1_epi32(q[2 * l]), _mm512_set1_epi32(q[2 * l + 1]))
                    } else {
                        (fixed, fixed)
                    };
                    acc[m][l] = _mm512_dpbusd_epi32(acc[m][l], lo, e);
                    acc[m][l] = _mm512_dpbusd_epi32(acc[m][l], hi, o);
                }
            }
            if i % 4 != 3 {
                continue;
            }
            if !FULL {
                for (m, a) in acc.iter().enumerate() {
                    let v = _mm512_add_epi32(
                        _mm512_add_epi32(a[0], a[1]),
                        _mm512_add_epi32(a[2], a[3]),
                    );
                    // SAFETY: 16 floats at 16 m inside `y`.
                    unsafe { _mm512_storeu_si512(y.as_mut_ptr().add(16 * m) as *mut _, v) };
                }
                continue;
            }
            let at = (256 * (i / 4)) % scales.len().max(256);
            let s = if at + 256 <= scales.len() {
                // SAFETY: inside `scales`; prefetches never fault.
                unsafe {
                    let b = scales.as_ptr().add(at);
                    for k in 0..4 {
                        _mm_prefetch::<_MM_HINT_T0>(b.wrapping_add(2048 + 64 * k) as *const i8);
                    }
                    [0, 1, 2, 3].map(|k| _mm512_loadu_ps(b.add(64 * k) as *const f32))
                }
            } else {
                [_mm512_set1_ps(1.0); 4]
            };
            let mut part = [_mm512_setzero_ps(); 4];
            for (pm, a) in part.iter_mut().zip(&acc) {
                let h = _mm512_add_epi32(_mm512_slli_epi32::<8>(a[3]), a[2]);
                let l = _mm512_add_epi32(_mm512_slli_epi32::<8>(a[1]), a[0]);
                let sum = _mm512_fmadd_ps(
                    _mm512_cvtepi32_ps(h),
                    _mm512_set1_ps(65536.0),
                    _mm512_cvtepi32_ps(l),
                );
                *pm = _mm512_mul_ps(sum, _mm512_set1_ps(1e-9));
            }
            let a01 = _mm512_shuffle_f32x4::<0b01_00_01_00>(part[0], part[1]);
            let b01 = _mm512_shuffle_f32x4::<0b11_10_11_10>(part[0], part[1]);
            let a23 = _mm512_shuffle_f32x4::<0b01_00_01_00>(part[2], part[3]);
            let b23 = _mm512_shuffle_f32x4::<0b11_10_11_10>(part[2], part[3]);
            let natural = [
                _mm512_shuffle_f32x4::<0b10_00_10_00>(a01, a23),
                _mm512_shuffle_f32x4::<0b11_01_11_01>(a01, a23),
                _mm512_shuffle_f32x4::<0b10_00_10_00>(b01, b23),
                _mm512_shuffle_f32x4::<0b11_01_11_01>(b01, b23),
            ];
            for (v, nat) in natural.into_iter().enumerate() {
                // SAFETY: 16 floats at 16 v inside `y`.
                unsafe {
                    let yp = y.as_mut_ptr().add(16 * v);
                    _mm512_storeu_ps(yp, _mm512_fmadd_ps(nat, s[v], _mm512_loadu_ps(yp)));
                }
            }
            // The next strip starts from the group's initial sums.
            acc = [[_mm512_set1_epi32(i as i32); 4]; 4];
        }
        let mut or = _mm512_castps_si512(_mm512_loadu_ps(y.as_ptr()));
        for a in acc.iter().flatten() {
            or = _mm512_xor_si512(or, *a);
        }
        _mm512_reduce_or_epi32(or) as u32
    }

    /// One group's packed rows (`rows.len() / n` of `n` bytes) over the
    /// columns `cols` (a multiple of 64 wide), 64 columns at a time down the
    /// rows, eight `vpdpbusd` per line.
    pub fn run_kernel_order(
        rows: &[u8],
        scales: &[u8],
        n: usize,
        cols: std::ops::Range<usize>,
    ) -> u32 {
        assert!(available() && rows.len().is_multiple_of(n) && scales.len() == 4 * n);
        assert!(cols.end <= n && cols.len().is_multiple_of(64));
        // SAFETY: AVX-512 F/BW/VNNI were detected at run time; the bounds
        // were checked above.
        unsafe { kernel_order(rows, scales, n, cols) }
    }

    #[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
    unsafe fn kernel_order(
        rows: &[u8],
        scales: &[u8],
        n: usize,
        cols: std::ops::Range<usize>,
    ) -> u32 {
        let limb = _mm512_set1_epi32(0x0103_0507);
        let mut acc = [_mm512_setzero_si512(); 8];
        let mut or = _mm512_setzero_si512();
        for c in cols.step_by(64) {
            // SAFETY: c + 64 <= n and 4 (c + 64) <= 4 n (checked by the
            // caller), so every load is inside `rows` / `scales`; prefetches
            // never fault.
            unsafe {
                _mm_prefetch::<_MM_HINT_T0>(scales.as_ptr().wrapping_add(4 * c + 2048) as *const i8);
                for r in 0..rows.len() / n {
                    let at = rows.as_ptr().add(r * n + c);
                    _mm_prefetch::<_MM_HINT_T1>(at.wrapping_add(512) as *const i8);
                    let v = _mm512_loadu_si512(at as *const _);
                    for j in 0..8 {
                        let a = (8 * (r % 2) + j) % 8;
                        acc[a] = _mm512_dpbusd_epi32(acc[a], v, limb);
                    }
                }
                for k in 0..4 {
                    let s = _mm512_loadu_si512(scales.as_ptr().add(4 * c + 64 * k) as *const _);
                    or = _mm512_or_si512(or, s);
                }
            }
        }
        for a in acc {
            or = _mm512_xor_si512(or, a);
        }
        _mm512_reduce_or_epi32(or) as u32
    }
}

#[cfg(not(target_arch = "x86_64"))]
mod dots {
    use super::Work;

    pub fn available() -> bool {
        false
    }

    pub fn run(data: &[u8], scales: &[u8], _work: Work) -> u32 {
        let sum = |b: &[u8]| b.iter().fold(0u32, |a, &v| a.wrapping_add(v as u32));
        sum(data) ^ sum(scales)
    }

    pub fn run_kernel_order(_: &[u8], _: &[u8], _: usize, _: std::ops::Range<usize>) -> u32 {
        unreachable!("only measured with AVX-512 VNNI")
    }
}
