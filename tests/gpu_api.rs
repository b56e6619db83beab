//! The Rust API of the device objects (docs/rust.md, "GPU"): a packed INT4
//! weight, a linear layer, AdamW4bit and QatOptimizer on a device, each
//! against its CPU twin. Compiles in every `gpu` build; without a usable
//! device each test returns at `CudaNotAvailable` (printing the reason).
#![cfg(feature = "gpu")]

use std::sync::Arc;

use quantrs::gpu::{self, DeviceAdam, DeviceBuffer, DeviceLinear, DeviceParam, DeviceQat};
use quantrs::gpu::{DeviceQuantizedWeight, Gpu};
use quantrs::int4::QuantizedWeight;
use quantrs::linear::{Layer, UnquantLinear};
use quantrs::optim::{Adam4bitConfig, AdamW4bit, ParamMut, StatefulOptimizer};
use quantrs::qat::{IntDtype, QatConfig, QatOptimizer, QuantTarget};
use quantrs::QuantError;

/// Device 0, or `None` (with the reason printed) where there is none.
fn device() -> Option<Arc<Gpu>> {
    match gpu::device(0) {
        Ok(g) => Some(g),
        Err(QuantError::CudaNotAvailable(why)) => {
            eprintln!("skipped: {why}");
            None
        }
        Err(e) => panic!("opening cuda:0: {e}"),
    }
}

fn data(n: usize, seed: u32) -> Vec<f32> {
    (0..n)
        .map(|i| {
            let x = (i as u32).wrapping_mul(2_654_435_761).wrapping_add(seed);
            (x >> 8) as f32 / (1u32 << 24) as f32 - 0.5
        })
        .collect()
}

#[test]
fn without_a_device_the_api_reports_cuda_not_available() {
    if gpu::cuda_available() {
        assert!(gpu::device(0).is_ok());
    } else {
        assert!(matches!(
            gpu::device(0),
            Err(QuantError::CudaNotAvailable(_))
        ));
    }
}

#[test]
fn int4_matmul_on_a_device_matches_the_cpu() {
    let Some(g) = device() else { return };
    let (k, n, batch) = (256, 96, 3);
    let qw = QuantizedWeight::try_quantize(&data(k * n, 1), k, n).unwrap();
    let dw = DeviceQuantizedWeight::from_cpu(&g, &qw).unwrap();
    let x = data(batch * k, 2);
    let mut want = vec![0f32; batch * n];
    qw.try_matmul(&x, batch, &mut want).unwrap();
    let dx = DeviceBuffer::from_host(&g, &x).unwrap();
    let mut dy = DeviceBuffer::alloc(&g, 4 * batch * n).unwrap();
    dw.matmul(&dx.view(), batch, &mut dy.view_mut()).unwrap();
    let got: Vec<f32> = dy.to_host().unwrap();
    for (a, b) in got.iter().zip(&want) {
        assert!((a - b).abs() <= 1e-4 * (1.0 + b.abs()), "{a} vs {b}");
    }
    // A view of the wrong length is refused before anything runs.
    let short = DeviceBuffer::alloc(&g, 4 * k).unwrap();
    let err = dw
        .matmul(&short.view(), batch, &mut dy.view_mut())
        .unwrap_err();
    assert!(matches!(err, QuantError::DimensionMismatch { .. }), "{err}");
    assert_eq!(dw.to_cpu().unwrap().dequantize(), qw.dequantize());
}

#[test]
fn a_linear_layer_on_a_device_matches_an_f64_reference() {
    let Some(g) = device() else { return };
    let (o, i, rows) = (48, 80, 5);
    let (w, b) = (data(o * i, 3), data(o, 4));
    let layer = Arc::new(UnquantLinear::new(w.clone(), o, i, Some(b.clone())).unwrap());
    let dl = DeviceLinear::from_layer(&g, &Layer::Unquant(layer)).unwrap();
    let x = data(rows * i, 5);
    let dx = DeviceBuffer::from_host(&g, &x).unwrap();
    let mut dy = DeviceBuffer::alloc(&g, 4 * rows * o).unwrap();
    dl.forward(&dx.view(), rows, &mut dy.view_mut()).unwrap();
    let got: Vec<f32> = dy.to_host().unwrap();
    for r in 0..rows {
        for c in 0..o {
            let want: f64 = (0..i)
                .map(|k| f64::from(x[r * i + k]) * f64::from(w[c * i + k]))
                .sum::<f64>()
                + f64::from(b[c]);
            let y = f64::from(got[r * o + c]);
            assert!((y - want).abs() <= 1e-4, "[{r}, {c}]: {y} vs {want}");
        }
    }
}

#[test]
fn adamw4bit_on_a_device_is_bit_identical_to_the_cpu() {
    let Some(g) = device() else { return };
    let shape = [64usize, 40];
    let n = shape[0] * shape[1];
    let mut cpu = AdamW4bit::with_quantization_config(
        Adam4bitConfig::default().optimizer,
        Adam4bitConfig::default().quantization,
    );
    let mut dev = DeviceAdam::from_adamw(&g, &cpu).unwrap();
    let mut w = data(n, 6);
    let mut dw = DeviceBuffer::from_host(&g, &w).unwrap();
    for step in 0..3 {
        let grad = data(n, 100 + step);
        let dg = DeviceBuffer::from_host(&g, &grad).unwrap();
        let p = ParamMut {
            name: Some("w"),
            shape: &shape,
            data: &mut w,
        };
        cpu.update_param(p, &grad).unwrap();
        quantrs::optim::Optimizer::step(&mut cpu);
        let p = DeviceParam {
            name: Some("w"),
            shape: &shape,
            data: dw.view_mut(),
        };
        dev.update(p, &dg.view()).unwrap();
        dev.step();
    }
    let got: Vec<f32> = dw.to_host().unwrap();
    assert!(got.iter().zip(&w).all(|(a, b)| a.to_bits() == b.to_bits()));
    assert_eq!(&dev.state().unwrap(), cpu.state());
    assert_eq!(dev.step_count(), 3);
}

#[test]
fn qat_on_a_device_is_bit_identical_to_the_cpu() {
    let Some(g) = device() else { return };
    let n = 3000;
    let mut w = data(n, 7);
    let config = QatConfig::with_target(QuantTarget::Int(IntDtype::Int4));
    let mut cpu = QatOptimizer::with_seed(&w, config, 9).unwrap();
    let mut dev = DeviceQat::from_cpu(&g, &cpu).unwrap();
    let mut dw = DeviceBuffer::from_host(&g, &w).unwrap();
    for step in 0..3 {
        let grad = data(n, 200 + step);
        let dg = DeviceBuffer::from_host(&g, &grad).unwrap();
        cpu.step_seeded(&mut w, &grad, None).unwrap();
        dev.step(&mut dw.view_mut(), &dg.view(), None).unwrap();
    }
    let got: Vec<f32> = dw.to_host().unwrap();
    assert!(got.iter().zip(&w).all(|(a, b)| a.to_bits() == b.to_bits()));
    assert_eq!(dev.to_cpu().unwrap().to_bytes(), cpu.to_bytes());
}
