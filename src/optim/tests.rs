//! Whole-step tests that need the engine's SIMD level: every available
//! level against the scalar twin, bit for bit (codes, scales and weights),
//! and the refusal of a level above the one in force.

use proptest::prelude::*;

use super::{
    Adam4bitOptimizerConfig, AdamW4bit, AdvancedQuantizationConfig, Optimizer, ParamMut,
    QuantizationMethod, StatefulOptimizer, VarianceMap,
};
use crate::simd::{self, SimdLevel};
use crate::testutil::xorshift_f32;

fn opt(q: AdvancedQuantizationConfig, wd: f32, level: SimdLevel) -> AdamW4bit {
    let o = Adam4bitOptimizerConfig {
        learning_rate: 1e-2,
        weight_decay: wd,
        ..Default::default()
    };
    let mut opt = AdamW4bit::with_quantization_config(o, q);
    opt.core.set_simd_level(level).unwrap();
    opt
}

/// The levels above scalar, or empty (with the reason printed) when only
/// the scalar twin would run.
fn simd_levels() -> Vec<SimdLevel> {
    let levels: Vec<SimdLevel> = simd::available_levels()
        .into_iter()
        .filter(|&l| l != SimdLevel::Scalar)
        .collect();
    if levels.is_empty() {
        eprintln!("skipped: no SIMD level in force, only the scalar twin would run");
    }
    levels
}

fn run(o: &mut AdamW4bit, shape: &[usize], steps: usize, seed: u64) -> Vec<f32> {
    let n: usize = shape.iter().product();
    let mut w = xorshift_f32(seed, n, 1.0);
    for s in 0..steps {
        let mut g = xorshift_f32(seed + 1 + s as u64, n, 0.1);
        // Zeros, a constant run and tiny values in every step.
        for (i, x) in g.iter_mut().enumerate() {
            if i % 7 == 0 {
                *x = 0.0;
            } else if i % 11 == 0 {
                *x = 1e-30;
            }
        }
        let p = ParamMut {
            name: Some("w"),
            shape,
            data: &mut w,
        };
        o.update_param(p, &g).unwrap();
        o.step();
    }
    w
}

fn configs() -> Vec<AdvancedQuantizationConfig> {
    let mut out = Vec::new();
    for method in QuantizationMethod::ALL {
        for map in VarianceMap::ALL {
            for (bs, dq) in [(64, true), (18, false), (2, true), (128, false)] {
                out.push(AdvancedQuantizationConfig {
                    method,
                    variance_map: map,
                    block_size: bs,
                    double_quantization: dq,
                    ..Default::default()
                });
            }
        }
    }
    out
}

#[test]
fn set_simd_level_above_the_one_in_force_is_an_error() {
    let mut o = AdamW4bit::new(1e-3, 0.9, 0.999, 1e-8, 0.0);
    for level in [SimdLevel::Neon, SimdLevel::Avx2, SimdLevel::Avx512] {
        let ok = simd::available_levels().contains(&level);
        assert_eq!(o.core.set_simd_level(level).is_ok(), ok, "{level:?}");
    }
    assert!(o.core.set_simd_level(SimdLevel::Scalar).is_ok());
}

#[test]
fn simd_matches_scalar_bit_for_bit() {
    let levels = simd_levels();
    if levels.is_empty() {
        return;
    }
    for q in configs() {
        for shape in [vec![1usize], vec![37], vec![3, 100], vec![70_001]] {
            let mut o0 = opt(q, 0.01, SimdLevel::Scalar);
            let w0 = run(&mut o0, &shape, 3, 5);
            let s0 = o0.state_dict().unwrap();
            for &level in &levels {
                let mut o = opt(q, 0.01, level);
                let w = run(&mut o, &shape, 3, 5);
                assert_eq!(
                    w.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
                    w0.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
                    "{level:?} {q:?} {shape:?}"
                );
                assert_eq!(o.state_dict().unwrap(), s0, "{level:?} {q:?} {shape:?}");
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]
    #[test]
    fn prop_simd_matches_scalar_and_stays_finite(
        n in 1usize..600,
        bs in prop::sample::select(vec![2usize, 16, 32, 64, 66]),
        scale in prop::sample::select(vec![0.0f32, 1e-38, 1e-20, 1e-3, 1.0, 1e6]),
        seed in 0u64..1000,
    ) {
        let q = AdvancedQuantizationConfig { block_size: bs, ..Default::default() };
        let mut outs = Vec::new();
        for level in simd::available_levels() {
            let mut o = opt(q, 0.0, level);
            let mut w = xorshift_f32(seed, n, 1.0);
            for s in 0..3u64 {
                let mut g = xorshift_f32(seed * 31 + s, n, scale);
                if n > 2 { g[1] = -0.0; g[2] = g[0]; }
                o.update_param(ParamMut { name: None, shape: &[n], data: &mut w }, &g).unwrap();
                o.step();
            }
            prop_assert!(w.iter().all(|x| x.is_finite()));
            outs.push((w, o.state_dict().unwrap()));
        }
        for x in &outs[1..] {
            prop_assert_eq!(x, &outs[0]);
        }
    }
}
