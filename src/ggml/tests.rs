//! Each type's dequantization against its layout written out by hand (an
//! independent decoding of the same ggml facts, weight by weight), the
//! half conversion, and quantize -> dequantize within one step.

use super::*;
use crate::linear::dispatch::Dots;
use crate::linear::fp8_dialect::f16_to_f32;
use crate::simd::available_levels;
use crate::testutil::rand_vec;

/// A block of `T` with random code bytes and random finite half scales
/// of both signs.
fn random_block<T: GgmlType>(seed: u64) -> Vec<u8> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut next = || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        s
    };
    let mut b: Vec<u8> = (0..T::BYTES).map(|_| next() as u8).collect();
    for &o in T::HALF_SCALES {
        // Exponent field 0..=30: finite; the sign bit random.
        let h = ((next() % 31) << 10) as u16 | (next() as u16 & 0x83FF);
        b[o..o + 2].copy_from_slice(&h.to_le_bytes());
    }
    b
}

fn half(b: &[u8], o: usize) -> f32 {
    f16_to_f32(u16::from_le_bytes([b[o], b[o + 1]]))
}

fn nib(b: u8, hi: bool) -> u8 {
    if hi {
        b >> 4
    } else {
        b & 15
    }
}

/// Weight `i` of block `b` of type `name`, straight from the layout.
fn by_hand(name: &str, b: &[u8], i: usize) -> f32 {
    match name {
        "q8_0" => half(b, 0) * f32::from(b[2 + i] as i8),
        "q4_0" => half(b, 0) * (f32::from(nib(b[2 + i % 16], i >= 16)) - 8.0),
        "q4_1" => half(b, 0) * f32::from(nib(b[4 + i % 16], i >= 16)) + half(b, 2),
        "q5_0" | "q5_1" => {
            let base = if name == "q5_0" { 2 } else { 4 };
            let qh = u32::from_le_bytes(b[base..base + 4].try_into().unwrap());
            let q = nib(b[base + 4 + i % 16], i >= 16) | ((((qh >> i) & 1) as u8) << 4);
            if name == "q5_0" {
                half(b, 0) * (f32::from(q) - 16.0)
            } else {
                half(b, 0) * f32::from(q) + half(b, 2)
            }
        }
        "q4_k" | "q5_k" => {
            let (j, c, l) = (i / 32, i / 64, i % 32);
            let s = &b[4..16];
            let (sc, m) = if j < 4 {
                (s[j] & 63, s[j + 4] & 63)
            } else {
                (
                    (s[j + 4] & 15) | ((s[j - 4] >> 6) << 4),
                    (s[j + 4] >> 4) | ((s[j] >> 6) << 4),
                )
            };
            let qs = if name == "q4_k" { 16 } else { 48 };
            let mut q = nib(b[qs + 32 * c + l], j % 2 == 1);
            if name == "q5_k" {
                q |= ((b[16 + l] >> j) & 1) << 4;
            }
            (half(b, 0) * f32::from(sc)) * f32::from(q) - half(b, 2) * f32::from(m)
        }
        "q6_k" => {
            let (n, r) = (i / 128, i % 128);
            let (g, l) = (r / 32, r % 32);
            let lo = nib(b[64 * n + 32 * (g % 2) + l], g >= 2);
            let hi = (b[128 + 32 * n + l] >> (2 * g)) & 3;
            let q = i32::from(lo | (hi << 4)) - 32;
            (half(b, 208) * f32::from(b[192 + i / 16] as i8)) * q as f32
        }
        _ => unreachable!(),
    }
}

fn check_type<T: GgmlType>() {
    let mut out = vec![0f32; T::ELEMS];
    for seed in 1..200 {
        let b = random_block::<T>(seed);
        T::dequantize_block(&b, &mut out);
        for (i, &v) in out.iter().enumerate() {
            let want = by_hand(T::NAME, &b, i);
            assert_eq!(v.to_bits(), want.to_bits(), "{} seed {seed} [{i}]", T::NAME);
        }
    }
    // quantize -> dequantize stays within one code step of each weight.
    let x: Vec<f32> = rand_vec(T::ELEMS, 5).iter().map(|v| 2.0 * v).collect();
    let mut b = vec![0u8; T::BYTES];
    T::quantize_block(&x, &mut b);
    T::dequantize_block(&b, &mut out);
    let range = x.iter().fold(0f32, |m, v| m.max(v.abs())) * 2.0;
    let levels = match T::NAME {
        "q8_0" => 254.0,
        "q4_0" | "q4_1" => 15.0,
        "q6_k" => 63.0,
        _ => 31.0,
    };
    // K types also round their 6-bit sub-block scales: a looser bound.
    let slack = if T::ELEMS == 256 { 2.0 } else { 1.0 };
    for (i, (&a, &q)) in x.iter().zip(&out).enumerate() {
        assert!(
            (a - q).abs() <= slack * range / levels,
            "{} [{i}] {a} vs {q}",
            T::NAME
        );
    }
}

/// `check::<T>()` for every block type.
macro_rules! each_type {
    ($check:ident) => {
        $check::<Q8_0>();
        $check::<Q4_0>();
        $check::<Q4_1>();
        $check::<Q5_0>();
        $check::<Q5_1>();
        $check::<Q4K>();
        $check::<Q5K>();
        $check::<Q6K>();
    };
}

#[test]
fn every_type_decodes_its_layout_bit_for_bit() {
    each_type!(check_type);
}

/// The codes and affine maps of random blocks (every code bit pattern,
/// finite half scales of both signs) give `dequantize_block`'s weights bit
/// for bit, `a_j * q + c_j` (no `+ c` where the type has no minimum); every
/// SIMD level extracts the same codes and decodes the same bits.
fn check_codes<T: GgmlType>() {
    let (mut want, mut got) = (vec![0f32; T::ELEMS], vec![0f32; T::ELEMS]);
    let mut q: Codes = [0; MAX_BLOCK_ELEMS];
    for seed in 1..300 {
        let b = random_block::<T>(seed);
        T::dequantize_block(&b, &mut want);
        T::codes(&b, &mut q);
        let (a, c) = T::factors(&b);
        for (i, &w) in want.iter().enumerate() {
            let j = i / T::SUB;
            let v = a[j] * f32::from(q[i]);
            let v = if T::AFFINE { v + c[j] } else { v };
            assert_eq!(v.to_bits(), w.to_bits(), "{} seed {seed} [{i}]", T::NAME);
        }
        #[cfg(target_arch = "x86_64")]
        if crate::simd::Avx2::new().is_some() {
            let mut buf: Codes = [0; MAX_BLOCK_ELEMS];
            // SAFETY: AVX2 checked just above; `b` has BYTES bytes, `buf` 256.
            let p = unsafe { simd_codes::<T>(&b, &mut buf) };
            // SAFETY: `p` points at ELEMS codes (in `buf` or in `b`).
            let simd = unsafe { std::slice::from_raw_parts(p, T::ELEMS) };
            assert_eq!(simd, &q[..T::ELEMS], "{} seed {seed}", T::NAME);
        }
        for level in available_levels() {
            decode_block::<T>(Dots::at(level).unwrap(), &b, &mut got);
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&got), bits(&want), "{} {level:?} seed {seed}", T::NAME);
        }
    }
}

/// `codes_x86` run with AVX2 enabled, as the kernels run it.
///
/// # Safety
/// The CPU has AVX2; `b.len() == T::BYTES`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn simd_codes<T: GgmlType>(b: &[u8], buf: &mut Codes) -> *const i8 {
    // SAFETY: the caller's contract; `buf` holds 256 bytes.
    unsafe { T::codes_x86(b.as_ptr(), buf.as_mut_ptr()) }
}

/// The fused row dot of rows of random blocks, at every level, against the
/// float64 dot of the dequantized row: within `(in + 2) * eps *
/// sum (|a q| + |c|) |x|` (fused.rs), and the SIMD levels within twice that
/// of the scalar one.
fn check_dot<T: GgmlType>() {
    let blocks = 5;
    let mut row = Vec::new();
    for seed in 0..blocks {
        row.extend(random_block::<T>(1000 + seed as u64));
    }
    let n = blocks * T::ELEMS;
    let x: Vec<f32> = rand_vec(n, 7).iter().map(|v| 2.0 * v - 1.0).collect();
    let (exact, bound) = exact_and_bound::<T>(&row, &x);
    let scalar = fused::dot_row_scalar::<T>(&row, &x);
    for level in available_levels() {
        let got = f64::from(dot_row::<T>(Dots::at(level).unwrap(), &row, &x));
        assert!(
            (got - exact).abs() <= bound,
            "{} {level:?}: {got} vs {exact} (bound {bound})",
            T::NAME
        );
        assert!(
            (got - f64::from(scalar)).abs() <= 2.0 * bound,
            "{} {level:?} vs scalar",
            T::NAME
        );
    }
}

/// The float64 dot of the dequantized `row` with `x`, and `fused.rs`'s
/// bound `(in + 2) * eps * sum (|a q| + |c|) |x|` around it, with `(a, q,
/// c)` read as `(a, q + bias, c - bias a)` (`GgmlType::LEGACY`: the AVX2
/// kernel of the 32-weight types sums the unsigned codes).
pub(super) fn exact_and_bound<T: GgmlType>(row: &[u8], x: &[f32]) -> (f64, f64) {
    let (mut exact, mut mag) = (0f64, 0f64);
    let mut w = vec![0f32; T::ELEMS];
    let mut q: Codes = [0; MAX_BLOCK_ELEMS];
    let bias = f64::from(T::LEGACY.bias());
    for (b, xb) in row.chunks_exact(T::BYTES).zip(x.chunks_exact(T::ELEMS)) {
        T::dequantize_block(b, &mut w);
        T::codes(b, &mut q);
        let (a, c) = T::factors(b);
        for i in 0..T::ELEMS {
            let j = i / T::SUB;
            let (a, c) = (f64::from(a[j]), f64::from(c[j]));
            exact += f64::from(w[i]) * f64::from(xb[i]);
            mag += ((a * (f64::from(q[i]) + bias)).abs() + (c - bias * a).abs())
                * f64::from(xb[i]).abs();
        }
    }
    (exact, (x.len() + 2) as f64 * f64::from(f32::EPSILON) * mag)
}

/// `dot_rows` (the AVX2 multi-row kernel: four rows per pass, then three,
/// two or one) on 1 to 11 rows from an offset row, 1 to 3 blocks of random
/// bytes per row (every code bit pattern, scales of both signs): each
/// output within the bound of the float64 dot of its dequantized row and
/// of the scalar twin, at every level.
fn check_dot_rows<T: GgmlType>() {
    check_row_windows::<T>(&[1, 2, 3], |r| random_block::<T>(5000 + r as u64), 3);
}

/// 13 rows of `blocks` blocks each (block `g` of the row set from
/// `block(g)`) for every count of `block_counts`, `x` uniform in [-2, 2)
/// from `x_seed + blocks`: `dot_rows` at every level on the row windows of
/// `testutil::ROW_WINDOWS`, each output within the bound of the float64 dot
/// of its dequantized row and within twice that of the scalar twin.
fn check_row_windows<T: GgmlType>(
    block_counts: &[usize],
    block: impl Fn(usize) -> Vec<u8>,
    x_seed: u64,
) {
    for &blocks in block_counts {
        let rows = 13;
        let data: Vec<u8> = (0..rows * blocks).flat_map(&block).collect();
        let row_bytes = blocks * T::BYTES;
        let x: Vec<f32> = rand_vec(blocks * T::ELEMS, x_seed + blocks as u64)
            .iter()
            .map(|v| 4.0 * v - 2.0)
            .collect();
        for (r0, n) in crate::testutil::ROW_WINDOWS {
            for level in available_levels() {
                let mut out = vec![f32::NAN; n];
                dot_rows::<T>(Dots::at(level).unwrap(), &data, row_bytes, r0, &x, &mut out);
                for (i, &got) in out.iter().enumerate() {
                    let row = &data[(r0 + i) * row_bytes..(r0 + i + 1) * row_bytes];
                    let (exact, bound) = exact_and_bound::<T>(row, &x);
                    let scalar = f64::from(fused::dot_row_scalar::<T>(row, &x));
                    let got = f64::from(got);
                    let at = format!(
                        "{} {level:?} rows {r0}+{i} of {n}, {blocks} blocks",
                        T::NAME
                    );
                    assert!(
                        (got - exact).abs() <= bound,
                        "{at}: {got} vs {exact} ({bound})"
                    );
                    assert!(
                        (got - scalar).abs() <= 2.0 * bound,
                        "{at}: {got} vs {scalar}"
                    );
                }
            }
        }
    }
}

/// Block `g` of a row set (for the 32-weight kernel, `legacy_avx2.rs`):
/// its code bytes cycle through every byte value over consecutive blocks
/// (so every nibble, fifth-bit byte and int8 code occurs at every
/// position), its halves are `+0`, `-0`, a subnormal, the largest finite
/// half or a random finite one, each of either sign.
fn legacy_block<T: GgmlType>(g: usize) -> Vec<u8> {
    let mut b = random_block::<T>(9000 + g as u64);
    let first = T::HALF_SCALES.len() * 2;
    for (j, v) in b.iter_mut().enumerate().skip(first) {
        *v = ((g * 16 + j * 37) % 256) as u8;
    }
    if let Legacy::Fifth { qh, .. } = T::LEGACY {
        for p in 0..4 {
            b[qh + p] = ((g + 64 * p) % 256) as u8;
        }
    }
    for (n, &o) in T::HALF_SCALES.iter().enumerate() {
        let sign = if (g / 5 + n) % 2 == 1 { 0x8000u16 } else { 0 };
        let h = match (g + 2 * n) % 5 {
            0 => 0,
            1 => 0x0001 + ((g * 97) % 0x3FF) as u16,
            2 => 0x7BFF,
            // (Exponent 31 cleared to 15: finite.)
            _ => match u16::from_le_bytes([b[o], b[o + 1]]) & 0x7FFF {
                h if h >= 0x7C00 => h & 0x3FFF,
                h => h,
            },
        };
        b[o..o + 2].copy_from_slice(&(sign | h).to_le_bytes());
    }
    b
}

/// The AVX2 kernel of the 32-weight types (four rows per pass; Q5_1's
/// halves converted per group of 8 blocks, a row's last group overlapping
/// the one before it) through `dot_rows` at every level, on 1 to 11 rows
/// from an offset and block counts below, at and between groups: each
/// output within the float64 bound of its dequantized row, and within
/// twice that of the scalar twin.
fn check_legacy_rows<T: GgmlType>() {
    check_row_windows::<T>(&[1, 2, 5, 18, 31, 32, 33, 48, 70], legacy_block::<T>, 11);
}

#[test]
fn legacy_kernel_matches_float64_on_every_code_and_scale() {
    check_legacy_rows::<Q8_0>();
    check_legacy_rows::<Q4_0>();
    check_legacy_rows::<Q4_1>();
    check_legacy_rows::<Q5_0>();
    check_legacy_rows::<Q5_1>();
}

/// The table of fifth bits and the layouts the kernel reads by: each
/// `LEGACY` names the type's code offset and the 32-weight types only.
#[test]
fn legacy_layouts_name_the_code_offsets() {
    assert_eq!(Q4_0::LEGACY.bias(), 8);
    assert_eq!(Q5_0::LEGACY.bias(), 16);
    for bias in [
        Q4_1::LEGACY.bias(),
        Q5_1::LEGACY.bias(),
        Q8_0::LEGACY.bias(),
    ] {
        assert_eq!(bias, 0);
    }
    assert_eq!(Q4K::LEGACY, Legacy::No);
    assert_eq!(Q5K::LEGACY, Legacy::No);
    assert_eq!(Q6K::LEGACY, Legacy::No);
}

#[test]
fn codes_and_maps_give_the_exact_weights_at_every_level() {
    each_type!(check_codes);
}

#[test]
fn fused_dot_matches_float64_at_every_level() {
    each_type!(check_dot);
}

#[test]
fn multi_row_dot_matches_float64_for_every_row_count() {
    each_type!(check_dot_rows);
}

#[test]
fn f16_at_is_f16_to_f32_for_every_half() {
    for h in 0u16..=0xFFFF {
        let (a, b) = (f16_at(&h.to_le_bytes(), 0), f16_to_f32(h));
        assert!(
            a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan()),
            "{h:#06x}"
        );
    }
}

#[test]
fn f32_to_f16_rounds_to_nearest_even() {
    for h in 0u16..=0xFFFF {
        let v = f16_to_f32(h);
        if v.is_finite() {
            assert_eq!(f32_to_f16(v), h, "{h:#06x}");
        }
    }
    assert_eq!(f32_to_f16(65519.0), 0x7BFF);
    assert_eq!(f32_to_f16(65520.0), 0x7C00);
    assert_eq!(f32_to_f16(1.0 + 2f32.powi(-11)), 0x3C00); // tie to even
    assert_eq!(f32_to_f16(1.0 + 3.0 * 2f32.powi(-11)), 0x3C02);
    assert_eq!(f32_to_f16(2f32.powi(-25)), 0); // tie to even (0)
    assert_eq!(f32_to_f16(3.0 * 2f32.powi(-26)), 1);
}

#[path = "a8_tests.rs"]
mod a8_tests;

/// The batch-1 forward against batch 2 (the same row dots, `crate::par`
/// over bands of rows) on a small shape and one of several bands, with a
/// bias: the same values bit for bit, and the same again under a one-thread
/// cap.
fn check_batch1_forward<T: GgmlType>() {
    use crate::format::matmul_blocks;
    for (out, blocks) in [(7, 3), (300, 30)] {
        let inf = blocks * T::ELEMS;
        let mut data = Vec::new();
        for g in 0..out * blocks {
            data.extend(legacy_block::<T>(g));
        }
        let x: Vec<f32> = rand_vec(2 * inf, 21)
            .iter()
            .map(|v| 2.0 * v - 1.0)
            .collect();
        let bias: Vec<f32> = rand_vec(out, 22);
        let mut y2 = vec![0f32; 2 * out];
        matmul_blocks::<T>(&data, [out, inf], &x, 2, Some(&bias), &mut y2).unwrap();
        for r in 0..2 {
            let mut y1 = vec![f32::NAN; out];
            let xr = &x[r * inf..(r + 1) * inf];
            matmul_blocks::<T>(&data, [out, inf], xr, 1, Some(&bias), &mut y1).unwrap();
            let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
            assert_eq!(
                bits(&y1),
                bits(&y2[r * out..(r + 1) * out]),
                "{} {out} row {r}",
                T::NAME
            );
            let prev = crate::par::set_thread_limit(Some(1));
            let mut y1c = vec![f32::NAN; out];
            matmul_blocks::<T>(&data, [out, inf], xr, 1, Some(&bias), &mut y1c).unwrap();
            crate::par::set_thread_limit(prev);
            assert_eq!(bits(&y1c), bits(&y1), "{} {out} one thread", T::NAME);
        }
    }
}

#[test]
fn batch1_forward_equals_the_engine_rows_with_bias() {
    each_type!(check_batch1_forward);
}
