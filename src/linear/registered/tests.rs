//! A format registered with one `registry!` line and no other edit (the
//! test-only `TestSign8` of `crate::format`) is a full layer: `apply_isq`
//! target, forward, byte format, layer enum, parsing; checked against a
//! reference computed here from the format's formula.

use std::borrow::Cow;
use std::marker::PhantomData;
use std::sync::atomic::AtomicUsize;
use std::sync::Arc;

use super::{ParamsFromIsq, ParamsProbe, ParamsUnknown, ReadLayer};
use crate::format::FormatId;
use crate::linear::{
    Device, IsqType, Layer, QuantMethod, QuantizedSerde, UnquantLinear, WeightDType,
};
use crate::testutil::rand_vec;

const OUT: usize = 3;
const IN: usize = 8;

fn source() -> (Vec<f32>, Vec<f32>, Arc<UnquantLinear>) {
    let w = rand_vec(OUT * IN, 11);
    let bias = vec![0.5, -1.0, 0.25];
    let layer = UnquantLinear::new(w.clone(), OUT, IN, Some(bias.clone())).unwrap();
    (w, bias, Arc::new(layer))
}

fn to_sign8(layer: Arc<UnquantLinear>) -> Arc<dyn QuantMethod> {
    let target = IsqType::parse("TEST_SIGN8", 32).unwrap();
    assert_eq!(
        target,
        IsqType::Registered {
            format: FormatId::TestSign8,
            group_size: 32
        }
    );
    let n = AtomicUsize::new(0);
    let q = layer
        .apply_isq(Some(target), Device::Cpu, &n, None)
        .unwrap();
    assert_eq!(n.into_inner(), 1);
    q
}

#[test]
fn a_registered_format_is_an_isq_target_with_the_formula_forward() {
    let (w, bias, src) = source();
    let q = to_sign8(src);
    assert_eq!(
        q.dtype_and_device(),
        (WeightDType::Registered(FormatId::TestSign8), Device::Cpu)
    );
    assert_eq!(q.dtype_and_device().0.name(), "int8");
    assert!(matches!(
        q.clone().into_layer(),
        Layer::Registered {
            format: FormatId::TestSign8,
            ..
        }
    ));
    // y = x . (sign(W) * mean|W|)^T + b, in f64.
    let mean = w.iter().map(|v| v.abs() as f64).sum::<f64>() / w.len() as f64;
    let x = rand_vec(2 * IN, 12);
    let mut y = vec![0f32; 2 * OUT];
    q.forward_slice(&x, &mut y).unwrap();
    for r in 0..2 {
        for o in 0..OUT {
            let dot: f64 = (0..IN)
                .map(|i| x[r * IN + i] as f64 * (w[o * IN + i] as f64).signum())
                .sum();
            let want = dot * mean as f32 as f64 + bias[o] as f64;
            assert!((y[r * OUT + o] as f64 - want).abs() < 1e-5, "[{r}, {o}]");
        }
    }
}

#[test]
fn a_registered_format_round_trips_through_the_byte_format_by_its_tag() {
    let (_, bias, src) = source();
    let q = to_sign8(src);
    assert_eq!(QuantizedSerde::name(&*q), "test-sign8-linear");
    let bytes = QuantizedSerde::serialize(&*q).unwrap().into_owned();
    assert_eq!(bytes[4], 250, "the format's serde tag");
    let back = <dyn QuantMethod>::read_layer(Cow::Borrowed(&bytes), &Device::Cpu).unwrap();
    assert_eq!(back.serialize_layer().unwrap().into_owned(), bytes);
    assert_eq!(
        back.dequantize_w_vec().unwrap(),
        q.dequantize_w_vec().unwrap()
    );
    let (bare, b) =
        <dyn QuantMethod>::read_layer_ext_bias(Cow::Borrowed(&bytes), &Device::Cpu).unwrap();
    assert_eq!(b, Some(bias));
    assert_eq!(bare.bias(), None);
    // Corrupt bytes fail as any layer's do, naming the check.
    let mut bad = bytes.clone();
    bad[10] ^= 1;
    let err = <dyn QuantMethod>::read_layer(Cow::Borrowed(&bad), &Device::Cpu).unwrap_err();
    assert!(err.to_string().contains("CRC32"), "{err}");
}

#[test]
fn the_generic_reader_returns_the_named_classes_for_their_formats() {
    let (_, _, src) = source();
    let n = AtomicUsize::new(0);
    for (dtype, want) in [(Some(IsqType::Int8), "int8"), (None, "float32")] {
        let q = src.clone().apply_isq(dtype, Device::Cpu, &n, None).unwrap();
        let bytes = QuantizedSerde::serialize(&*q).unwrap().into_owned();
        let back = <dyn QuantMethod>::read_layer(Cow::Owned(bytes), &Device::Cpu).unwrap();
        assert_eq!(back.dtype_and_device().0.format().info().name, want);
        assert!(!matches!(back.into_layer(), Layer::Registered { .. }));
    }
}

#[test]
#[allow(clippy::needless_borrow)] // `&ParamsProbe` is the call the generated dispatch makes
fn isq_parameters_come_from_the_group_size_or_are_refused() {
    #[derive(Debug)]
    struct Custom;
    assert_eq!(
        (&ParamsProbe::<usize>(PhantomData))
            .params("f", 64)
            .unwrap(),
        64
    );
    (&ParamsProbe::<()>(PhantomData)).params("f", 64).unwrap();
    let err = (&ParamsProbe::<Custom>(PhantomData))
        .params("f", 64)
        .unwrap_err();
    assert!(err.to_string().contains("IsqParams"), "{err}");
}
