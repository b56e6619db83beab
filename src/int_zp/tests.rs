//! The zero-point weight against its formula written out here: every code
//! and zero point, halves of both signs (subnormal included), the act-order
//! permutation, the fused dot at every SIMD level, and bad parts.

use super::*;
use crate::linear::dispatch::Dots;
use crate::simd::available_levels;
use crate::testutil::{rand_vec, Xorshift};

/// A random weight of `bits`: codes cycling through every value (so each
/// appears in every nibble position), zero points 0, the top code and
/// random ones, half scales of both signs including a subnormal.
fn random(out_feat: usize, in_feat: usize, gs: usize, bits: u32, perm: bool) -> ZpWeight {
    let mut r = Xorshift::new(u64::from(bits) * 7 + in_feat as u64);
    let top = (1u32 << bits) - 1;
    let q: Vec<u8> = (0..out_feat * in_feat)
        .map(|i| ((i as u64 * 7) % (u64::from(top) + 1)) as u8)
        .collect();
    let groups = in_feat.div_ceil(gs);
    let zeros: Vec<u8> = (0..out_feat * groups)
        .map(|i| match i % 4 {
            0 => 0,
            1 => top as u8,
            _ => (r.next_u64() % (u64::from(top) + 1)) as u8,
        })
        .collect();
    let scales: Vec<u16> = (0..out_feat * groups)
        .map(|i| match i % 5 {
            0 => 0x8001, // the smallest negative subnormal
            1 => 0x3C00, // 1.0
            _ => crate::ggml::f32_to_f16(r.next_f32() * 0.01),
        })
        .collect();
    let perm = perm.then(|| {
        let mut p: Vec<u32> = (0..in_feat as u32).collect();
        for i in (1..in_feat).rev() {
            p.swap(i, (r.next_u64() % (i as u64 + 1)) as usize);
        }
        p
    });
    ZpWeight::from_codes(
        &q,
        parts(scales, zeros, perm, [out_feat, in_feat], gs, bits),
    )
    .unwrap()
}

/// The parts of a weight, by position.
fn parts(
    scales: Vec<u16>,
    zeros: Vec<u8>,
    perm: Option<Vec<u32>>,
    shape: [usize; 2],
    group_size: usize,
    bits: u32,
) -> ZpParts {
    ZpParts {
        scales,
        zeros,
        perm,
        shape,
        group_size,
        bits,
    }
}

/// `s * (q - z)` of stored element `[o, i]`, from the unpacked parts.
fn formula(w: &ZpWeight, o: usize, i: usize) -> f32 {
    let g = o * w.groups() + i / w.group_size();
    let q = w.unpacked_row(o)[i];
    half(w.scales()[g]) * (f32::from(q) - f32::from(w.zeros()[g]))
}

#[test]
fn dequantize_is_the_formula_for_every_code() {
    for (bits, gs, perm) in [(4, 64, false), (4, 32, true), (8, 64, true), (8, 96, false)] {
        let w = random(6, 160, gs, bits, perm);
        let deq = w.dequantize();
        let codes: std::collections::HashSet<u8> = (0..6).flat_map(|o| w.unpacked_row(o)).collect();
        assert_eq!(codes.len(), 1 << bits, "every code is exercised");
        for o in 0..6 {
            for i in 0..160 {
                let col = w.perm().map_or(i, |p| p[i] as usize);
                let want = formula(&w, o, i);
                assert_eq!(
                    deq[o * 160 + col].to_bits(),
                    want.to_bits(),
                    "{bits} [{o}, {i}]"
                );
            }
        }
        assert_eq!(w.dequantize_rows(2..4).unwrap(), deq[2 * 160..4 * 160]);
    }
}

#[test]
fn the_fused_dot_matches_float64_and_scalar_at_every_level() {
    for (bits, gs) in [(4, 64), (8, 64), (4, 160), (8, 32)] {
        let (out_feat, in_feat) = (4, 160);
        let w = random(out_feat, in_feat, gs, bits, false);
        let x = rand_vec(in_feat, 10);
        for level in available_levels() {
            let dots = Dots::at(level).unwrap();
            for r in 0..out_feat {
                let (mut exact, mut mag) = (0f64, 0f64);
                let q = w.unpacked_row(r);
                for i in 0..in_feat {
                    let g = r * w.groups() + i / gs;
                    let (s, z) = (half(w.scales()[g]) as f64, w.zeros()[g] as f64);
                    exact += s * (q[i] as f64 - z) * x[i] as f64;
                    mag += s.abs() * (q[i] as f64 + z) * (x[i] as f64).abs();
                }
                let bound = (in_feat + 3) as f64 * f32::EPSILON as f64 * mag;
                let got = w.dot_row(dots, r, &x) as f64;
                assert!((got - exact).abs() <= bound, "{bits} {level:?} row {r}");
                let scalar = w.dot_row(Dots::Scalar, r, &x) as f64;
                assert!(
                    (got - scalar).abs() <= 2.0 * bound,
                    "{bits} {level:?} vs scalar"
                );
            }
        }
    }
}

/// `dot_rows` (at AVX2 the shared multi-row kernel: four rows per pass,
/// then three, two or one; groups of one run, several, and a short last
/// group) on 1 to 11 rows from an offset, `x` of both signs: each output
/// within the bound of the float64 formula and of the scalar twin, at
/// every level.
#[test]
fn the_multi_row_dot_matches_float64_for_every_row_count() {
    for (bits, gs) in [(4, 32), (4, 64), (4, 96), (8, 64)] {
        let (out_feat, in_feat) = (13, 160);
        let w = random(out_feat, in_feat, gs, bits, false);
        let x: Vec<f32> = rand_vec(in_feat, 11)
            .iter()
            .map(|v| 4.0 * v - 2.0)
            .collect();
        for (r0, n) in crate::testutil::ROW_WINDOWS {
            for level in available_levels() {
                let dots = Dots::at(level).unwrap();
                let mut out = vec![f32::NAN; n];
                w.dot_rows(dots, r0, &x, &mut out);
                for (i, &got) in out.iter().enumerate() {
                    let r = r0 + i;
                    let (mut exact, mut mag) = (0f64, 0f64);
                    let q = w.unpacked_row(r);
                    for (j, &xj) in x.iter().enumerate() {
                        let g = r * w.groups() + j / gs;
                        let (s, z) = (half(w.scales()[g]) as f64, w.zeros()[g] as f64);
                        exact += s * (q[j] as f64 - z) * xj as f64;
                        mag += s.abs() * (q[j] as f64 + z) * (xj as f64).abs();
                    }
                    let bound = (in_feat + 3) as f64 * f32::EPSILON as f64 * mag;
                    let got = got as f64;
                    assert!(
                        (got - exact).abs() <= bound,
                        "{bits} gs {gs} {level:?} row {r}: {got} vs {exact} (bound {bound})"
                    );
                    let scalar = w.dot_row(Dots::Scalar, r, &x) as f64;
                    assert!((got - scalar).abs() <= 2.0 * bound);
                }
            }
        }
    }
}

/// The F16C pairs of the multi-row kernel's slots (`group_scales_padded`)
/// are the scalar `group_scales` bit for bit (subnormal and negative
/// halves, zero points 0, 15 and random) then zeros, on every row: those
/// that read on into the next row's halves and the last, which cannot;
/// 1, 3, 5 and 8 groups (slots of 8 and 16 floats).
#[cfg(target_arch = "x86_64")]
#[test]
fn padded_group_scales_are_the_scalar_pairs_then_zeros() {
    use crate::int4_asym::rows_avx2::GroupScales;
    for (in_feat, gs) in [(160, 160), (96, 32), (160, 32), (256, 32)] {
        let out_feat = 6;
        let w = random(out_feat, in_feat, gs, 4, false);
        let pairs = 2 * w.groups();
        let stride = pairs.next_multiple_of(8);
        for level in available_levels() {
            let dots = Dots::at(level).unwrap();
            for r in 0..out_feat {
                let mut want = vec![f32::NAN; pairs];
                w.group_scales(Dots::Scalar, r, &mut want);
                let mut slot = vec![0f32; stride];
                w.group_scales_padded(dots, r, pairs, &mut slot);
                let same = want
                    .iter()
                    .zip(&slot)
                    .all(|(a, b)| a.to_bits() == b.to_bits());
                assert!(same, "{level:?} in {in_feat} g{gs} row {r}");
                assert!(slot[pairs..].iter().all(|v| v.to_bits() == 0), "padding");
                for (g, p) in want.chunks_exact(2).enumerate() {
                    let (sh, z) = (
                        w.scales()[r * w.groups() + g],
                        w.zeros()[r * w.groups() + g],
                    );
                    let sv = half(sh);
                    assert_eq!(
                        (p[0].to_bits(), p[1].to_bits()),
                        (sv.to_bits(), (-(sv * f32::from(z))).to_bits())
                    );
                }
            }
        }
    }
}

#[test]
fn gather_and_scatter_follow_the_permutation() {
    let w = random(2, 64, 32, 4, true);
    let p = w.perm().unwrap().to_vec();
    let x: Vec<f32> = (0..128).map(|v| v as f32).collect();
    let xs = w.gather(&x);
    for b in 0..2 {
        for i in 0..64 {
            assert_eq!(xs[b * 64 + i], x[b * 64 + p[i] as usize]);
        }
    }
    let mut back = vec![0f32; 128];
    w.scatter(&xs, &mut back);
    assert_eq!(back, x);
}

#[test]
fn rtn_quantization_is_gptq_min_max() {
    let w = rand_vec(3 * 96, 4);
    for bits in [4, 8] {
        let q = quantize_rtn(&w, 3, 96, 32, bits).unwrap();
        let top = ((1u32 << bits) - 1) as f32;
        let deq = q.dequantize();
        for o in 0..3 {
            for g in 0..3 {
                let x = &w[o * 96 + g * 32..o * 96 + g * 32 + 32];
                let lo = x.iter().fold(0f32, |a, &v| a.min(v));
                let hi = x.iter().fold(0f32, |a, &v| a.max(v));
                let s = half(crate::ggml::f32_to_f16((hi - lo) / top));
                let z = (-lo / s).round().clamp(0.0, top);
                for (i, &v) in x.iter().enumerate() {
                    let c = ((v / s).round() + z).clamp(0.0, top);
                    assert_eq!(
                        deq[o * 96 + g * 32 + i],
                        s * (c - z),
                        "{bits} [{o}, {g}, {i}]"
                    );
                }
            }
        }
    }
}

#[test]
fn bad_parts_are_errors_naming_the_part() {
    let ok = |q: &[u8], s: Vec<u16>, z: Vec<u8>, p: Option<Vec<u32>>, bits| {
        ZpWeight::from_codes(q, parts(s, z, p, [1, 64], 32, bits))
    };
    let q = vec![3u8; 64];
    assert!(ok(&q, vec![0x3C00; 2], vec![8; 2], None, 4).is_ok());
    let cases: Vec<(crate::error::Result<ZpWeight>, &str)> = vec![
        (
            ok(&q, vec![0x7C00, 0], vec![8; 2], None, 4),
            "scales: row 0 group 0",
        ),
        (
            ok(&q, vec![0; 2], vec![8, 16], None, 4),
            "zeros[0, 1] is 16",
        ),
        (
            ok(&[16; 64], vec![0; 2], vec![8; 2], None, 4),
            "codes[0, 0] is 16",
        ),
        (ok(&q, vec![0; 3], vec![8; 2], None, 4), "scales"),
        (
            ok(&q, vec![0; 2], vec![8; 2], Some(vec![0; 64]), 4),
            "perm[1] is 0",
        ),
        (ok(&q, vec![0; 2], vec![8; 2], Some(vec![0; 3]), 4), "perm"),
        (ok(&q, vec![0; 2], vec![8; 2], None, 3), "bits"),
        (
            ZpWeight::from_codes(&q, parts(vec![0], vec![0], None, [1, 64], 48, 4)),
            "group_size",
        ),
        (
            ZpWeight::from_codes(&q[..48], parts(vec![0], vec![0], None, [1, 48], 32, 4)),
            "multiple of 32",
        ),
        (
            quantize_rtn(&[f32::NAN; 64], 1, 64, 32, 4),
            "weight[0] is not finite",
        ),
        (quantize_rtn(&[1e6; 64], 1, 64, 32, 4), "finite half"),
    ];
    for (r, want) in cases {
        let e = r.unwrap_err().to_string();
        assert!(e.contains(want), "{e} should name {want:?}");
    }
}

/// Every decode body (AVX2 where this CPU has it) gives the scalar
/// reference's floats bit for bit, `f32(s) * f32(q - z)` written out: 4-
/// and 8-bit codes (every value in every position), zero points 0, the
/// top code and random, halves of both signs (a subnormal among them),
/// groups of 32 to 128 with a short last group, spans cut mid-run.
#[test]
fn every_decode_body_is_the_scalar_one_bit_for_bit() {
    for bits in [4, 8] {
        for (out_feat, in_feat) in [(3, 32), (2, 160), (5, 576), (2, 1056)] {
            for gs in [32, 64, 96, 128] {
                let w = random(out_feat, in_feat, gs, bits, false);
                let groups = w.groups();
                for r in 0..out_feat {
                    let q = w.unpacked_row(r);
                    for (k0, n) in crate::int4_asym::tests::decode_spans(in_feat) {
                        let mut want = vec![f32::NAN; n];
                        w.decode_by(Decoder::Scalar, r, k0, &mut want);
                        for (j, v) in want.iter().enumerate() {
                            let (k, g) = (k0 + j, (k0 + j) / gs);
                            let z = i32::from(w.zeros()[r * groups + g]);
                            let e = half(w.scales()[r * groups + g]) * (i32::from(q[k]) - z) as f32;
                            assert_eq!(v.to_bits(), e.to_bits(), "{bits}-bit [{r}, {k}] g{gs}");
                        }
                        let what = format!("{bits}-bit [{out_feat}x{in_feat}] g{gs} r{r}");
                        Decoder::assert_all_give(
                            &want,
                            |dec, got| w.decode_by(dec, r, k0, got),
                            &what,
                        );
                    }
                }
            }
        }
    }
}
