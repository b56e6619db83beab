//! The seeds' documents (000 QatOptimizer, 001 AdamW4bit, 002
//! PerTensorFP8Linear, 003 QuantizedWeight) as a user writes them against
//! the crate: ndarray tensors, a `rand` generator, the seeds' error names,
//! each asserting what the document says (docs/rust.md).

use std::borrow::Cow;
use std::path::Path;
use std::sync::Arc;

use ndarray::{array, Array1, Array2, ArrayD, IxDyn};
use quantrs::fp8::{decode_scalar, Fp8Format};
use quantrs::linear::{Device, PerTensorFP8Linear, QuantMethod, QuantizedSerde};
use quantrs::optim::{
    Adam4bit, Adam4bitConfig, Adam4bitOptimizerConfig, AdamW4bit, AdvancedQuantizationConfig,
    Optimizer, OptimizerState, StateMemoryStats, StatefulOptimizer,
};
use quantrs::qat::{IntDtype, QatConfig, QatOptimizer, QuantScheme, QuantTarget, RoundingMode};
use quantrs::{GpuOptimError, QuantizedWeight};
use rand::{rngs::StdRng, Rng, SeedableRng};

fn uniform(rng: &mut StdRng, n: usize, scale: f64) -> Vec<f64> {
    (0..n)
        .map(|_| ((rng.next_u64() >> 11) as f64 / (1u64 << 53) as f64 * 2.0 - 1.0) * scale)
        .collect()
}

// ---- seed 000: QatOptimizer ----------------------------------------------

fn int8_config(rounding: RoundingMode) -> QatConfig {
    QatConfig::new(
        QuantTarget::Int(IntDtype::Int8),
        QuantScheme::Symmetric,
        rounding,
        1e-2,
    )
}

#[test]
fn qat_config_new_has_the_documented_defaults() {
    let c = QatConfig::new(
        QuantTarget::Fp8(Fp8Format::E4M3),
        QuantScheme::Symmetric,
        RoundingMode::Nearest,
        3e-4,
    );
    assert_eq!(c.lr, 3e-4);
    assert_eq!(
        (c.beta1, c.beta2, c.eps, c.weight_decay),
        (0.9, 0.999, 1e-8, 0.0)
    );
}

#[test]
fn qat_new_derives_the_view_at_once_and_step_updates_the_master() {
    let mut rng = StdRng::seed_from_u64(1);
    let mut master = Array1::from(uniform(&mut rng, 64, 1.0));
    let opt = QatOptimizer::new(&master, int8_config(RoundingMode::Nearest), &mut rng).unwrap();
    assert_eq!(opt.step_count(), 0);
    // Symmetric int8: scale = absmax / 127, view = round(w / scale) * scale.
    let absmax = master.iter().fold(0.0f64, |a, w| a.max(w.abs()));
    let p = *opt.quant_params().unwrap();
    assert!((p.scale - absmax / 127.0).abs() <= 1e-15 * absmax);
    for (q, w) in opt.quantized_weights().iter().zip(&master) {
        assert_eq!(*q, (w / p.scale).round_ties_even() * p.scale);
    }

    let mut opt = opt;
    let before = master.clone();
    let grad = master.mapv(f64::signum);
    opt.step(&mut master, &grad, &mut rng).unwrap();
    assert_eq!(opt.step_count(), 1);
    // AdamW's first step moves each weight by lr against its gradient's sign.
    for (w, w0) in master.iter().zip(&before) {
        assert!((w - (w0 - 1e-2 * w0.signum())).abs() < 1e-9, "{w} {w0}");
    }
    // Clone and Debug, as the seed shows.
    let copy = opt.clone();
    assert_eq!(copy.quantized_weights(), opt.quantized_weights());
    assert!(format!("{opt:?}").contains("QatOptimizer"));
}

#[test]
fn qat_fp8_targets_have_no_quant_params() {
    let mut rng = StdRng::seed_from_u64(2);
    let master = array![0.1, -3.0, 17.0, 0.002];
    let c = QatConfig::new(
        QuantTarget::Fp8(Fp8Format::E4M3),
        QuantScheme::Symmetric,
        RoundingMode::Nearest,
        1e-3,
    );
    let opt = QatOptimizer::new(&master, c, &mut rng).unwrap();
    assert!(opt.quant_params().is_none());
    // 17 is between the E4M3 grid points 16 and 18: ties to even gives 16.
    assert_eq!(opt.quantized_weights()[2], 16.0);
}

#[test]
fn qat_errors_have_the_seed_names_and_change_nothing() {
    let mut rng = StdRng::seed_from_u64(3);
    let empty: Array1<f64> = Array1::zeros(0);
    match QatOptimizer::new(&empty, int8_config(RoundingMode::Nearest), &mut rng) {
        Err(GpuOptimError::InvalidState(_)) => {}
        other => panic!("expected InvalidState, got {other:?}"),
    }
    let mut master = array![1.0, -2.0, 0.5];
    let mut opt = QatOptimizer::new(&master, int8_config(RoundingMode::Nearest), &mut rng).unwrap();
    let snapshot = (opt.clone(), master.clone());
    match opt.step(&mut master, &array![1.0, 1.0], &mut rng) {
        Err(GpuOptimError::DimensionMismatch { .. }) => {}
        other => panic!("expected DimensionMismatch, got {other:?}"),
    }
    assert_eq!(opt, snapshot.0);
    assert_eq!(master, snapshot.1);
    // `new` drew one key (after the empty-master error drew none); the
    // failed step drew nothing.
    let mut reference = StdRng::seed_from_u64(3);
    reference.next_u64();
    assert_eq!(rng.next_u64(), reference.next_u64());
}

#[test]
fn qat_stochastic_rounding_is_unbiased_and_reproducible_from_the_rng() {
    // 0.3 * scale sits between two grid points: up with probability 0.3.
    let n = 20_000;
    let mut master = Array1::from_elem(n, 0.3);
    master[0] = 127.0; // absmax: scale = 1
    let c = int8_config(RoundingMode::Stochastic);
    let a = QatOptimizer::new(&master, c, &mut StdRng::seed_from_u64(9)).unwrap();
    let b = QatOptimizer::new(&master, c, &mut StdRng::seed_from_u64(9)).unwrap();
    assert_eq!(a.quantized_weights(), b.quantized_weights());
    let ups = a
        .quantized_weights()
        .iter()
        .skip(1)
        .filter(|&&q| q == 1.0)
        .count();
    let downs = a
        .quantized_weights()
        .iter()
        .skip(1)
        .filter(|&&q| q == 0.0)
        .count();
    assert_eq!(ups + downs, n - 1);
    let p = ups as f64 / (n - 1) as f64;
    assert!((p - 0.3).abs() < 0.015, "{p}");
    let other = QatOptimizer::new(&master, c, &mut StdRng::seed_from_u64(10)).unwrap();
    assert_ne!(a.quantized_weights(), other.quantized_weights());
    // Same generator state and inputs: the step is reproducible too.
    let (mut a, mut b) = (a, b);
    let (mut wa, mut wb) = (master.clone(), master.clone());
    let g = Array1::from_elem(n, 0.0);
    a.step(&mut wa, &g, &mut StdRng::seed_from_u64(4)).unwrap();
    b.step(&mut wb, &g, &mut StdRng::seed_from_u64(4)).unwrap();
    assert_eq!(a.quantized_weights(), b.quantized_weights());
}

#[test]
fn qat_works_on_f32_masters_too() {
    let mut rng = StdRng::seed_from_u64(5);
    let mut master: Array1<f32> = array![0.5, -1.0, 0.25];
    let mut opt = QatOptimizer::new(&master, int8_config(RoundingMode::Nearest), &mut rng).unwrap();
    opt.step(&mut master, &array![1.0f32, 1.0, 1.0], &mut rng)
        .unwrap();
    assert!((master[0] - 0.49).abs() < 1e-6);
}

// ---- seed 001: AdamW4bit -------------------------------------------------

#[test]
fn adamw4bit_decoupled_decay_only_gives_9_5() {
    let mut opt = AdamW4bit::new(0.1, 0.9, 0.999, 1e-8, 0.5);
    let mut w = array![10.0f32];
    let g = array![0.0f32];
    opt.update(w.view_mut().into_dyn(), g.view().into_dyn())
        .unwrap();
    opt.step();
    assert_eq!(w[0], 9.5);
}

#[test]
fn adamw4bit_first_step_moves_by_lr_and_keeps_state_per_parameter() {
    let mut opt = AdamW4bit::new(1e-2, 0.9, 0.999, 1e-8, 0.0);
    assert_eq!(opt.get_lr(), 1e-2);
    let mut w = Array2::<f32>::from_elem((4, 64), 1.0);
    let g =
        Array2::<f32>::from_shape_fn((4, 64), |(i, j)| if (i + j) % 2 == 0 { 0.5 } else { -0.5 });
    opt.update(w.view_mut().into_dyn(), g.view().into_dyn())
        .unwrap();
    opt.step();
    // Adam's bias-corrected first step is lr * sign(g) (up to 4-bit state).
    for (wv, gv) in w.iter().zip(&g) {
        assert!((wv - (1.0 - 1e-2 * gv.signum())).abs() < 1e-4, "{wv}");
    }
    assert_eq!(opt.num_parameters(), 256);
    assert!(opt.memory_savings() > 0.8);
    assert_eq!(opt.config().optimizer.learning_rate, 1e-2);
    opt.set_lr(1e-3);
    assert_eq!(opt.get_lr(), 1e-3);
    assert!(opt.try_set_lr(f32::NAN).is_err());
    assert_eq!(opt.get_lr(), 1e-3);
}

#[test]
fn adamw4bit_rejects_shape_mismatch_and_non_standard_layout_unchanged() {
    let mut opt = AdamW4bit::new(1e-2, 0.9, 0.999, 1e-8, 0.0);
    let mut w = Array2::<f32>::ones((3, 4));
    let g = Array2::<f32>::ones((4, 3));
    let err = opt
        .update(w.view_mut().into_dyn(), g.view().into_dyn())
        .unwrap_err();
    assert!(
        matches!(err, GpuOptimError::DimensionMismatch { .. }),
        "{err}"
    );
    // A transposed view is not standard layout: an error, not a copy.
    let mut wt = Array2::<f32>::ones((4, 3));
    let gt = Array2::<f32>::ones((3, 4));
    assert!(opt
        .update(wt.t().into_owned().view_mut().into_dyn(), gt.t().into_dyn())
        .is_err());
    assert!(opt
        .update(
            wt.view_mut().reversed_axes().into_dyn(),
            gt.view().into_dyn()
        )
        .is_err());
    assert!(w.iter().chain(&wt).all(|&v| v == 1.0));
    assert_eq!(opt.num_parameters(), 0);
}

#[test]
fn adamw4bit_gradient_accumulation_equals_one_update_with_the_mean() {
    let make = || AdamW4bit::new(1e-2, 0.9, 0.999, 1e-8, 0.01);
    let g1 = ArrayD::from_shape_fn(IxDyn(&[2, 3, 8]), |i| (i[0] + 2 * i[1]) as f32 * 0.1 - 0.3);
    let g2 = ArrayD::from_shape_fn(IxDyn(&[2, 3, 8]), |i| i[2] as f32 * 0.05 - 0.2);
    let mut w = ArrayD::<f32>::from_elem(IxDyn(&[2, 3, 8]), 0.7);
    let mut acc = make();
    acc.accumulate_grad(w.view_mut(), g1.view()).unwrap();
    acc.accumulate_grad(w.view_mut(), g2.view()).unwrap();
    assert!(
        w.iter().all(|&v| v == 0.7),
        "accumulation leaves the parameter alone"
    );
    acc.apply_accumulated_grads(2, &mut [w.view_mut()]).unwrap();
    acc.step();

    let mut w_ref = ArrayD::<f32>::from_elem(IxDyn(&[2, 3, 8]), 0.7);
    let mean = (&g1 + &g2) / 2.0;
    let mut one = make();
    one.update(w_ref.view_mut(), mean.view()).unwrap();
    assert_eq!(w, w_ref);
    assert!(acc.apply_accumulated_grads(0, &mut []).is_err());
}

#[test]
fn adamw4bit_state_dict_round_trips_and_reset_clears() {
    let q = AdvancedQuantizationConfig::default();
    let o = Adam4bitOptimizerConfig {
        learning_rate: 1e-2,
        ..Default::default()
    };
    let mut a = AdamW4bit::with_quantization_config(o, q);
    let mut w = Array1::<f32>::linspace(-1.0, 1.0, 300);
    let g = w.mapv(|v| v * 0.1);
    a.update(w.view_mut().into_dyn(), g.view().into_dyn())
        .unwrap();
    a.step();
    let mut b = AdamW4bit::with_quantization_config(o, q);
    b.load_state_dict(a.state_dict().unwrap()).unwrap();
    assert_eq!(b.state_dict().unwrap(), a.state_dict().unwrap());
    assert_eq!(b.memory_usage(), a.memory_usage());
    b.reset_state();
    assert_eq!(b.num_parameters(), 0);
}

/// Every method of the AdamW4bit document (and Adam4bit, which it shares
/// its config and state with), called with the document's argument types;
/// each `fn` pointer pins the exact signature, so a change of a constructor
/// back to `Result<Self>` fails to compile here.
macro_rules! documented_surface {
    ($name:ident, $t:ty) => {
        #[test]
        fn $name() {
            let _: fn(f32, f32, f32, f32, f32) -> $t = <$t>::new;
            let _: fn(Adam4bitOptimizerConfig, AdvancedQuantizationConfig) -> $t =
                <$t>::with_quantization_config;
            let _: fn(&$t) -> f32 = <$t>::memory_savings;
            let _: fn(&mut $t) = <$t as Optimizer>::zero_grad;
            let _: fn(&mut $t) = <$t as Optimizer>::step;
            let _: fn(&$t) -> f32 = <$t as Optimizer>::get_lr;
            let _: fn(&$t) -> &<$t as StatefulOptimizer>::Config =
                <$t as StatefulOptimizer>::config;
            let _: fn(&$t) -> StateMemoryStats = <$t as StatefulOptimizer>::memory_usage;
            let _: fn(&mut $t) = <$t as StatefulOptimizer>::reset_state;
            let _: fn(&$t) -> usize = <$t as StatefulOptimizer>::num_parameters;
            let _: fn(&$t, &Path) -> quantrs::Result<()> = <$t as StatefulOptimizer>::save_state;
            let _: fn(&mut $t, &Path) -> quantrs::Result<()> =
                <$t as StatefulOptimizer>::load_state;

            let mut opt: $t = <$t>::new(1e-2, 0.9, 0.999, 1e-8, 0.01);
            let optimizer_config = Adam4bitOptimizerConfig {
                learning_rate: 1e-2,
                beta1: 0.9,
                beta2: 0.999,
                epsilon: 1e-8,
                weight_decay: 0.01,
            };
            let quantization_config = AdvancedQuantizationConfig::default();
            let twin: $t = <$t>::with_quantization_config(optimizer_config, quantization_config);
            let config: &Adam4bitConfig = opt.config();
            assert_eq!(*config, *twin.config());
            assert_eq!(config.optimizer, optimizer_config);

            let mut w = ArrayD::<f32>::from_elem(IxDyn(&[2, 64]), 0.5);
            let g = ArrayD::<f32>::from_shape_fn(IxDyn(&[2, 64]), |i| i[1] as f32 * 0.01 - 0.3);
            let updated: quantrs::Result<()> = opt.update(w.view_mut(), g.view());
            updated.unwrap();
            opt.step();
            assert!(w.iter().all(|&v| v != 0.5), "every element moved");
            let accumulated: quantrs::Result<()> = opt.accumulate_grad(w.view_mut(), g.view());
            accumulated.unwrap();
            let applied: quantrs::Result<()> = opt.apply_accumulated_grads(1, &mut [w.view_mut()]);
            applied.unwrap();
            opt.zero_grad();
            opt.step();
            assert_eq!(opt.get_lr(), 1e-2);
            opt.set_lr(1e-3);
            assert_eq!(opt.get_lr(), 1e-3);

            let state: &OptimizerState = opt.state();
            assert_eq!(state.step, 2);
            assert_eq!(opt.num_parameters(), 128);
            let stats: StateMemoryStats = opt.memory_usage();
            assert_eq!(stats.num_parameters, 128);
            let savings: f32 = opt.memory_savings();
            assert!(savings > 0.0 && savings < 1.0, "{savings}");
            assert!(!format!("{opt:?}").is_empty());

            let dict = opt.state_dict().unwrap();
            let mut restored: $t = <$t>::new(1e-2, 0.9, 0.999, 1e-8, 0.01);
            let loaded: quantrs::Result<()> = restored.load_state_dict(dict.clone());
            loaded.unwrap();
            assert_eq!(restored.state(), opt.state());
            let dir = std::env::temp_dir().join(format!(
                "quantrs_seed_api_{}_{}",
                stringify!($name),
                std::process::id()
            ));
            std::fs::create_dir_all(&dir).unwrap();
            let path = dir.join("state.safetensors");
            opt.save_state(&path).unwrap();
            let mut from_file: $t = <$t>::new(1e-2, 0.9, 0.999, 1e-8, 0.01);
            from_file.load_state(&path).unwrap();
            assert_eq!(from_file.state_dict().unwrap(), dict);
            std::fs::remove_dir_all(&dir).unwrap();
            opt.reset_state();
            assert_eq!(opt.num_parameters(), 0);
        }
    };
}

documented_surface!(adamw4bit_documented_surface, AdamW4bit);
documented_surface!(adam4bit_documented_surface, Adam4bit);

#[test]
fn invalid_hyper_parameters_are_reported_by_the_first_update_not_the_constructor() {
    let mut opt = AdamW4bit::new(1e-2, 1.5, 0.999, 1e-8, 0.0);
    let mut w = array![1.0f32, 2.0];
    let g = array![0.1f32, 0.1];
    let err = opt
        .update(w.view_mut().into_dyn(), g.view().into_dyn())
        .unwrap_err();
    assert!(err.to_string().contains("beta1"), "{err}");
    assert_eq!(w, array![1.0f32, 2.0], "nothing changes on error");
    assert!(opt
        .accumulate_grad(w.view_mut().into_dyn(), g.view().into_dyn())
        .is_err());
    assert!(opt.state_dict().is_err());
    assert_eq!(opt.num_parameters(), 0);
    // The validated constructors report the same error up front.
    let early = AdamW4bit::try_new(1e-2, 1.5, 0.999, 1e-8, 0.0).unwrap_err();
    assert_eq!(early.to_string(), err.to_string());
    let q = AdvancedQuantizationConfig {
        block_size: 0,
        ..Default::default()
    };
    let mut bad_blocks = Adam4bit::with_quantization_config(Default::default(), q);
    let err = bad_blocks
        .update(w.view_mut().into_dyn(), g.view().into_dyn())
        .unwrap_err();
    assert!(err.to_string().contains("block_size"), "{err}");
    assert!(Adam4bit::try_with_quantization_config(Default::default(), q).is_err());
    // A valid learning rate set later does not hide the invalid beta1.
    opt.set_lr(1e-3);
    assert!(opt
        .update(w.view_mut().into_dyn(), g.view().into_dyn())
        .is_err());
}

// ---- seed 002: PerTensorFP8Linear ----------------------------------------

#[test]
fn fp8_linear_forward_is_x_times_decoded_weight_transposed() {
    // E4M3 codes: 0x38 = 1.0, 0x40 = 2.0, 0xB8 = -1.0, 0x30 = 0.5.
    let codes = vec![0x38, 0x40, 0xB8, 0x30, 0x38, 0x38];
    assert_eq!(decode_scalar(0x30, Fp8Format::E4M3), 0.5);
    let layer =
        PerTensorFP8Linear::new(codes, vec![2, 3], 0.25, None, Some(vec![1.0, -1.0])).unwrap();
    // W = [[1, 2, -1], [0.5, 1, 1]] * 0.25.
    let w = layer.dequantize_w().unwrap();
    assert_eq!(w.shape(), &[2, 3]);
    assert_eq!(
        w.as_slice().unwrap(),
        &[0.25, 0.5, -0.25, 0.125, 0.25, 0.25]
    );
    // x of shape [2, 2, 3]: leading dimensions are kept.
    let x = ArrayD::from_shape_vec(IxDyn(&[2, 2, 3]), (0..12).map(|v| v as f32).collect()).unwrap();
    let y = layer.forward(x.view()).unwrap();
    assert_eq!(y.shape(), &[2, 2, 2]);
    for r in 0..4 {
        let xr = &x.as_slice().unwrap()[3 * r..3 * r + 3];
        for o in 0..2 {
            let want: f32 = (0..3).map(|i| xr[i] * w[[o, i]]).sum::<f32>() + [1.0, -1.0][o];
            assert!((y.as_slice().unwrap()[2 * r + o] - want).abs() < 1e-5);
        }
    }
    // Weight-only layer: no quantized activation type, autocast is forward.
    assert_eq!(layer.quantized_act_type(), None);
    assert_eq!(layer.forward_autocast(x.view()).unwrap(), y);
    assert!(layer.forward(x.view().reversed_axes()).is_err());
}

#[test]
fn fp8_linear_static_activation_scale_and_serde_and_lora_delta() {
    let w = Array2::from_shape_fn((4, 8), |(o, i)| (o as f32 - i as f32) * 0.1);
    let layer = PerTensorFP8Linear::from_float(w.as_slice().unwrap(), vec![4, 8], None, Some(0.05))
        .unwrap();
    assert_eq!(layer.quantized_act_type(), Some(Fp8Format::E4M3));
    assert_eq!(layer.name(), "pertensor-fp8-linear");
    let bytes = layer.serialize().unwrap();
    let back =
        PerTensorFP8Linear::deserialize(Cow::Owned(bytes.into_owned()), &Device::Cpu).unwrap();
    assert_eq!(back.dequantize_w().unwrap(), layer.dequantize_w().unwrap());
    let x = ArrayD::from_elem(IxDyn(&[3, 8]), 0.5f32);
    assert_eq!(
        back.forward(x.view()).unwrap(),
        layer.forward(x.view()).unwrap()
    );
    // add_delta_w: W + delta, re-quantized to FP8 (relative error < 2^-4).
    let delta = ArrayD::from_elem(IxDyn(&[4, 8]), 0.01f32);
    let merged: Arc<dyn QuantMethod> = layer.add_delta_w(delta.view()).unwrap();
    let want = layer.dequantize_w().unwrap() + &delta;
    for (m, t) in merged.dequantize_w().unwrap().iter().zip(&want) {
        assert!((m - t).abs() <= t.abs() / 16.0 + 1e-3, "{m} {t}");
    }
    let wrong = ArrayD::from_elem(IxDyn(&[8, 4]), 0.01f32);
    assert!(matches!(
        layer.add_delta_w(wrong.view()),
        Err(GpuOptimError::DimensionMismatch { .. })
    ));
    // gather_forward needs expert-stacked weights.
    let idx = ArrayD::from_elem(IxDyn(&[3, 1]), 0i64);
    assert!(matches!(
        layer.gather_forward(x.view(), idx.view()),
        Err(GpuOptimError::UnsupportedOperation(_))
    ));
}

// ---- seed 003: QuantizedWeight -------------------------------------------

#[test]
fn quantized_weight_slices_as_the_seed_shows() {
    let (in_feat, out_feat) = (64usize, 5usize);
    let mut rng = StdRng::seed_from_u64(7);
    let w: Vec<f32> = uniform(&mut rng, in_feat * out_feat, 2.0)
        .into_iter()
        .map(|v| v as f32)
        .collect();
    // The seed's signatures: `quantize -> Self`, `dequantize_to`, `matvec`
    // and `matmul` returning `()` (the `try_` forms return `Result`). The
    // fields are private here; the accessors read them.
    let qw: QuantizedWeight = QuantizedWeight::quantize(&w, in_feat, out_feat);
    assert_eq!(
        qw,
        QuantizedWeight::try_quantize(&w, in_feat, out_feat).unwrap()
    );
    assert_eq!((qw.in_feat(), qw.out_feat(), qw.num_groups()), (64, 5, 2));
    assert_eq!(qw.data().len(), in_feat / 2 * out_feat);
    assert_eq!(qw.scales().len(), qw.num_groups() * out_feat);
    // The Python `_fake_quantize_int4`: scale = max(absmax / 7, 1e-8) per
    // 32-row group, q = clamp(round_half_even(w / scale), -8, 7).
    let mut deq = vec![0.0f32; in_feat * out_feat];
    let () = qw.dequantize_to(&mut deq);
    for g in 0..2 {
        for o in 0..out_feat {
            let rows = 32 * g..32 * (g + 1);
            let absmax = rows
                .clone()
                .fold(0.0f32, |a, i| a.max(w[i * out_feat + o].abs()));
            let scale = (absmax / 7.0).max(1e-8);
            assert_eq!(qw.scales()[g * out_feat + o], scale);
            for i in rows {
                let q = (w[i * out_feat + o] / scale)
                    .round_ties_even()
                    .clamp(-8.0, 7.0);
                assert_eq!(deq[i * out_feat + o], q * scale);
            }
        }
    }
    // matvec: y = W^T x on the dequantized weight; matmul: Y = X W.
    let x: Vec<f32> = (0..in_feat).map(|i| (i as f32 * 0.37).sin()).collect();
    let mut y = vec![0.0f32; out_feat];
    let () = qw.matvec(&x, &mut y);
    let mut yy = vec![0.0f32; 2 * out_feat];
    let xx: Vec<f32> = x.iter().chain(&x).copied().collect();
    let () = qw.matmul(&xx, 2, &mut yy);
    // The fallible twins report a wrong length instead of panicking.
    assert!(qw.try_matvec(&x[1..], &mut y).is_err());
    assert!(qw.try_matmul(&xx, 3, &mut yy).is_err());
    assert!(qw.try_dequantize_to(&mut deq[1..]).is_err());
    assert!(QuantizedWeight::try_quantize(&w[1..], in_feat, out_feat).is_err());
    for o in 0..out_feat {
        let want: f64 = (0..in_feat)
            .map(|i| x[i] as f64 * deq[i * out_feat + o] as f64)
            .sum();
        assert!((y[o] as f64 - want).abs() < 1e-4, "{} {want}", y[o]);
        assert!((yy[out_feat + o] as f64 - want).abs() < 1e-4);
    }
}

#[test]
#[should_panic(expected = "x")]
fn quantized_weight_seed_matvec_panics_on_a_wrong_length() {
    let qw = QuantizedWeight::quantize(&[0.5f32; 64], 32, 2);
    let mut y = [0.0f32; 2];
    qw.matvec(&[1.0f32; 31], &mut y);
}

#[test]
fn quantized_weight_array_conveniences_agree_with_the_slices() {
    let w = Array2::from_shape_fn((48, 7), |(i, o)| ((i * 7 + o) as f32 * 0.61).cos());
    let qw = QuantizedWeight::quantize_array(w.view(), 16).unwrap();
    let same = QuantizedWeight::quantize_grouped(w.as_slice().unwrap(), 48, 7, 16).unwrap();
    assert_eq!(qw, same);
    assert_eq!(
        qw.dequantize_array().as_slice().unwrap(),
        &qw.dequantize()[..]
    );
    let x = Array2::from_shape_fn((3, 48), |(b, i)| (b as f32 + 1.0) * (i as f32 * 0.1).sin());
    let y = qw.matmul_array(x.view()).unwrap();
    assert_eq!(y.dim(), (3, 7));
    let mut ys = vec![0.0f32; 7];
    qw.try_matvec(x.row(1).as_slice().unwrap(), &mut ys)
        .unwrap();
    assert_eq!(
        qw.matvec_array(x.row(1)).unwrap().as_slice().unwrap(),
        &ys[..]
    );
    for (a, b) in y.row(1).iter().zip(&ys) {
        assert!((a - b).abs() < 1e-5);
    }
    assert!(qw.matmul_array(x.t()).is_err());
    assert!(QuantizedWeight::quantize_array(w.t(), 16).is_err());
}
