use super::*;
use crate::ggml::{GgmlType, Q4_1};
use crate::testutil::Xorshift;

fn random(n: usize, seed: u64) -> Vec<f32> {
    let mut rng = Xorshift::new(seed);
    (0..n)
        .map(|i| {
            // Groups of both signs of min: shift every other 32-run.
            let shift = if (i / 32) % 2 == 0 { 0.0 } else { 0.7 };
            rng.next_f32() + shift
        })
        .collect()
}

#[test]
fn rtn_group_32_is_q4_1_bit_for_bit() {
    let (out_feat, in_feat) = (3, 96);
    let w = random(out_feat * in_feat, 1);
    let a = AsymWeight::quantize(&w, out_feat, in_feat, 32, AsymMethod::Rtn, None).unwrap();
    let mut b = [0u8; 20];
    let mut deq = [0f32; 32];
    let full = a.dequantize();
    for r in 0..out_feat {
        for blk in 0..in_feat / 32 {
            let x = &w[r * in_feat + blk * 32..][..32];
            Q4_1::quantize_block(x, &mut b);
            let s = &a.scales()[(r * 3 + blk) * 2..][..2];
            assert_eq!(u16::from_le_bytes([b[0], b[1]]), s[0]);
            assert_eq!(u16::from_le_bytes([b[2], b[3]]), s[1]);
            assert_eq!(&b[4..20], &a.codes()[r * 48 + blk * 16..][..16]);
            Q4_1::dequantize_block(&b, &mut deq);
            let got = &full[r * in_feat + blk * 32..][..32];
            assert!(deq.iter().zip(got).all(|(x, y)| x.to_bits() == y.to_bits()));
        }
    }
}

#[test]
fn search_is_never_worse_than_rtn_per_group() {
    let mut rng = Xorshift::new(7);
    for gs in [32usize, 64, 128] {
        for case in 0..200 {
            let x = random(gs, 100 + case);
            let imp: Vec<f32> = (0..gs).map(|_| 1.5 * (rng.next_f32() + 1.0)).collect();
            for imp in [None, Some(&imp[..])] {
                let mut q = vec![0u8; gs];
                let (d, m) = quantize_group(&x, imp, AsymMethod::Rtn, &mut q);
                let rtn = group_error(&x, imp, d, m, &mut q);
                let (d, m) = quantize_group(&x, imp, AsymMethod::Search, &mut q);
                let q_kept = q.clone();
                let s = group_error(&x, imp, d, m, &mut q);
                assert_eq!(q, q_kept, "returned codes are the nearest of (d, m)");
                assert!(s <= rtn, "g{gs} case {case}: search {s} > rtn {rtn}");
            }
        }
    }
}

#[test]
fn search_lowers_the_error_on_average() {
    let (mut rtn, mut s) = (0.0, 0.0);
    for case in 0..100 {
        let x = random(64, 500 + case);
        let mut q = vec![0u8; 64];
        let (d, m) = quantize_group(&x, None, AsymMethod::Rtn, &mut q);
        rtn += group_error(&x, None, d, m, &mut q);
        let (d, m) = quantize_group(&x, None, AsymMethod::Search, &mut q);
        s += group_error(&x, None, d, m, &mut q);
    }
    assert!(s < 0.9 * rtn, "search {s} vs rtn {rtn}");
}

#[test]
fn partial_last_group_and_constant_groups() {
    // 96 inputs, groups of 64: a full group and one of 32.
    let mut w = random(2 * 96, 3);
    w[..96].fill(0.25); // a constant row: d = 0, m = 0.25 exactly
    let a = AsymWeight::quantize(&w, 2, 96, 64, AsymMethod::Search, None).unwrap();
    assert_eq!(a.groups(), 2);
    assert_eq!(a.nbytes(), 2 * 48 + 2 * 2 * 2 * 2);
    let deq = a.dequantize();
    assert!(deq[..96].iter().all(|&v| v == 0.25));
    let err: f32 = deq[96..]
        .iter()
        .zip(&w[96..])
        .map(|(a, b)| (a - b).abs())
        .fold(0.0, f32::max);
    // Half a step of a range of ~2.7 over 15 steps, plus half rounding.
    assert!(err < 0.1, "{err}");
}

#[test]
fn bad_inputs_are_errors() {
    let w = vec![0.5f32; 64];
    for gs in [0, 16, 48] {
        let e = AsymWeight::quantize(&w, 1, 64, gs, AsymMethod::Rtn, None).unwrap_err();
        assert!(e.to_string().contains("group_size"), "{e}");
    }
    let e = AsymWeight::quantize(&w[..48], 1, 48, 32, AsymMethod::Rtn, None).unwrap_err();
    assert!(e.to_string().contains("multiple of 32"), "{e}");
    let mut big = w.clone();
    big[3] = 1e6;
    let e = AsymWeight::quantize(&big, 1, 64, 32, AsymMethod::Rtn, None).unwrap_err();
    assert!(e.to_string().contains("w[0, 3] is 1000000.0"), "{e}");
    assert!(e.to_string().contains("|w| <= 65504"), "{e}");
    let mut nan = w.clone();
    nan[5] = f32::NAN;
    let e = AsymWeight::quantize(&nan, 1, 64, 32, AsymMethod::Rtn, None).unwrap_err();
    assert!(e.to_string().contains("w[0, 5] is NaN"), "{e}");
    let e = AsymWeight::quantize(&w, 1, 64, 32, AsymMethod::Search, Some(&[1.0; 3])).unwrap_err();
    assert!(e.to_string().contains("importance"), "{e}");
    let e = AsymWeight::new(vec![0; 32], vec![0x7C00, 0], 1, 64, 64).unwrap_err();
    assert!(e.to_string().contains("row 0 group 0 d"), "{e}");
}

#[test]
fn the_fused_dot_matches_float64_at_every_level() {
    use crate::linear::dispatch::Dots;
    // Every code in every nibble position, groups of 64 and a short last
    // group of 32 (160 inputs), minima of both signs.
    // Seven rows: one pass of four rows and one of three in the AVX2
    // multi-row kernel, and from row 1: two passes of three.
    let (out_feat, in_feat, gs) = (7, 160, 64);
    let w = random(out_feat * in_feat, 9);
    let a = AsymWeight::quantize(&w, out_feat, in_feat, gs, AsymMethod::Search, None).unwrap();
    let x = random(in_feat, 10);
    let h = crate::linear::fp8_dialect::f16_to_f32;
    for level in crate::simd::available_levels() {
        let dots = Dots::at(level).unwrap();
        let mut want = vec![(0f64, 0f64); out_feat];
        for (r, wr) in want.iter_mut().enumerate() {
            let q = a.unpacked_row(r);
            let sc = &a.scales()[r * 2 * a.groups()..(r + 1) * 2 * a.groups()];
            let (mut exact, mut mag) = (0f64, 0f64);
            for i in 0..in_feat {
                let (d, m) = (h(sc[2 * (i / gs)]) as f64, h(sc[2 * (i / gs) + 1]) as f64);
                exact += (d * q[i] as f64 + m) * x[i] as f64;
                mag += ((d * q[i] as f64).abs() + m.abs()) * (x[i] as f64).abs();
            }
            let got = a.dot_row(dots, r, &x) as f64;
            let bound = (in_feat + 3) as f64 * f32::EPSILON as f64 * mag;
            *wr = (exact, bound);
            assert!(
                (got - exact).abs() <= bound,
                "{level:?} row {r}: {got} vs {exact}"
            );
            let scalar = a.dot_row(Dots::Scalar, r, &x) as f64;
            assert!(
                (got - scalar).abs() <= 2.0 * bound,
                "{level:?} row {r} vs scalar"
            );
        }
        for r0 in [0, 1] {
            let mut out = vec![0f32; out_feat - r0];
            a.dot_rows(dots, r0, &x, &mut out);
            for (r, &got) in (r0..).zip(&out) {
                let (exact, bound) = want[r];
                let err = (got as f64 - exact).abs();
                assert!(err <= bound, "{level:?} dot_rows from {r0}, row {r}");
            }
        }
    }
    let all: std::collections::HashSet<u8> =
        (0..out_feat).flat_map(|r| a.unpacked_row(r)).collect();
    assert_eq!(all.len(), 16, "every code is exercised");
}

/// Column ranges of a row of `in_feat` inputs that the engine's tiles and
/// `decode` callers ask for: the whole row, runs, a partial run at either
/// end, one input, and spans that start and end mid-run.
pub(crate) fn decode_spans(in_feat: usize) -> Vec<(usize, usize)> {
    let spans = [
        (0, in_feat),
        (0, 32),
        (in_feat - 32, 32),
        (0, 1),
        (31, 2),
        (5, 70),
        (37, 64),
        (1, in_feat - 2),
        (in_feat - 17, 17),
        (64, 512),
    ];
    spans
        .into_iter()
        .filter(|&(k0, n)| k0 + n <= in_feat)
        .collect()
}

/// Every decode body (AVX2 where this CPU has it) gives the scalar
/// reference's floats bit for bit: every code in every nibble position,
/// halves of both signs (zero, subnormal, the largest finite), groups of
/// 32, 64, 96 and 128 with a short last group, spans cut mid-run.
#[test]
fn every_decode_body_is_the_scalar_one_bit_for_bit() {
    let halves: [u16; 10] = [
        0x0000, 0x8000, 0x0001, 0x83FF, 0x3C00, 0xBC00, 0x7BFF, 0xFBFF, 0x2E66, 0xA0A3,
    ];
    for (out_feat, in_feat) in [(3usize, 32usize), (2, 160), (5, 576), (2, 1056)] {
        for gs in [32, 64, 96, 128] {
            let groups = in_feat.div_ceil(gs);
            let codes: Vec<u8> = (0..out_feat * in_feat)
                .map(|i| ((i * 7 + i / 16) % 16) as u8)
                .collect();
            let scales = (0..out_feat * groups * 2)
                .map(|i| halves[(i * 3 + i / 7) % 10])
                .collect();
            let a = AsymWeight::from_codes(&codes, scales, out_feat, in_feat, gs).unwrap();
            for r in 0..out_feat {
                for (k0, n) in decode_spans(in_feat) {
                    let mut want = vec![f32::NAN; n];
                    a.decode_by(Decoder::Scalar, r, k0, &mut want);
                    // The reference is `d * q + m` written out here.
                    for (j, w) in want.iter().enumerate() {
                        let (k, g) = (k0 + j, (k0 + j) / gs);
                        let sc = &a.scales()[(r * groups + g) * 2..];
                        let v = half(sc[0]) * f32::from(codes[r * in_feat + k]) + half(sc[1]);
                        assert_eq!(w.to_bits(), v.to_bits(), "[{r}, {k}] g{gs}");
                    }
                    let what = format!("[{out_feat}x{in_feat}] g{gs} r{r} {k0}+{n}");
                    Decoder::assert_all_give(&want, |dec, got| a.decode_by(dec, r, k0, got), &what);
                }
            }
        }
    }
}

/// `y [m, n]` by the batch kernel of `batch_avx2` against float64 over
/// `w`'s dequantized rows, and the same floats with 1 and 3 threads.
#[cfg(target_arch = "x86_64")]
fn check_batch_kernel<S>(name: &str, s: &S, codes: &[u8], deq: &[f32], [n, k]: [usize; 2])
where
    S: rows_avx2::GroupScales + Sync,
{
    let Some(t) = crate::simd::Avx2::new() else {
        return;
    };
    let dots = Dots::Avx2(t, t.f16c());
    for m in [1, 2, 3, 4, 5, 8, 9, 16, 17, 31] {
        let x: Vec<f32> = crate::testutil::rand_vec(m * k, (m * k) as u64)
            .iter()
            .map(|v| 3.0 * v)
            .collect();
        let bias: Vec<f32> = (0..n).map(|r| r as f32 * 0.25 - 1.0).collect();
        let run = |threads: usize| {
            let mut y = vec![f32::NAN; m * n];
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .unwrap();
            pool.install(|| batch_avx2::matmul(t, dots, s, codes, [n, k], &x, Some(&bias), &mut y));
            y
        };
        let y = run(1);
        assert!(
            run(3)
                .iter()
                .zip(&y)
                .all(|(a, b)| a.to_bits() == b.to_bits()),
            "{name} m{m}"
        );
        if m <= 3 {
            // The batch-1 driver gives the multi-row dot of each row of `x`
            // (what the shared engine runs) plus the bias, bit for bit.
            for b in 0..m {
                let mut v = vec![0f32; n];
                rows_avx2::dot_rows(t, dots, s, codes, 0, &x[b * k..(b + 1) * k], &mut v);
                let same = (0..n).all(|r| (v[r] + bias[r]).to_bits() == y[b * n + r].to_bits());
                assert!(same, "{name} m{m} row {b}: the driver against dot_rows");
            }
        }
        for b in 0..m {
            for r in 0..n {
                let (xb, wr) = (&x[b * k..(b + 1) * k], &deq[r * k..(r + 1) * k]);
                let want: f64 = xb
                    .iter()
                    .zip(wr)
                    .map(|(&a, &w)| f64::from(a) * f64::from(w))
                    .sum();
                let mag: f64 = xb
                    .iter()
                    .zip(wr)
                    .map(|(&a, &w)| f64::from(a * w).abs())
                    .sum();
                let top = wr.iter().fold(0f32, |a, w| a.max(w.abs()));
                let xs: f64 = xb.iter().map(|&a| f64::from(a.abs())).sum();
                let tol = (k as f64 + 8.0) * f64::from(f32::EPSILON) * (mag + f64::from(top) * xs);
                let got = f64::from(y[b * n + r]) - f64::from(bias[r]);
                assert!(
                    (got - want).abs() <= tol + 1e-6,
                    "{name} m{m} [{b}, {r}]: {got} vs {want}"
                );
            }
        }
    }
}

/// The AVX2 forward of the three 4-bit nibble formats at batches 1 to 31
/// (the batch-1 driver to 3, the batch kernel from 4) against float64: odd row counts (tasks of 16 rows and a short
/// one), inputs that are not a multiple of the 512-input block (160, 576,
/// 1056), groups of 32 to 128 with a short last group, 1 and 3 threads.
#[cfg(target_arch = "x86_64")]
#[test]
fn the_batch_kernel_matches_float64_for_every_format() {
    for (n, k) in [(3, 160), (37, 576), (17, 1056)] {
        let w: Vec<f32> = random(n * k, (n + k) as u64);
        for gs in [32, 64, 96, 128] {
            let a = AsymWeight::quantize(&w, n, k, gs, AsymMethod::Rtn, None).unwrap();
            check_batch_kernel("int4_asym", &a, a.codes(), &a.dequantize(), [n, k]);
            let z = crate::int_zp::quantize_rtn(&w, n, k, gs, 4).unwrap();
            check_batch_kernel("int_zp", &z, z.codes(), &z.dequantize(), [n, k]);
        }
        let q = crate::int4_k::KWeight::quantize(&w, n, k, crate::int4_k::KMethod::Rtn, None);
        let q = q.unwrap();
        check_batch_kernel("int4_k", &q, q.codes(), &q.dequantize(), [n, k]);
    }
}

#[cfg(target_arch = "x86_64")]
#[test]
fn padded_group_scales_are_the_pairs_then_zeros_on_every_row() {
    use super::rows_avx2::GroupScales;
    use crate::linear::dispatch::Dots;
    // 3 groups: 6 pairs in a slot of 8; rows 0-3 read the next row's
    // halves into the padding (then zero it), row 4 (the last) cannot.
    let (out_feat, in_feat, gs) = (5, 96, 32);
    let w = random(out_feat * in_feat, 21);
    let a = AsymWeight::quantize(&w, out_feat, in_feat, gs, AsymMethod::Rtn, None).unwrap();
    let h = crate::linear::fp8_dialect::f16_to_f32;
    for level in crate::simd::available_levels() {
        let dots = Dots::at(level).unwrap();
        for r in 0..out_feat {
            let mut slot = [0f32; 8];
            a.group_scales_padded(dots, r, 6, &mut slot);
            let want: Vec<f32> = a.scales()[r * 6..(r + 1) * 6]
                .iter()
                .map(|&v| h(v))
                .collect();
            assert_eq!(&slot[..6], &want[..], "{level:?} row {r}");
            assert_eq!(slot[6..], [0.0, 0.0], "{level:?} row {r}: padding");
        }
    }
}
