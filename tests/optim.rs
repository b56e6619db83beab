//! Integration tests of the 4-bit optimizers through the public API:
//! thread-count independence, the reference vectors, float32 Adam on one
//! element, checkpoints, bad input. (SIMD against the scalar twin is tested
//! inside the crate, in `src/optim/tests.rs` and `src/optim/dispatch.rs`.)

use quantrs::optim::{
    Adam4bit, Adam4bitOptimizerConfig, AdamW4bit, AdvancedQuantizationConfig, Optimizer, ParamMut,
    QuantizationMethod, StatefulOptimizer, VarianceMap,
};

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
    AdamW4bit::with_quantization_config(o, q)
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
        o.update_param(
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
    let mut o = AdamW4bit::new(0.1, 0.9, 0.999, 1e-8, 0.5);
    let mut w = [10.0f32];
    o.update_param(
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

/// Float32 Adam (no decay, lr 1e-2, betas (0.9, 0.999), eps 1e-8) at step
/// `t`, in the operation order of docs/optim.md: bias corrections in f64,
/// `sqrt(v) / sqrt(1 - b2^t) + eps` in f32.
fn adam_f32(w: f32, g: f32, m: f32, v: f32, t: u64) -> (f32, f32, f32) {
    let (lr, b1, b2, eps) = (1e-2f32, 0.9f32, 0.999f32, 1e-8f32);
    let bc1 = 1.0 - (b1 as f64).powi(t as i32);
    let bc2 = 1.0 - (b2 as f64).powi(t as i32);
    let (step, isb2) = ((lr as f64 / bc1) as f32, (1.0 / bc2.sqrt()) as f32);
    let m = b1 * m + (1.0 - b1) * g;
    let v = b2 * v + (1.0 - b2) * (g * g);
    let w = (w - 0.0 * w) - (step * m) / (v.sqrt() * isb2 + eps);
    (w, m, v)
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
            o.update_param(
                ParamMut {
                    name: Some("x"),
                    shape: &[1],
                    data: &mut w,
                },
                &[g],
            )
            .unwrap();
            o.step();
            (wf, m, v) = adam_f32(wf, g, m, v, t);
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
        o.update_param(
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
                o.update_param(
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
    let dir = std::env::temp_dir().join(format!("quantrs-optim-bad-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("state.safetensors");
    let mut a = opt(AdvancedQuantizationConfig::default(), 0.0);
    run(&mut a, &[500], 3, 2);
    a.save_state(&path).unwrap();
    let bytes = std::fs::read(&path).unwrap();
    let mut b = opt(AdvancedQuantizationConfig::default(), 0.0);
    run(&mut b, &[300], 2, 4);
    let before = b.state_dict().unwrap();
    let load = |b: &mut AdamW4bit, data: &[u8]| {
        std::fs::write(&path, data).unwrap();
        b.load_state(&path)
    };
    for cut in [0, 8, bytes.len() / 2, bytes.len() - 1] {
        assert!(load(&mut b, &bytes[..cut]).is_err());
    }
    for pos in [bytes.len() - 1, bytes.len() - 300, bytes.len() / 2] {
        let mut bad = bytes.clone();
        bad[pos] ^= 0x10;
        assert!(load(&mut b, &bad).is_err());
    }
    assert_eq!(b.state_dict().unwrap(), before);
    // An AdamW state does not load into Adam.
    let mut c = Adam4bit::new(1e-3, 0.9, 0.999, 1e-8, 0.0);
    std::fs::write(&path, &bytes).unwrap();
    assert!(c.load_state(&path).is_err());
    load(&mut b, &bytes).unwrap();
    assert_eq!(b.state(), a.state());
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn bad_config_and_input_rejected() {
    assert!(AdamW4bit::try_new(f32::NAN, 0.9, 0.999, 1e-8, 0.0).is_err());
    assert!(AdamW4bit::try_new(1e-3, 1.0, 0.999, 1e-8, 0.0).is_err());
    assert!(AdamW4bit::try_new(1e-3, 0.9, -0.1, 1e-8, 0.0).is_err());
    for bs in [0, 3, 1 << 20] {
        let q = AdvancedQuantizationConfig {
            block_size: bs,
            ..Default::default()
        };
        assert!(AdamW4bit::try_with_quantization_config(Default::default(), q).is_err());
    }
    let q = AdvancedQuantizationConfig {
        adaptation_rate: 0.5,
        ..Default::default()
    };
    assert!(AdamW4bit::try_with_quantization_config(Default::default(), q).is_err());
    let mut o = opt(AdvancedQuantizationConfig::default(), 0.0);
    let mut w = vec![1.0f32; 10];
    let p = |w: &mut Vec<f32>| -> Vec<f32> { w.clone() };
    let mut g = vec![0.1f32; 10];
    g[3] = f32::NAN;
    let before = p(&mut w);
    let shape = [10usize];
    assert!(o
        .update_param(
            ParamMut {
                name: None,
                shape: &shape,
                data: &mut w
            },
            &g
        )
        .is_err());
    assert!(o
        .update_param(
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
    assert!(o.try_set_lr(-1.0).is_err());
    // The infallible form keeps it, and the next update reports it.
    o.set_lr(-1.0);
    assert_eq!(o.get_lr(), -1.0);
    let g = vec![0.1f32; 10];
    let err = o
        .update_param(
            ParamMut {
                name: None,
                shape: &shape,
                data: &mut w,
            },
            &g,
        )
        .unwrap_err();
    assert!(err.to_string().contains("learning_rate"), "{err}");
    assert_eq!(w, before);
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

/// One optimizer per parameter, stepped either one `update_param` + `step`
/// at a time or all at once through `optim::step_all`.
fn named<'a>(shape: &'a [usize], data: &'a mut [f32]) -> ParamMut<'a> {
    ParamMut {
        name: Some("w"),
        shape,
        data,
    }
}

type ItemOf<O> = for<'a> fn(&'a mut O, ParamMut<'a>, &'a [f32]) -> quantrs::optim::StepItem<'a>;

fn step_many<O>(
    opts: &mut [O],
    ws: &mut [Vec<f32>],
    grads: &[Vec<f32>],
    shapes: &[[usize; 1]],
    item: ItemOf<O>,
) -> Result<(), usize> {
    let mut items: Vec<_> = opts
        .iter_mut()
        .zip(ws.iter_mut())
        .zip(grads)
        .zip(shapes)
        .map(|(((o, w), g), s)| item(o, named(s, w), g))
        .collect();
    quantrs::optim::step_all(&mut items).map_err(|(i, _)| i)
}

fn step_each<O: Optimizer>(
    opts: &mut [O],
    ws: &mut [Vec<f32>],
    grads: &[Vec<f32>],
    shapes: &[[usize; 1]],
    update: fn(&mut O, ParamMut<'_>, &[f32]) -> quantrs::Result<()>,
) {
    for (((o, w), g), s) in opts.iter_mut().zip(ws.iter_mut()).zip(grads).zip(shapes) {
        update(o, named(s, w), g).unwrap();
        o.step();
    }
}

/// `optim::step_all` over a list of (optimizer, parameter) pairs gives the
/// bits of one `update_param` + `step` per pair, for both decay rules and
/// sizes around the 256-block group boundary; a bad pair changes nothing.
#[test]
fn step_all_equals_one_update_per_parameter() {
    use quantrs::optim::StepItem;
    let sizes = [768usize, 2, 16384 + 64, 130];
    let shapes: Vec<[usize; 1]> = sizes.iter().map(|&n| [n]).collect();
    let w0: Vec<Vec<f32>> = sizes
        .iter()
        .enumerate()
        .map(|(i, &n)| rng_vec(i as u64 + 1, n, 1.0))
        .collect();
    let gs: Vec<Vec<f32>> = sizes
        .iter()
        .enumerate()
        .map(|(i, &n)| rng_vec(i as u64 + 50, n, 0.01))
        .collect();
    let adamw = || -> Vec<AdamW4bit> {
        sizes
            .iter()
            .map(|_| AdamW4bit::new(1e-3, 0.9, 0.999, 1e-8, 0.01))
            .collect()
    };
    let adam = || -> Vec<Adam4bit> {
        sizes
            .iter()
            .map(|_| Adam4bit::new(1e-3, 0.9, 0.999, 1e-8, 0.01))
            .collect()
    };

    let (mut one_w, mut one_a, mut many_w, mut many_a) = (adamw(), adam(), adamw(), adam());
    let (mut ref_w, mut ref_a, mut got_w, mut got_a) =
        (w0.clone(), w0.clone(), w0.clone(), w0.clone());
    for _ in 0..3 {
        step_each(
            &mut one_w,
            &mut ref_w,
            &gs,
            &shapes,
            AdamW4bit::update_param,
        );
        step_each(&mut one_a, &mut ref_a, &gs, &shapes, Adam4bit::update_param);
        step_many(&mut many_w, &mut got_w, &gs, &shapes, |o, p, g| {
            StepItem::adamw(o, p, g)
        })
        .unwrap();
        step_many(&mut many_a, &mut got_a, &gs, &shapes, |o, p, g| {
            StepItem::adam(o, p, g)
        })
        .unwrap();
    }
    let all_bits = |v: &[Vec<f32>]| -> Vec<Vec<u32>> {
        v.iter()
            .map(|w| w.iter().map(|x| x.to_bits()).collect())
            .collect()
    };
    assert_eq!(all_bits(&got_w), all_bits(&ref_w), "AdamW4bit");
    assert_eq!(all_bits(&got_a), all_bits(&ref_a), "Adam4bit");
    assert_ne!(
        all_bits(&got_w),
        all_bits(&got_a),
        "the two decay rules differ"
    );

    // A non-finite gradient in the last pair: an error naming index 3, nothing changes.
    let mut bad = gs.clone();
    bad[3][5] = f32::NAN;
    let before = all_bits(&got_w);
    assert_eq!(
        step_many(&mut many_w, &mut got_w, &bad, &shapes, |o, p, g| {
            StepItem::adamw(o, p, g)
        }),
        Err(3)
    );
    assert_eq!(all_bits(&got_w), before);
}
