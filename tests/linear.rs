//! Linear layers through the public Rust API: forward against an f64
//! reference, serialization round trips, and deserialize fuzzing.

use std::borrow::Cow;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use proptest::prelude::*;
use quantrs::fp8::{decode_scalar, Fp8Format};
use quantrs::linear::{
    Device, Int4Linear, Int8Linear, IsqType, PerTensorFP8Linear, QuantMethod, QuantizedSerde,
    UnquantLinear,
};
use quantrs::QuantError;

fn vals(n: usize, seed: u32) -> Vec<f32> {
    (0..n as u32)
        .map(|i| {
            ((i.wrapping_mul(2_654_435_761) ^ seed.wrapping_mul(40_503)) % 2001) as f32 / 1000.0
                - 1.0
        })
        .collect()
}

fn layer(out: usize, inf: usize, act: Option<f32>) -> PerTensorFP8Linear {
    PerTensorFP8Linear::from_float(&vals(out * inf, 1), vec![out, inf], Some(vals(out, 2)), act)
        .unwrap()
}

#[test]
fn fp8_forward_matches_f64_both_paths() {
    for act in [None, Some(0.01f32)] {
        for (rows, out, inf) in [(1, 7, 33), (3, 16, 64), (6, 9, 200)] {
            let l = layer(out, inf, act);
            let x = vals(rows * inf, 3);
            let mut y = vec![0f32; rows * out];
            l.forward_slice(&x, &mut y).unwrap();
            let s = l.weight_scale_inv() as f64;
            for b in 0..rows {
                for o in 0..out {
                    let (mut acc, mut mag) = (0f64, 0f64);
                    for i in 0..inf {
                        let mut xv = x[b * inf + i];
                        if let Some(a) = act {
                            xv = quantrs::fp8::round_to_grid_scalar(xv / a, Fp8Format::E4M3, true);
                        }
                        let w = decode_scalar(l.weight()[o * inf + i], Fp8Format::E4M3) as f64;
                        acc += xv as f64 * w;
                        mag += (xv as f64 * w).abs();
                    }
                    let m = act.map_or(s, |a| (a * l.weight_scale_inv()) as f64);
                    let want = acc * m + l.bias().unwrap()[o] as f64;
                    let got = y[b * out + o] as f64;
                    assert!(
                        (got - want).abs() <= 1e-5 * mag * m + 1e-6,
                        "{act:?} ({b},{o}) {got} {want}"
                    );
                }
            }
        }
    }
}

#[test]
fn serde_round_trips_and_isq_counts() {
    let l = Arc::new(layer(8, 40, Some(0.5)));
    let blob = l.serialize().unwrap().into_owned();
    let back = PerTensorFP8Linear::deserialize(Cow::Borrowed(&blob), &Device::Cpu).unwrap();
    assert_eq!(
        back.dequantize_w_vec().unwrap(),
        l.dequantize_w_vec().unwrap()
    );
    let n = AtomicUsize::new(0);
    let targets = [
        None,
        Some(IsqType::Int8),
        Some(IsqType::Int4 { group_size: 32 }),
        Some(IsqType::Fp8E4M3),
    ];
    for t in targets {
        let q = l.clone().apply_isq(t, Device::Cpu, &n, None).unwrap();
        assert_eq!(q.weight_shape(), vec![8, 40]);
    }
    assert_eq!(
        n.load(Ordering::Relaxed),
        3,
        "every quantizing path counts once"
    );
    let err = l
        .clone()
        .apply_isq(None, Device::Cuda(0), &n, None)
        .unwrap_err();
    assert!(matches!(err, QuantError::CudaNotAvailable(_)));
}

fn valid_blobs() -> Vec<(u8, Vec<u8>)> {
    let l = Arc::new(layer(4, 10, Some(0.5)));
    let n = AtomicUsize::new(0);
    let u = l.clone().apply_isq(None, Device::Cpu, &n, None).unwrap();
    let ser = |q: Arc<dyn QuantMethod>| -> Vec<u8> {
        // Re-serialize through the concrete types.
        match q.into_layer() {
            quantrs::linear::Layer::Fp8(a) => a.serialize().unwrap().into_owned(),
            quantrs::linear::Layer::Unquant(a) => a.serialize().unwrap().into_owned(),
            quantrs::linear::Layer::Int8(a) => a.serialize().unwrap().into_owned(),
            quantrs::linear::Layer::Int4(a) => a.serialize().unwrap().into_owned(),
            quantrs::linear::Layer::Registered { layer, .. } => {
                layer.serialize_layer().unwrap().into_owned()
            }
        }
    };
    vec![
        (0, l.serialize().unwrap().into_owned()),
        (1, ser(u.clone())),
        (
            2,
            ser(u
                .clone()
                .apply_isq(Some(IsqType::Int8), Device::Cpu, &n, None)
                .unwrap()),
        ),
        (
            3,
            ser(u
                .apply_isq(
                    Some(IsqType::Int4 { group_size: 32 }),
                    Device::Cpu,
                    &n,
                    None,
                )
                .unwrap()),
        ),
    ]
}

fn deser(kind: u8, data: &[u8]) -> Result<Arc<dyn QuantMethod>, QuantError> {
    let d = Cow::Borrowed(data);
    match kind {
        0 => PerTensorFP8Linear::deserialize(d, &Device::Cpu),
        1 => UnquantLinear::deserialize(d, &Device::Cpu),
        2 => Int8Linear::deserialize(d, &Device::Cpu),
        _ => Int4Linear::deserialize(d, &Device::Cpu),
    }
}

#[test]
fn valid_blobs_round_trip() {
    for (k, b) in valid_blobs() {
        deser(k, &b).unwrap();
        assert!(matches!(
            deser((k + 1) % 4, &b),
            Err(QuantError::Serialization(_))
        ));
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]
    #[test]
    fn corrupted_blobs_only_error(kind in 0u8..4, cut in 0usize..400, flip in 0usize..3200, reseal: bool) {
        let blobs = valid_blobs();
        let mut b = blobs[kind as usize].1.clone();
        let i = flip % (b.len() * 8);
        b[i / 8] ^= 1 << (i % 8);
        if reseal {
            let n = b.len() - 4;
            let crc = crc32fast::hash(&b[..n]);
            b[n..].copy_from_slice(&crc.to_le_bytes());
        }
        match deser(kind, &b) {
            Ok(l) => { l.dequantize_w_vec().unwrap(); }
            Err(e) => prop_assert!(matches!(e, QuantError::Serialization(_)), "{e}"),
        }
        let t = &blobs[kind as usize].1[..cut.min(blobs[kind as usize].1.len() - 1)];
        prop_assert!(matches!(deser(kind, t), Err(QuantError::Serialization(_))));
    }

    #[test]
    fn random_bytes_only_error(kind in 0u8..4, data in proptest::collection::vec(any::<u8>(), 0..200)) {
        prop_assert!(matches!(deser(kind, &data), Err(QuantError::Serialization(_))));
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]
    /// With an imatrix, the INT4 layer's importance-weighted error is never
    /// above the absmax layer's (absmax is one of the searched scales).
    #[test]
    fn imatrix_int4_never_worse_than_absmax(
        w in proptest::collection::vec(-4.0f32..4.0, 3 * 70),
        a in proptest::collection::vec(0.0f32..10.0, 70),
        gs in prop_oneof![Just(8usize), Just(32)],
    ) {
        let plain = Int4Linear::from_float(&w, 3, 70, gs, None, None).unwrap();
        let weighted = Int4Linear::from_float(&w, 3, 70, gs, None, Some(&a)).unwrap();
        let werr = |l: &Int4Linear| -> f64 {
            l.dequantize_w_vec().unwrap().iter().zip(&w).enumerate()
                .map(|(i, (q, v))| a[i % 70] as f64 * ((q - v) as f64).powi(2)).sum()
        };
        prop_assert!(werr(&weighted) <= werr(&plain) * (1.0 + 1e-9) + 1e-12);
    }
}

/// `quantize_layer` and `set_thread_limit` are the crate's own API (what
/// `quantrs.QuantLinear` and `quantrs.threads` call): every format's layer
/// forwards as `x @ dequantize_w^T + bias` (f64 reference, f32 summation
/// bound), and a thread cap changes no bit of the result.
#[test]
fn quantize_layer_and_the_thread_cap_from_rust() {
    use quantrs::format::FormatId;
    use quantrs::ndarray::Array2;
    let (out, inf, rows) = (12, 96, 3);
    let w = vals(out * inf, 21);
    let bias = vals(out, 22);
    let x = vals(rows * inf, 23);
    for id in [
        FormatId::Float32,
        FormatId::Int8,
        FormatId::Int4,
        FormatId::Fp8E4M3,
    ] {
        let l = quantrs::linear::quantize_layer(id, &w, out, inf, 32, Some(bias.clone())).unwrap();
        let deq = l.dequantize_w_vec().unwrap();
        assert_eq!(deq.len(), out * inf, "{id:?}");
        let mut y = vec![f32::NAN; rows * out];
        l.forward_slice(&x, &mut y).unwrap();
        // The f64 product through ndarray's GEMM, and the same over |x| |w|
        // for the bound.
        let to64 = |v: &[f32], r: usize, c: usize| {
            Array2::from_shape_vec((r, c), v.iter().map(|&a| a as f64).collect()).unwrap()
        };
        let (xa, wa) = (to64(&x, rows, inf), to64(&deq, out, inf));
        let want = xa.dot(&wa.t()) + &to64(&bias, 1, out);
        let mag = xa.abs().dot(&wa.abs().t()) + &to64(&bias, 1, out).abs();
        for ((&got, &r), &m) in y.iter().zip(want.iter()).zip(mag.iter()) {
            assert!(
                (got as f64 - r).abs() <= 1e-5 * m + 1e-6,
                "{id:?}: {got} vs {r}"
            );
        }
        let prev = quantrs::set_thread_limit(Some(1));
        let mut y1 = vec![f32::NAN; rows * out];
        l.forward_slice(&x, &mut y1).unwrap();
        quantrs::set_thread_limit(prev);
        assert_eq!(y, y1, "{id:?}: one thread vs every core");
    }
    let bad = quantrs::linear::quantize_layer(FormatId::Int4, &w, out, inf, 0, None);
    assert!(bad.is_err(), "group size 0");
}
