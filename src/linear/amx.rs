//! The batched FP8 E4M3 forward on Intel AMX (Sapphire Rapids and later):
//! `y[b, r] = (x[b] . dec(W[r])) * scale(r) + bias[r]` with the products
//! summed by the AMX-BF16 tile dot `tdpbf16ps` (a 16 x 16 block of f32 sums,
//! 32 inputs deep, per instruction).
//!
//! Exactness. Every E4M3 value is exact in bfloat16 (at most 4 significant
//! bits, magnitudes 2^-9 .. 448, inside bf16's range), so the weights lose
//! nothing. Each `x` is split into bf16 parts with `x = x1 + x2 + x3`
//! exactly (`x1 = bf16(x)`, `x2 = bf16(x - x1)`, `x3 = x - x1 - x2`: the
//! residuals have at most 16, then 8 significant bits), and only as many
//! parts run as some element of the call needs: one for W8A8 (its
//! activations lie on the E4M3 grid), up to three for float32 activations.
//! A product of two bf16 values is exact in f32, so the result differs from
//! the float32 engine (`kernels.rs`) only in the order of the f32 additions,
//! and in that the tile unit reads bf16 subnormals (below 2^-126) as zero and
//! flushes subnormal sums (Intel SDM, TDPBF16PS): an absolute difference
//! below `k * 448 * 2^-126`.
//!
//! Layout: `C^T = W . X^T`. The A operand (16 weight rows by 32 inputs) is
//! read straight from the bf16 rows a task decodes; the B operand (16 input
//! pairs by 16 batch rows) from a panel of `x` built once per call,
//! `panel[block][part][pair][lane] = (x[b, 2p], x[b, 2p + 1])` as two bf16 in
//! a u32, `b = 16 * block + lane`; C is 16 weight rows by 16 batch rows. A task
//! owns 32 weight rows (two A tiles) and every batch row: per chunk of `KC`
//! inputs it decodes its rows to bf16, then runs each pair of 16-row batch
//! blocks through four C tiles kept in a per-task buffer between chunks.
//! Each output element is summed by one task in a fixed order, so results do
//! not depend on the thread count.

use std::arch::x86_64::*;

use rayon::prelude::*;

use super::common::{Epilogue, OutPtr};
use super::tiles::{self, tile_dot_bf16, tile_load, tile_store, tile_zero, TileConfig, T};
use crate::simd::{Amx, Avx512};

/// Batch rows from which the FP8 forward takes this path: below it the
/// fused per-row decode-and-dot reads the weight once per row faster than
/// this path decodes it (docs/benchmarks.md, "FP8 on AMX").
pub(crate) const AMX_MIN_ROWS: usize = 8;

/// Inputs (bf16) in a 64-byte A tile row: one k-step.
const KSTEP: usize = 32;
/// Inputs per decoded chunk: a task's weight buffer is 32 rows x 512 bf16
/// (32 KiB), its B tiles come from 16 KiB of the panel per batch block.
const KC: usize = 512;
/// Weight rows per task: two A tiles.
const ROWS: usize = 2 * T;
/// Largest number of bf16 parts of an f32.
const MAX_PARTS: usize = 3;

/// `bf16(v)` rounded to nearest even, as bits (meaningful for finite `v`
/// below 2^127; wrapping, so other inputs give garbage, never a panic).
fn bf16_rne(v: f32) -> u16 {
    let b = v.to_bits();
    (b.wrapping_add(0x7FFF + ((b >> 16) & 1)) >> 16) as u16
}

fn bf16_value(h: u16) -> f32 {
    f32::from_bits(u32::from(h) << 16)
}

/// `v = p[0] + p[1] + p[2]` exactly, each a bf16 (finite `v`).
fn split3(v: f32) -> [u16; MAX_PARTS] {
    let hi = bf16_rne(v);
    let r = v - bf16_value(hi);
    let mid = bf16_rne(r);
    let lo = r - bf16_value(mid);
    [hi, mid, (lo.to_bits() >> 16) as u16]
}

/// How many bf16 parts the elements of `x` need (1..=3), or `None` when one
/// is not finite (the float32 engine then gives IEEE's inf / NaN results).
fn parts_needed(tok: Avx512, x: &[f32]) -> Option<usize> {
    let flags = x.par_chunks(1 << 14).map(|c| scan(tok, c)).reduce(
        || [false; 3],
        |a, b| [a[0] | b[0], a[1] | b[1], a[2] | b[2]],
    );
    match flags {
        [true, _, _] => None,
        [_, _, true] => Some(3),
        [_, true, _] => Some(2),
        _ => Some(1),
    }
}

/// Over `c`: whether an element is not finite, needs a second part, needs a
/// third. Branch-free so that it vectorizes.
fn scan(tok: Avx512, c: &[f32]) -> [bool; 3] {
    // SAFETY: the token proves AVX-512 F/BW/VL.
    unsafe { scan_avx512(tok, c) }
}

/// # Safety
/// AVX-512 F/BW/VL must be available (the token).
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
unsafe fn scan_avx512(_: Avx512, c: &[f32]) -> [bool; 3] {
    let (mut bad, mut two, mut three) = (false, false, false);
    for &v in c {
        bad |= v.to_bits() & 0x7F80_0000 == 0x7F80_0000;
        let p = split3(v);
        two |= p[1] != 0;
        three |= p[2] != 0;
    }
    [bad, two, three]
}

/// `parts[p][i]` = part `p` of `row[i]` (finite values), zero past `row`.
fn split_row(tok: Avx512, row: &[f32], parts: &mut [Vec<u16>; MAX_PARTS]) {
    // SAFETY: the token proves AVX-512 F/BW/VL.
    unsafe { split_row_avx512(tok, row, parts) }
}

/// # Safety
/// AVX-512 F/BW/VL must be available (the token).
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
unsafe fn split_row_avx512(_: Avx512, row: &[f32], parts: &mut [Vec<u16>; MAX_PARTS]) {
    let [p0, p1, p2] = parts;
    let n = row.len();
    for (i, &v) in row.iter().enumerate() {
        let p = split3(v);
        (p0[i], p1[i], p2[i]) = (p[0], p[1], p[2]);
    }
    for p in [p0, p1, p2] {
        p[n..].fill(0);
    }
}

/// The B panel of `x` (`[m, k]`, finite): per 16-row batch block, per part,
/// `pairs` rows of 16 lanes; inputs past `k` and rows past `m` are zero.
fn build_panel(tok: Avx512, x: &[f32], m: usize, k: usize, pairs: usize, parts: usize) -> Vec<u32> {
    let block_len = parts * pairs * T;
    let mut panel = vec![0u32; m.div_ceil(T) * block_len];
    panel
        .par_chunks_mut(block_len)
        .enumerate()
        .for_each(|(blk, out)| {
            let mut split: [Vec<u16>; MAX_PARTS] = std::array::from_fn(|_| vec![0u16; 2 * pairs]);
            for lane in 0..T.min(m - blk * T) {
                let b = blk * T + lane;
                split_row(tok, &x[b * k..(b + 1) * k], &mut split);
                for (rows, part) in out.chunks_exact_mut(pairs * T).zip(&split) {
                    for (p, pair) in part.chunks_exact(2).enumerate() {
                        rows[p * T + lane] = u32::from(pair[0]) | u32::from(pair[1]) << 16;
                    }
                }
            }
        });
    panel
}

/// `y[b, r] = dot(x[b], dec(W[r])) * scale(r) + bias[r]` for E4M3 `codes`
/// `[n, k]` (no NaN codes), `x` `[m, k]`, `y` `[m, n]`. Returns `false`
/// (leaving `y` alone) when `x` holds a value that is not finite: the caller
/// then runs the float32 engine. Inputs must be in the engine's range
/// (`crate::range`), which `kernels::matmul_rows` sees to before calling.
#[allow(clippy::too_many_arguments)]
pub(crate) fn gemm_e4m3(
    tok: Amx,
    codes: &[u8],
    n: usize,
    k: usize,
    x: &[f32],
    m: usize,
    y: &mut [f32],
    epi: &Epilogue<'_>,
) -> bool {
    assert!(codes.len() == n * k && x.len() == m * k && y.len() == m * n);
    if m == 0 || n == 0 || k == 0 {
        return false;
    }
    let Some(parts) = parts_needed(tok.avx512(), x) else {
        return false;
    };
    let kpad = k.next_multiple_of(KSTEP);
    let pairs = kpad / 2;
    let nblk = m.div_ceil(T);
    let panel = build_panel(tok.avx512(), x, m, k, pairs, parts);
    let geom = Geometry { nblk, pairs, parts };
    let out = OutPtr(y.as_mut_ptr());
    let scratch = || (vec![0u16; ROWS * KC], vec![0f32; 2 * nblk * T * T]);
    (0..n.div_ceil(ROWS))
        .into_par_iter()
        .for_each_init(scratch, |(wbuf, acc), task| {
            let r0 = task * ROWS;
            let nr = ROWS.min(n - r0);
            let tiles = Tiles::configure(tok);
            for k0 in (0..kpad).step_by(KC) {
                let kc = KC.min(kpad - k0);
                for (j, dst) in wbuf.chunks_exact_mut(KC).enumerate() {
                    if j < nr {
                        let row = &codes[(r0 + j) * k..(r0 + j + 1) * k];
                        decode_bf16(tok, &row[k0..k.min(k0 + kc)], &mut dst[..kc]);
                    } else {
                        dst[..kc].fill(0);
                    }
                }
                for b0 in (0..nblk).step_by(2) {
                    tiles.block(&geom, acc, wbuf, &panel, b0, k0, kc);
                }
            }
            drop(tiles);
            for j in 0..nr {
                let r = r0 + j;
                let (s, bias) = ((epi.scale)(r), epi.bias.map_or(0.0, |b| b[r]));
                let tile_row = &acc[(j / T) * nblk * T * T + (j % T) * T..];
                for b in 0..m {
                    let v = tile_row[(b / T) * T * T + b % T];
                    let o = out;
                    // SAFETY: this task owns output rows r0 .. r0 + nr, and
                    // b * n + r < m * n = y.len().
                    unsafe { *o.0.add(b * n + r) = v * s + bias };
                }
            }
        });
    true
}

/// Sizes of one call's panel.
struct Geometry {
    /// 16-row batch blocks.
    nblk: usize,
    /// Input pairs per panel row block (`k` rounded up to 32, halved).
    pairs: usize,
    /// bf16 parts of `x` in the panel.
    parts: usize,
}

/// E4M3 `codes` as bf16 bits into `out[..codes.len()]`, zeros after.
fn decode_bf16(tok: Amx, codes: &[u8], out: &mut [u16]) {
    // SAFETY: the Amx token proves AVX-512 F/BW/VL and AVX512-BF16.
    unsafe { decode_bf16_avx512(tok, codes, out) }
}

/// # Safety
/// AVX-512 F/BW/VL and AVX512-BF16 must be available (an [`Amx`] token).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16")]
unsafe fn decode_bf16_avx512(_: Amx, codes: &[u8], out: &mut [u16]) {
    assert!(codes.len() <= out.len());
    // The E4M3 bits shifted into a float16 (`sign << 15 | magnitude << 7`)
    // are the value times 2^-8, subnormals included (src/linear/avx512.rs);
    // widening to f32, multiplying by 2^8 and rounding to bf16 is exact.
    let mask = _mm512_set1_epi16(0xBF80u16 as i16);
    let two8 = _mm512_set1_ps(256.0);
    let n = codes.len() / 32 * 32;
    let mut i = 0;
    while i < n {
        // SAFETY: i + 32 <= n <= codes.len() <= out.len().
        unsafe {
            let c = _mm512_cvtepi8_epi16(_mm256_loadu_si256(codes.as_ptr().add(i).cast()));
            let h = _mm512_and_si512(_mm512_slli_epi16::<7>(c), mask);
            let lo = _mm512_mul_ps(_mm512_cvtph_ps(_mm512_castsi512_si256(h)), two8);
            let hi = _mm512_mul_ps(_mm512_cvtph_ps(_mm512_extracti64x4_epi64::<1>(h)), two8);
            let b: __m512i = std::mem::transmute(_mm512_cvtne2ps_pbh(hi, lo));
            _mm512_storeu_si512(out.as_mut_ptr().add(i).cast(), b);
        }
        i += 32;
    }
    let table = crate::fp8::decode_table(crate::fp8::Fp8Format::E4M3);
    for (o, &c) in out[n..codes.len()].iter_mut().zip(&codes[n..]) {
        *o = (table[c as usize].to_bits() >> 16) as u16;
    }
    out[codes.len()..].fill(0);
}

/// The tile configuration loaded on this thread for the FP8 forward: eight
/// 16 x 64-byte tiles, 0-3 hold C, 4-5 A, 6-7 B.
struct Tiles {
    _loaded: tiles::Tiles,
}

impl Tiles {
    fn configure(tok: Amx) -> Self {
        Tiles {
            _loaded: tiles::Tiles::configure(tok, &TileConfig::sixteen_by_64()),
        }
    }

    /// Add the products of inputs `k0 .. k0 + kc` of the task's 32 weight rows
    /// (`wbuf`, rows of `KC` bf16) and batch blocks `b0` and `b0 + 1` (if
    /// any) into their C tiles in `acc` (`[2][nblk][16][16]` f32), starting
    /// them from zero at `k0 == 0`.
    #[allow(clippy::too_many_arguments)]
    fn block(
        &self,
        g: &Geometry,
        acc: &mut [f32],
        wbuf: &[u16],
        panel: &[u32],
        b0: usize,
        k0: usize,
        kc: usize,
    ) {
        let two = b0 + 1 < g.nblk;
        assert!(acc.len() == 2 * g.nblk * T * T && wbuf.len() == ROWS * KC);
        assert!(kc.is_multiple_of(KSTEP) && kc <= KC && (k0 + kc) / 2 <= g.pairs);
        assert!(panel.len() == g.nblk * g.parts * g.pairs * T);
        let base = acc.as_mut_ptr();
        let c = |rt: usize, bi: usize| base.wrapping_add(((rt * g.nblk) + b0 + bi) * T * T);
        let (c00, c10, c01, c11) = (c(0, 0), c(1, 0), c(0, 1), c(1, 1));
        let a_stride = KC * 2;
        let b_at = |bi: usize, part: usize, i: usize| {
            panel
                .as_ptr()
                .wrapping_add(((b0 + bi) * g.parts + part) * g.pairs * T + i / 2 * T)
        };
        // SAFETY: the tile configuration is loaded on this thread (`self`).
        // Every tile load reads 16 rows of 64 bytes: C tiles are 1 KiB
        // blocks inside `acc` (asserted length); A rows start at
        // `wbuf[rt * 16 * KC + s]`, s + 32 <= kc <= KC, 16 rows of stride KC
        // inside `wbuf`; B tiles are 16 consecutive pair rows from pair
        // (k0 + s) / 2, and (k0 + kc) / 2 <= pairs keeps them inside their
        // block's part. Stores write the same C blocks (stride 64 bytes).
        unsafe {
            if k0 == 0 {
                tile_zero!(0);
                tile_zero!(1);
                tile_zero!(2);
                tile_zero!(3);
            } else {
                tile_load!(0, c00, 64usize);
                tile_load!(2, c10, 64usize);
                if two {
                    tile_load!(1, c01, 64usize);
                    tile_load!(3, c11, 64usize);
                }
            }
            for s in (0..kc).step_by(KSTEP) {
                tile_load!(4, wbuf.as_ptr().add(s), a_stride);
                tile_load!(5, wbuf.as_ptr().add(T * KC + s), a_stride);
                for part in 0..g.parts {
                    tile_load!(6, b_at(0, part, k0 + s), 64usize);
                    tile_dot_bf16!(0, 4, 6);
                    tile_dot_bf16!(2, 5, 6);
                    if two {
                        tile_load!(7, b_at(1, part, k0 + s), 64usize);
                        tile_dot_bf16!(1, 4, 7);
                        tile_dot_bf16!(3, 5, 7);
                    }
                }
            }
            tile_store!(0, c00);
            tile_store!(2, c10);
            if two {
                tile_store!(1, c01);
                tile_store!(3, c11);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vals(n: usize, seed: u64) -> Vec<f32> {
        crate::testutil::rand_vec(n, seed)
    }

    /// E4M3 codes without NaN (0x7F / 0xFF).
    fn codes(n: usize, seed: u64) -> Vec<u8> {
        vals(n, seed)
            .iter()
            .map(|v| {
                let c = (v * 256.0) as u8;
                if c & 0x7F == 0x7F {
                    c ^ 1
                } else {
                    c
                }
            })
            .collect()
    }

    #[test]
    fn split_is_exact_and_minimal() {
        let Some(tok) = crate::simd::Avx512::new() else {
            eprintln!("skipped: no AVX-512 here");
            return;
        };
        for v in vals(10_000, 3).iter().map(|v| v * 1e3 - 300.0) {
            let p = split3(v);
            let sum = f64::from(bf16_value(p[0])) + f64::from(bf16_value(p[1]));
            assert_eq!(sum + f64::from(bf16_value(p[2])), f64::from(v), "{v}");
        }
        assert_eq!(split3(1.5), [0x3FC0, 0, 0]);
        assert_eq!(parts_needed(tok, &[1.5, -448.0, 0.0]), Some(1));
        assert_eq!(parts_needed(tok, &[1.0 + 1.0 / 256.0]), Some(2));
        assert_eq!(parts_needed(tok, &[1.0 + 1.0 / 65536.0]), Some(2));
        assert_eq!(
            parts_needed(tok, &[1.0 + 1.0 / 512.0 + 1.0 / 1048576.0]),
            Some(3)
        );
        assert_eq!(parts_needed(tok, &[1.0, f32::NAN]), None);
        assert_eq!(parts_needed(tok, &[f32::NEG_INFINITY]), None);
    }

    #[test]
    fn decode_matches_the_table() {
        let Some(tok) = Amx::new() else {
            eprintln!("skipped: no AMX here");
            return;
        };
        let all: Vec<u8> = (0..=255u8).filter(|c| c & 0x7F != 0x7F).collect();
        let table = crate::fp8::decode_table(crate::fp8::Fp8Format::E4M3);
        for len in [0, 1, 31, 32, 33, all.len()] {
            let mut out = vec![0xFFFFu16; len + 40];
            decode_bf16(tok, &all[..len], &mut out);
            for (i, &c) in all[..len].iter().enumerate() {
                assert_eq!(bf16_value(out[i]), table[c as usize], "code {c:#x}");
            }
            assert!(out[len..].iter().all(|&v| v == 0));
        }
    }

    /// Against an f64 reference on the shapes that exercise every edge: odd
    /// batch blocks, weight rows past a task, inputs not a multiple of 32 or
    /// of the chunk, one to three parts of `x`.
    #[test]
    fn gemm_matches_f64() {
        let Some(tok) = Amx::new() else {
            eprintln!("skipped: no AMX here");
            return;
        };
        let table = crate::fp8::decode_table(crate::fp8::Fp8Format::E4M3);
        for (m, n, k) in [
            (1, 1, 1),
            (8, 33, 31),
            (16, 16, 32),
            (17, 40, 513),
            (33, 70, 1100),
            (40, 31, 600),
            (64, 64, 1024),
        ] {
            let w = codes(n * k, (m * n + k) as u64);
            for parts in 1..=3 {
                let x: Vec<f32> = vals(m * k, k as u64)
                    .iter()
                    .map(|v| {
                        let v = v * 4.0 - 2.0;
                        match parts {
                            1 => bf16_value(bf16_rne(v)),
                            2 => bf16_value(bf16_rne(v)) + bf16_value(bf16_rne(v / 300.0)),
                            _ => v,
                        }
                    })
                    .collect();
                let bias = vals(n, 9);
                let mut y = vec![f32::NAN; m * n];
                let epi = Epilogue {
                    scale: &|r| 0.25 + r as f32,
                    bias: Some(&bias),
                };
                assert!(gemm_e4m3(tok, &w, n, k, &x, m, &mut y, &epi));
                for b in 0..m {
                    for r in 0..n {
                        let (mut s, mut mag) = (0f64, 0f64);
                        for i in 0..k {
                            let p =
                                f64::from(x[b * k + i]) * f64::from(table[w[r * k + i] as usize]);
                            s += p;
                            mag += p.abs();
                        }
                        let sc = 0.25 + r as f64;
                        let want = s * sc + f64::from(bias[r]);
                        let got = f64::from(y[b * n + r]);
                        assert!(
                            (got - want).abs() <= 1e-6 * mag * sc + 1e-6,
                            "m={m} n={n} k={k} parts={parts} ({b},{r}): {got} vs {want}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn non_finite_inputs_are_left_to_the_float32_engine() {
        let Some(tok) = Amx::new() else {
            eprintln!("skipped: no AMX here");
            return;
        };
        let (m, n, k) = (16, 4, 8);
        let mut x = vals(m * k, 1);
        x[5] = f32::INFINITY;
        let mut y = vec![7f32; m * n];
        let epi = Epilogue {
            scale: &|_| 1.0,
            bias: None,
        };
        assert!(!gemm_e4m3(tok, &codes(n * k, 2), n, k, &x, m, &mut y, &epi));
        assert!(y.iter().all(|&v| v == 7.0));
    }
}
