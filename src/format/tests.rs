//! The registry lists each format once, and every registered format's
//! scalar reference round-trips against a formula written out here
//! independently of the format's code.

use std::collections::HashSet;

use super::*;
use crate::testutil::rand_vec;

#[test]
fn the_registry_lists_each_format_once_with_distinct_names_and_tags() {
    let ids: HashSet<FormatId> = FormatId::ALL.iter().copied().collect();
    assert_eq!(ids.len(), FormatId::ALL.len());
    let mut names = HashSet::new();
    let mut tags = HashSet::new();
    let mut layers = HashSet::new();
    for &id in FormatId::ALL {
        let info = id.info();
        for n in std::iter::once(&info.name).chain(info.aliases) {
            assert!(names.insert(*n), "{n} registered twice");
            assert_eq!(FormatId::parse(&n.to_uppercase()), Some(id));
        }
        assert!(tags.insert(info.serde_tag), "tag {} twice", info.serde_tag);
        assert!(layers.insert(info.layer_name));
        assert_eq!(FormatId::from_serde_tag(info.serde_tag), Some(id));
        assert_eq!(
            FormatId::serde_name_of(info.serde_tag),
            Some(info.serde_name)
        );
    }
    assert_eq!(FormatId::parse("no-such-format"), None);
    assert_eq!(FormatId::from_serde_tag(0), None);
}

#[test]
fn the_layer_names_derive_from_the_registry() {
    use crate::linear::{IsqType, WeightDType};
    for (d, id) in [
        (WeightDType::F32, FormatId::Float32),
        (WeightDType::I8, FormatId::Int8),
        (WeightDType::I4, FormatId::Int4),
        (WeightDType::F8E4M3, FormatId::Fp8E4M3),
    ] {
        assert_eq!(d.format(), id);
        assert_eq!(d.name(), id.info().dtype_name);
    }
    assert_eq!(
        IsqType::parse("Q4", 64),
        Some(IsqType::Int4 { group_size: 64 })
    );
    assert_eq!(IsqType::parse("float8_e4m3fn", 32), Some(IsqType::Fp8E4M3));
    assert_eq!(
        IsqType::parse("int8", 32).map(IsqType::format),
        Some(FormatId::Int8)
    );
    assert_eq!(IsqType::parse("float32", 32), None);
}

/// `round(v)` ties to even, in f64 (exact for these magnitudes).
fn round_even(v: f64) -> f64 {
    let r = v.round();
    if (v - v.trunc()).abs() == 0.5 && r % 2.0 != 0.0 {
        r - v.signum()
    } else {
        r
    }
}

/// `v` rounded to the nearest half and back (the halves int4_asym and int4_k
/// store).
fn half_round(v: f32) -> f32 {
    crate::linear::fp8_dialect::f16_to_f32(crate::ggml::f32_to_f16(v))
}

/// `(max - min) / 15` and `-min` of a group's range widened to include 0
/// (int4_k's group grid before its 6-bit codes).
fn k_group_range(xs: &[f32]) -> (f32, f32) {
    let lo = xs.iter().fold(0f32, |a, &v| a.min(v));
    let hi = xs.iter().fold(lo, |a, &v| a.max(v));
    ((hi - lo) / 15.0, -lo)
}

#[test]
fn every_format_round_trips_against_its_formula() {
    let out = 5usize;
    for &id in FormatId::ALL {
        // int4_asym and int4_k take inputs in runs of 32: 544 gives int4_asym
        // group 64 a shorter last group, 512 gives int4_k two super-blocks.
        let inf = match id {
            FormatId::Int4Asym => 544,
            FormatId::Int4K => 512,
            _ => 40,
        };
        let w: Vec<f32> = rand_vec(out * inf, 7).iter().map(|v| 3.0 * v).collect();
        let (deq, shape): (Vec<f32>, [usize; 2]) = match id {
            FormatId::Float32 => {
                let q = Float32::quantize(&w, out, inf, ()).unwrap();
                (Float32::dequantize(&q), Float32::shape(&q))
            }
            FormatId::Int8 => {
                let q = Int8::quantize(&w, out, inf, ()).unwrap();
                (Int8::dequantize(&q), Int8::shape(&q))
            }
            FormatId::Int4 => {
                let q = Int4::quantize(&w, out, inf, 16).unwrap();
                assert_eq!(Int4::params(&q), 16);
                (Int4::dequantize(&q), Int4::shape(&q))
            }
            FormatId::Fp8E4M3 => {
                let q = Fp8E4M3::quantize(&w, out, inf, ()).unwrap();
                (Fp8E4M3::dequantize(&q), Fp8E4M3::shape(&q))
            }
            FormatId::Int4Asym => {
                let q = Int4Asym::quantize(&w, out, inf, 64).unwrap();
                (Int4Asym::dequantize(&q), Int4Asym::shape(&q))
            }
            FormatId::Int4K => {
                let q = Int4K::quantize(&w, out, inf, ()).unwrap();
                (Int4K::dequantize(&q), Int4K::shape(&q))
            }
            FormatId::TestSign8 => {
                let q = types::TestSign8::quantize(&w, out, inf, ()).unwrap();
                (
                    types::TestSign8::dequantize(&q),
                    types::TestSign8::shape(&q),
                )
            }
            // The GGUF block types: `crate::ggml`'s tests and gguf_tests.rs.
            _ => continue,
        };
        let mean_abs = (w.iter().map(|v| v.abs() as f64).sum::<f64>() / w.len() as f64) as f32;
        assert_eq!(shape, [out, inf], "{id:?}");
        let fp8_max = 448.0f64;
        let tensor_absmax = w.iter().fold(0f64, |m, v| m.max(v.abs() as f64));
        for o in 0..out {
            let row = &w[o * inf..(o + 1) * inf];
            let row_absmax = row.iter().fold(0f64, |m, v| m.max(v.abs() as f64));
            for i in 0..inf {
                let v = row[i] as f64;
                let got = deq[o * inf + i] as f64;
                match id {
                    FormatId::Float32 => assert_eq!(got, v),
                    FormatId::Int8 => {
                        let s = (row_absmax as f32 / 127.0) as f64;
                        let q = round_even(v / s).clamp(-127.0, 127.0);
                        assert_eq!(got, ((q as f32) * s as f32) as f64, "int8 [{o}, {i}]");
                    }
                    FormatId::Int4 => {
                        let g = i / 16;
                        let gmax = row[g * 16..((g + 1) * 16).min(inf)]
                            .iter()
                            .fold(0f32, |m, v| m.max(v.abs()));
                        let s = (gmax / 7.0).max(crate::int4::MIN_SCALE);
                        let q = round_even((row[i] / s) as f64).clamp(-8.0, 7.0);
                        assert_eq!(got, ((q as f32) * s) as f64, "int4 [{o}, {i}]");
                    }
                    FormatId::Int4Asym => {
                        // "rtn": d = (max - min) / 15 and m = min as halves,
                        // q = clamp(round((w - m) / d)), w = d q + m.
                        let g0 = i / 64 * 64;
                        let xs = &row[g0..(g0 + 64).min(inf)];
                        let lo = xs.iter().fold(f32::INFINITY, |a, &v| a.min(v));
                        let hi = xs.iter().fold(f32::NEG_INFINITY, |a, &v| a.max(v));
                        let (d, m) = (half_round((hi - lo) / 15.0), half_round(lo));
                        let id = if d == 0.0 { 0.0 } else { 1.0 / d };
                        let q = ((row[i] - m) * id).round().clamp(0.0, 15.0);
                        assert_eq!(got, (d * q + m) as f64, "int4_asym [{o}, {i}]");
                    }
                    FormatId::Int4K => {
                        // "rtn": per super-block of 256, D = max d / 63 and
                        // Dmin = max m / 63 as halves over its groups' ranges;
                        // per group the nearest 6-bit codes, then the nearest
                        // 4-bit code of w on (D sc) q - Dmin mn.
                        let s0 = i / 256 * 256;
                        let (mut dmax, mut mmax) = (0f32, 0f32);
                        for g0 in (s0..s0 + 256).step_by(32) {
                            let (d, m) = k_group_range(&row[g0..g0 + 32]);
                            dmax = dmax.max(d);
                            mmax = mmax.max(m);
                        }
                        let (big_d, big_m) = (half_round(dmax / 63.0), half_round(mmax / 63.0));
                        let code = |v: f32, unit: f32| {
                            if unit > 0.0 {
                                (v / unit).round().clamp(0.0, 63.0)
                            } else {
                                0.0
                            }
                        };
                        let g0 = i / 32 * 32;
                        let (d, m) = k_group_range(&row[g0..g0 + 32]);
                        let (dg, mg) = (big_d * code(d, big_d), big_m * code(m, big_m));
                        let id = if dg == 0.0 { 0.0 } else { 1.0 / dg };
                        let q = ((row[i] + mg) * id).round().clamp(0.0, 15.0);
                        assert_eq!(got, (dg * q - mg) as f64, "int4_k [{o}, {i}]");
                    }
                    FormatId::Fp8E4M3 => {
                        // Within half an E4M3 step (3 mantissa bits) of
                        // the value, in units of the per-tensor scale.
                        let s = tensor_absmax / fp8_max;
                        let rel = (got - v).abs() / s;
                        let step = (v.abs() / s).max(2f64.powi(-6)).log2().floor();
                        assert!(
                            rel <= 2f64.powf(step - 3.0) * 0.5 + 1e-6,
                            "fp8 [{o}, {i}] v {v} got {got} s {s} rel {rel} step {step}"
                        );
                    }
                    FormatId::TestSign8 => {
                        let want = if v == 0.0 {
                            0.0
                        } else {
                            v.signum() as f32 * mean_abs
                        };
                        assert_eq!(got, want as f64, "sign8 [{o}, {i}]");
                    }
                    _ => unreachable!("skipped above"),
                }
            }
        }
    }
}

#[test]
fn blocks_count_bits_per_weight_with_scales() {
    assert_eq!(Int4::block(32, 64).unwrap().bits_per_weight(), 5.0);
    assert_eq!(Int4::block(128, 100).unwrap().elems, 100);
    assert_eq!(Int8::block((), 64).unwrap().bits_per_weight(), 8.5);
    assert_eq!(Float32::block((), 64).unwrap().bits_per_weight(), 32.0);
    assert_eq!(Fp8E4M3::block((), 64).unwrap().bits_per_weight(), 8.0);
    assert!(Int4::block(3, 64).is_err());
}

#[test]
fn int8_activation_paths_are_where_the_registry_says() {
    let x = rand_vec(64, 3);
    let w = rand_vec(2 * 64, 4);
    let q8 = Int8::quantize(&w, 2, 64, ()).unwrap();
    let mut y = vec![0f32; 2];
    assert!(Int8::matmul_int8_activations(&q8, &x, 1, &mut y).is_err());
    let q4 = Int4::quantize(&w, 2, 64, 32).unwrap();
    Int4::matmul_int8_activations(&q4, &x, 1, &mut y).unwrap();
    let with_a8: Vec<FormatId> = FormatId::ALL
        .iter()
        .copied()
        .filter(|id| id.info().int8_activations)
        .collect();
    assert!(with_a8.contains(&FormatId::Int4) && !with_a8.contains(&FormatId::Int8));
}

#[cfg(feature = "gpu")]
#[test]
fn gpu_kernel_names_exist_in_the_nvrtc_sources() {
    for &id in FormatId::ALL {
        if let Some(g) = id.info().gpu {
            let src = crate::gpu::nvrtc::SOURCES
                .iter()
                .find(|s| s.name == g.source)
                .unwrap_or_else(|| panic!("{id:?}: no source {}", g.source));
            for k in g.kernels {
                assert!(src.kernels.contains(k), "{id:?}: {k} not in {}", g.source);
            }
        }
    }
}
