//! The k-quant AVX2 row dot (`rows_k_avx2.rs`) against the float64 dot of
//! each row's dequantized weights (within `fused.rs`'s bound) and the
//! scalar twin `fused::dot_row_scalar`: every code bit pattern (random code
//! bytes), every 6-bit scale and minimum (Q4_K, Q5_K) and every signed
//! 8-bit scale (Q6_K), halves of both signs including zero, subnormals and
//! the largest, 1 to 11 rows from an offset, 1 to 5 super-blocks per row.

use super::{k_maps, Prepared};
use crate::ggml::fused::{dot_row_scalar, dot_rows};
use crate::ggml::k_scales::{multipliers, pack_scale_min};
use crate::ggml::tests::exact_and_bound;
use crate::ggml::{GgmlType, Q4K, Q5K, Q6K};
use crate::linear::dispatch::Dots;
use crate::simd::{available_levels, Avx2, Avx2F16c, SimdLevel};
use crate::testutil::{Xorshift, ROW_WINDOWS};

/// Half scales the blocks cycle through: zero and minus zero, the smallest
/// and largest subnormals, the smallest normal, one, the largest finite,
/// each of both signs, and a few ordinary values.
const HALVES: [u16; 16] = [
    0x0000, 0x8000, 0x0001, 0x8001, 0x03FF, 0x83FF, 0x0400, 0x8400, 0x3C00, 0xBC00, 0x7BFF, 0xFBFF,
    0x2E66, 0xA0A3, 0x1234, 0x9ABC,
];

fn token() -> Option<Avx2F16c> {
    Avx2::new().and_then(|t| t.f16c())
}

/// Super-block number `t` of `T`: random code bytes; its halves from
/// [`HALVES`]; Q4_K / Q5_K scale and minimum of sub-block `j` `8t + j` and
/// `8t + 5j + 11` (mod 64: eight blocks hold every 6-bit value); Q6_K scale
/// `j` the byte `16t + j` (sixteen blocks hold every signed byte).
fn block<T: GgmlType>(rng: &mut Xorshift, t: usize) -> Vec<u8> {
    let mut b: Vec<u8> = (0..T::BYTES).map(|_| rng.next_u64() as u8).collect();
    for (n, &o) in T::HALF_SCALES.iter().enumerate() {
        let h = HALVES[(t + 7 * n) % HALVES.len()];
        b[o..o + 2].copy_from_slice(&h.to_le_bytes());
    }
    if T::GGML_TYPE == 14 {
        for j in 0..16 {
            b[192 + j] = (16 * t + j) as u8;
        }
    } else {
        let sc: [u8; 8] = std::array::from_fn(|j| ((8 * t + j) % 64) as u8);
        let m: [u8; 8] = std::array::from_fn(|j| ((8 * t + 5 * j + 11) % 64) as u8);
        pack_scale_min(&sc, &m, &mut b[4..16]);
    }
    b
}

/// Every row window of 13 rows of 1, 2, 3 and 5 super-blocks, through
/// `fused::dot_rows` at every level and through this kernel directly.
fn check_rows<T: GgmlType>() {
    for blocks in [1, 2, 3, 5] {
        let mut rng = Xorshift::new(100 + blocks as u64 + T::GGML_TYPE as u64);
        let rows = 13;
        let data: Vec<u8> = (0..rows * blocks)
            .flat_map(|t| block::<T>(&mut rng, t))
            .collect();
        let row_bytes = blocks * T::BYTES;
        let x: Vec<f32> = (0..blocks * T::ELEMS)
            .map(|_| 2.0 * rng.next_f32())
            .collect();
        for (r0, n) in ROW_WINDOWS {
            let mut outs = Vec::new();
            for level in available_levels() {
                let mut out = vec![f32::NAN; n];
                dot_rows::<T>(Dots::at(level).unwrap(), &data, row_bytes, r0, &x, &mut out);
                outs.push((format!("{level:?}"), out));
            }
            if let Some(t) = token() {
                let mut out = vec![f32::NAN; n];
                assert!(super::dot_rows::<T>(t, &data, row_bytes, r0, &x, &mut out));
                outs.push(("rows_k_avx2".into(), out));
            }
            for (what, out) in &outs {
                for (i, &got) in out.iter().enumerate() {
                    let row = &data[(r0 + i) * row_bytes..(r0 + i + 1) * row_bytes];
                    let (exact, bound) = exact_and_bound::<T>(row, &x);
                    let scalar = f64::from(dot_row_scalar::<T>(row, &x));
                    let got = f64::from(got);
                    assert!(
                        (got - exact).abs() <= bound && (got - scalar).abs() <= 2.0 * bound,
                        "{} {what}: rows {r0}+{i} of {n}, {blocks} blocks: {got} vs {exact} \
                         (scalar {scalar}, bound {bound})",
                        T::NAME
                    );
                }
            }
        }
    }
}

#[test]
fn q4_k_rows_match_float64_and_the_scalar_twin() {
    check_rows::<Q4K>();
}

#[test]
fn q5_k_rows_match_float64_and_the_scalar_twin() {
    check_rows::<Q5K>();
}

#[test]
fn q6_k_rows_match_float64_and_the_scalar_twin() {
    check_rows::<Q6K>();
}

/// The vector maps are the scalar ones bit for bit: Q4_K / Q5_K's `d sc_j`
/// and `dmin m_j` for every 6-bit value and every half of [`HALVES`].
#[test]
fn k_maps_are_the_scalar_multipliers() {
    let Some(t) = token() else { return };
    let mut rng = Xorshift::new(7);
    for n in 0..8 * HALVES.len() {
        let b = block::<Q4K>(&mut rng, n);
        // SAFETY: the token proves AVX2 and F16C; 144 bytes at `b`.
        let (a, c) = unsafe { maps_of(t, &b) };
        for (j, (d, m)) in multipliers(&b).into_iter().enumerate() {
            assert_eq!(
                (a[j].to_bits(), c[j].to_bits()),
                (d.to_bits(), m.to_bits()),
                "block {n} sub-block {j}"
            );
        }
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn maps_of(_: Avx2F16c, b: &[u8]) -> ([f32; 8], [f32; 8]) {
    let (mut a, mut c) = ([0f32; 8], [0f32; 8]);
    // SAFETY: 16 readable bytes at `b`, 8 writable floats in each array.
    unsafe {
        let (va, vc) = k_maps(b.as_ptr());
        std::arch::x86_64::_mm256_storeu_ps(a.as_mut_ptr(), va);
        std::arch::x86_64::_mm256_storeu_ps(c.as_mut_ptr(), vc);
    }
    (a, c)
}

/// The prepared `x`: the shuffle order of every 32 inputs, and each
/// sub-block's sum within its 31 roundings of the float64 sum; without the
/// shuffled copy (Q4_K reads `x` in input order) the same sums and `xp`
/// left as it was.
#[test]
fn prepared_x_is_the_shuffle_order_and_the_sub_block_sums() {
    let Some(t) = token() else { return };
    let mut rng = Xorshift::new(9);
    let x: Vec<f32> = (0..512).map(|_| 3.0 * rng.next_f32()).collect();
    let mut p = Prepared {
        xp: vec![f32::NAN; 7],
        sx: Vec::new(),
    };
    // SAFETY: the token proves the features; 512 is whole 32-blocks.
    assert!(unsafe { p.fill(t, &x, true) });
    assert_eq!((p.xp.len(), p.sx.len()), (512, 16));
    let mut sums_only = Prepared {
        xp: vec![f32::NAN; 7],
        sx: Vec::new(),
    };
    // SAFETY: as above.
    assert!(unsafe { sums_only.fill(t, &x, false) });
    assert_eq!(sums_only.xp.len(), 7);
    let bits = |v: &[f32]| v.iter().map(|s| s.to_bits()).collect::<Vec<_>>();
    assert_eq!(bits(&sums_only.sx), bits(&p.sx));
    for (m, xs) in x.chunks_exact(32).enumerate() {
        for k in 0..4 {
            for i in 0..4 {
                assert_eq!(p.xp[32 * m + 8 * k + i], xs[4 * k + i]);
                assert_eq!(p.xp[32 * m + 8 * k + 4 + i], xs[16 + 4 * k + i]);
            }
        }
        let exact: f64 = xs.iter().map(|&v| f64::from(v)).sum();
        let mag: f64 = xs.iter().map(|&v| f64::from(v).abs()).sum();
        assert!((f64::from(p.sx[m]) - exact).abs() <= 31.0 * f64::from(f32::EPSILON) * mag);
    }
}

/// An `x` with some `|x_i| >= 2^64` (where `q * 2^24 * x` sums could
/// overflow) or a non-finite one runs the scalar twin: the same bits.
#[test]
fn huge_or_non_finite_inputs_run_the_scalar_twin() {
    let Some(t) = token() else { return };
    fn check<T: GgmlType>(t: Avx2F16c) {
        let mut rng = Xorshift::new(11);
        let data: Vec<u8> = (0..6).flat_map(|n| block::<T>(&mut rng, n + 8)).collect();
        let row_bytes = 2 * T::BYTES;
        for big in [2f32.powi(64), 3e38, f32::INFINITY, f32::NAN] {
            let mut x: Vec<f32> = (0..512).map(|_| rng.next_f32()).collect();
            x[77] = big;
            // The kernel declines and leaves `out` alone; `fused::dot_rows`
            // at the AVX2 level then runs the scalar twin.
            let mut out = [7f32; 3];
            assert!(!super::super::rows_k_avx2::dot_rows::<T>(
                t, &data, row_bytes, 0, &x, &mut out
            ));
            assert_eq!(out, [7f32; 3]);
            let avx2 = Dots::at(SimdLevel::Avx2).expect("AVX2 (the token exists)");
            dot_rows::<T>(avx2, &data, row_bytes, 0, &x, &mut out);
            for (r, &got) in out.iter().enumerate() {
                let want = dot_row_scalar::<T>(&data[r * row_bytes..(r + 1) * row_bytes], &x);
                assert!(
                    got.to_bits() == want.to_bits() || (got.is_nan() && want.is_nan()),
                    "{} x = {big}: row {r} {got} vs {want}",
                    T::NAME
                );
            }
        }
        // Just below the limit the kernel itself runs, within the bound.
        let mut x: Vec<f32> = (0..512).map(|_| rng.next_f32()).collect();
        x[5] = 2f32.powi(63) * 1.9;
        let mut out = [0f32; 3];
        assert!(super::super::rows_k_avx2::dot_rows::<T>(
            t, &data, row_bytes, 0, &x, &mut out
        ));
        for (r, &got) in out.iter().enumerate() {
            let (exact, bound) =
                exact_and_bound::<T>(&data[r * row_bytes..(r + 1) * row_bytes], &x);
            assert!(
                (f64::from(got) - exact).abs() <= bound,
                "{} row {r}",
                T::NAME
            );
        }
    }
    check::<Q4K>(t);
    check::<Q5K>(t);
    check::<Q6K>(t);
}
