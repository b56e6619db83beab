//! Integration tests of the 4-bit optimizers: SIMD vs scalar (bit for bit),
//! thread-count independence, the seed's vectors, checkpoints, bad input.

use proptest::prelude::*;
use quantrs::optim::{
    Adam4bit, Adam4bitOptimizerConfig, AdamW4bit, AdvancedQuantizationConfig, Optimizer, ParamMut,
    QuantizationMethod, StatefulOptimizer, VarianceMap,
};
use quantrs::simd::{self, SimdLevel};

fn rng_vec(seed: u64, n: usize, scale: f32) -> Vec<f32> {
    // xorshift: deterministic without a dependency.
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            ((s >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0) * scale
        })
        .collect()
}

fn opt(q: AdvancedQuantizationConfig, wd: f32) -> AdamW4bit {
    let o = Adam4bitOptimizerConfig {
        learning_rate: 1e-2,
        weight_decay: wd,
        ..Default::default()
    };
    AdamW4bit::with_quantization_config(o, q).unwrap()
}

fn run(o: &mut AdamW4bit, shape: &[usize], steps: usize, seed: u64) -> Vec<f32> {
    let n: usize = shape.iter().product();
    let mut w = rng_vec(seed, n, 1.0);
    for s in 0..steps {
        let mut g = rng_vec(seed + 1 + s as u64, n, 0.1);
        // Zeros, a constant run and tiny values in every step.
        for (i, x) in g.iter_mut().enumerate() {
            if i % 7 == 0 {
                *x = 0.0;
            } else if i % 11 == 0 {
                *x = 1e-30;
            }
        }
        o.update(
            ParamMut {
                name: Some("w"),
                shape,
                data: &mut w,
            },
            &g,
        )
        .unwrap();
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
fn simd_matches_scalar_bit_for_bit() {
    let levels = simd::available_levels();
    for q in configs() {
        for shape in [vec![1usize], vec![37], vec![3, 100], vec![70_001]] {
            let mut results = Vec::new();
            for &level in &levels {
                let mut o = opt(q, 0.01);
                o.core.set_simd_level(level);
                let w = run(&mut o, &shape, 3, 5);
                results.push((level, w, o.state_dict().unwrap()));
            }
            let (l0, w0, s0) = &results[0];
            assert_eq!(*l0, SimdLevel::Scalar);
            for (l, w, s) in &results[1..] {
                assert_eq!(
                    w.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
                    w0.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
                    "{l:?} {q:?} {shape:?}"
                );
                assert_eq!(s, s0, "{l:?} {q:?} {shape:?}");
            }
        }
    }
}

#[test]
fn independent_of_thread_count() {
    let q = AdvancedQuantizationConfig::default();
    let shape = [300_000usize];
    let mut outs = Vec::new();
    for threads in [1, 2, 3] {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .unwrap();
        outs.push(pool.install(|| {
            let mut o = opt(q, 0.0);
            let w = run(&mut o, &shape, 2, 9);
            (w, o.state_dict().unwrap())
        }));
    }
    assert!(outs.windows(2).all(|p| p[0] == p[1]));
}

#[test]
fn seed_vector_decay_only() {
    let mut o = AdamW4bit::new(0.1, 0.9, 0.999, 1e-8, 0.5).unwrap();
    let mut w = [10.0f32];
    o.update(
        ParamMut {
            name: None,
            shape: &[1],
            data: &mut w,
        },
        &[0.0],
    )
    .unwrap();
    assert_eq!(w[0], 9.5);
}

#[test]
fn one_element_is_lossless() {
    // One element: every block's absmax is the element itself, so m and v
    // come back exactly and the run equals float32 Adam.
    for map in [VarianceMap::Linear, VarianceMap::Log] {
        let q = AdvancedQuantizationConfig {
            variance_map: map,
            ..Default::default()
        };
        let mut o = opt(q, 0.0);
        let (mut m, mut v, mut wf) = (0f32, 0f32, 0.5f32);
        let mut w = [0.5f32];
        for t in 1..=50u64 {
            let g = ((t as f32) * 0.7).sin() * 0.3;
            o.update(
                ParamMut {
                    name: Some("x"),
                    shape: &[1],
                    data: &mut w,
                },
                &[g],
            )
            .unwrap();
            o.step();
            let k = quantrs::optim::kernel::StepConsts::new(1e-2, 0.9, 0.999, 1e-8, 0.0, true, t);
            let (w2, m2, v2, _) = k.element(wf, g, m, v);
            (wf, m, v) = (w2, m2, v2);
            assert_eq!(w[0], wf, "{map:?} step {t}");
        }
    }
}

#[test]
fn zero_grad_elements_never_move() {
    let mut o = opt(AdvancedQuantizationConfig::default(), 0.0);
    let n = 1000;
    let mut w = rng_vec(3, n, 1.0);
    let w0 = w.clone();
    for s in 0..300 {
        let mut g = rng_vec(100 + s, n, 1.0);
        for x in g.iter_mut().step_by(3) {
            *x = 0.0;
        }
        o.update(
            ParamMut {
                name: None,
                shape: &[n],
                data: &mut w,
            },
            &g,
        )
        .unwrap();
        o.step();
    }
    for i in 0..n {
        if i % 3 == 0 {
            assert_eq!(w[i].to_bits(), w0[i].to_bits());
        } else {
            assert_ne!(w[i], w0[i]);
        }
    }
}

#[test]
fn checkpoint_restore_continues_bit_identically() {
    for q in [
        AdvancedQuantizationConfig::default(),
        AdvancedQuantizationConfig {
            rank1_normalization: true,
            method: QuantizationMethod::Int8,
            double_quantization: false,
            ..Default::default()
        },
    ] {
        let shape = [40usize, 50];
        let mut a = opt(q, 0.1);
        let w_mid = run(&mut a, &shape, 5, 1);
        let dir = std::env::temp_dir().join(format!("quantrs-optim-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("state.safetensors");
        a.save_state(&path).unwrap();
        let mut b = opt(AdvancedQuantizationConfig::default(), 0.0);
        b.load_state(&path).unwrap();
        assert_eq!(b.state(), a.state());
        assert_eq!(b.config(), a.config());
        let (mut wa, mut wb) = (w_mid.clone(), w_mid);
        for s in 0..4 {
            let g = rng_vec(77 + s, 2000, 0.2);
            for (o, w) in [(&mut a, &mut wa), (&mut b, &mut wb)] {
                o.update(
                    ParamMut {
                        name: Some("w"),
                        shape: &shape,
                        data: w,
                    },
                    &g,
                )
                .unwrap();
                o.step();
            }
        }
        assert_eq!(wa, wb);
        assert_eq!(a.state_dict().unwrap(), b.state_dict().unwrap());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

#[test]
fn corrupted_state_is_rejected_and_changes_nothing() {
    let mut a = opt(AdvancedQuantizationConfig::default(), 0.0);
    run(&mut a, &[500], 3, 2);
    let bytes = quantrs::optim::checkpoint::to_bytes(&a.core).unwrap();
    let mut b = opt(AdvancedQuantizationConfig::default(), 0.0);
    run(&mut b, &[300], 2, 4);
    let before = b.state_dict().unwrap();
    for cut in [0, 8, bytes.len() / 2, bytes.len() - 1] {
        assert!(quantrs::optim::checkpoint::from_bytes(&mut b.core, &bytes[..cut]).is_err());
    }
    for pos in [bytes.len() - 1, bytes.len() - 300, bytes.len() / 2] {
        let mut bad = bytes.clone();
        bad[pos] ^= 0x10;
        assert!(quantrs::optim::checkpoint::from_bytes(&mut b.core, &bad).is_err());
    }
    assert_eq!(b.state_dict().unwrap(), before);
    // An AdamW state does not load into Adam.
    let mut c = Adam4bit::new(1e-3, 0.9, 0.999, 1e-8, 0.0).unwrap();
    assert!(quantrs::optim::checkpoint::from_bytes(&mut c.core, &bytes).is_err());
    quantrs::optim::checkpoint::from_bytes(&mut b.core, &bytes).unwrap();
    assert_eq!(b.state(), a.state());
}

#[test]
fn bad_config_and_input_rejected() {
    assert!(AdamW4bit::new(f32::NAN, 0.9, 0.999, 1e-8, 0.0).is_err());
    assert!(AdamW4bit::new(1e-3, 1.0, 0.999, 1e-8, 0.0).is_err());
    assert!(AdamW4bit::new(1e-3, 0.9, -0.1, 1e-8, 0.0).is_err());
    for bs in [0, 3, 1 << 20] {
        let q = AdvancedQuantizationConfig {
            block_size: bs,
            ..Default::default()
        };
        assert!(AdamW4bit::with_quantization_config(Default::default(), q).is_err());
    }
    let q = AdvancedQuantizationConfig {
        adaptation_rate: 0.5,
        ..Default::default()
    };
    assert!(AdamW4bit::with_quantization_config(Default::default(), q).is_err());
    let mut o = opt(AdvancedQuantizationConfig::default(), 0.0);
    let mut w = vec![1.0f32; 10];
    let p = |w: &mut Vec<f32>| -> Vec<f32> { w.clone() };
    let mut g = vec![0.1f32; 10];
    g[3] = f32::NAN;
    let before = p(&mut w);
    let shape = [10usize];
    assert!(o
        .update(
            ParamMut {
                name: None,
                shape: &shape,
                data: &mut w
            },
            &g
        )
        .is_err());
    assert!(o
        .update(
            ParamMut {
                name: None,
                shape: &shape,
                data: &mut w
            },
            &g[..9]
        )
        .is_err());
    assert_eq!(w, before);
    assert_eq!(o.num_parameters(), 0);
    assert!(o.set_lr(-1.0).is_err());
}

#[test]
fn memory_is_about_one_byte_per_parameter() {
    let mut o = opt(AdvancedQuantizationConfig::default(), 0.0);
    run(&mut o, &[1 << 20], 1, 3);
    let m = o.memory_usage();
    let per = m.total_bytes as f64 / m.num_parameters as f64;
    assert!(per <= 1.05, "{per}");
    assert!((o.memory_savings() as f64 - (1.0 - per / 8.0)).abs() < 1e-6);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]
    #[test]
    fn prop_simd_scalar_and_finite(
        n in 1usize..600,
        bs in prop::sample::select(vec![2usize, 16, 32, 64, 66]),
        scale in prop::sample::select(vec![0.0f32, 1e-38, 1e-20, 1e-3, 1.0, 1e6]),
        seed in 0u64..1000,
    ) {
        let q = AdvancedQuantizationConfig { block_size: bs, ..Default::default() };
        let levels = simd::available_levels();
        let mut outs = Vec::new();
        for &level in &levels {
            let mut o = opt(q, 0.0);
            o.core.set_simd_level(level);
            let mut w = rng_vec(seed, n, 1.0);
            for s in 0..3u64 {
                let mut g = rng_vec(seed * 31 + s, n, scale);
                if n > 2 { g[1] = -0.0; g[2] = g[0]; }
                o.update(ParamMut { name: None, shape: &[n], data: &mut w }, &g).unwrap();
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

#[test]
fn all_finite_every_level_agrees() {
    for level in simd::available_levels() {
        for n in [0usize, 1, 15, 16, 17, 100] {
            let x = rng_vec(n as u64, n, 1e30);
            assert!(quantrs::optim::kernel::all_finite(level, &x));
            for pos in 0..n {
                for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
                    let mut y = x.clone();
                    y[pos] = bad;
                    assert!(
                        !quantrs::optim::kernel::all_finite(level, &y),
                        "{level:?} {n} {pos}"
                    );
                }
            }
        }
    }
}

#[test]
fn pass2_codes_agree_at_midpoints_and_extremes() {
    use quantrs::optim::codebook::{Codebook16, NF4};
    use quantrs::optim::kernel::{pass2, Codecs, MCodec, Pass2, VScale};
    // Every midpoint, its f32 neighbours, the code values, 0, -0, huge, subnormal.
    for map in VarianceMap::ALL {
        let c = Codecs {
            m: MCodec::Four(Codebook16::new(NF4)),
            v: Codebook16::new(map.table()),
            sqrt_domain: map.sqrt_domain(),
        };
        let mut xs = vec![0.0f32, -0.0, 1e-45, 1e-38, 1.0, 2.0, 1e30, f32::MAX];
        for k in 0..16 {
            for base in [c.v.mids[k], c.v.values[k], c.v.mids[k] * 16.0] {
                if base.is_finite() {
                    xs.extend([
                        base,
                        f32::from_bits(base.to_bits() + 1),
                        f32::from_bits(base.to_bits() - 1),
                    ]);
                }
            }
        }
        let neg: Vec<f32> = xs.iter().map(|x| -x).collect();
        xs.extend(neg);
        xs.resize(xs.len().next_multiple_of(64), 0.5);
        let n = xs.len();
        let inv = vec![1.0f32; n / 64];
        let mut outs = Vec::new();
        for level in simd::available_levels() {
            let (mut mc, mut vc) = (vec![0u8; n / 2], vec![0u8; n / 2]);
            pass2(
                level,
                &c,
                64,
                Pass2 {
                    sm: &xs,
                    su: &xs,
                    m_inv: &inv,
                    v_inv: VScale::Block(&inv),
                    m_codes: &mut mc,
                    v_codes: &mut vc,
                },
            );
            outs.push((mc, vc));
        }
        assert!(outs.windows(2).all(|w| w[0] == w[1]), "{map:?}");
    }
}
