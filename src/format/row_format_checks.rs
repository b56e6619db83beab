//! Checks that the tests of the row-major formats share
//! (`int4_asym_tests.rs`, `int_zp_tests.rs`): the input gradient against a
//! float64 product, and the layer blob's round trip and its bad forms.

use std::borrow::Cow;

use super::WeightFormat;
use crate::error::QuantError;
use crate::linear::{Device, QuantLinear, QuantMethod, QuantizedSerde, ReadLayer};
use crate::testutil::rand_vec;

/// `F::matmul_transposed` of `w` (`[out, inp]`, dequantized `deq`) for two
/// rows of `g` is `g . W` within 1e-5 of the float64 sum.
pub(super) fn assert_grad_input<F: WeightFormat>(
    w: &F::Weight,
    deq: &[f32],
    out: usize,
    inp: usize,
) {
    let g = rand_vec(2 * out, 18);
    let mut dx = vec![0f32; 2 * inp];
    F::matmul_transposed(w, &g, 2, &mut dx).unwrap();
    for b in 0..2 {
        for i in 0..inp {
            let want: f64 = (0..out)
                .map(|o| g[b * out + o] as f64 * deq[o * inp + i] as f64)
                .sum();
            assert!(
                (dx[b * inp + i] as f64 - want).abs() < 1e-5,
                "dx [{b}, {i}]"
            );
        }
    }
}

/// The layer blob of `w` (no bias): tagged with the format's serde tag,
/// read back to the same bytes and the same dequantized weight; returns it.
pub(super) fn blob_round_trips<F: WeightFormat>(w: &F::Weight) -> Vec<u8> {
    let layer = QuantLinear::<F>::from_weight(w.clone(), None).unwrap();
    let bytes = QuantizedSerde::serialize(&layer).unwrap().into_owned();
    assert_eq!(bytes[4], F::INFO.serde_tag);
    let back = <dyn QuantMethod>::read_layer(Cow::Borrowed(&bytes), &Device::Cpu).unwrap();
    assert_eq!(back.serialize_layer().unwrap().into_owned(), bytes);
    assert_eq!(back.dequantize_w_vec().unwrap(), F::dequantize(w));
    bytes
}

/// The blob `bytes` with its body changed by `edit` and the CRC recomputed
/// is refused as a serialization error whose text contains `needle`; the
/// blob without its CRC fails too.
pub(super) fn assert_bad_blobs(bytes: &[u8], edit: impl FnOnce(&mut [u8]), needle: &str) {
    let n = bytes.len() - 4;
    let mut bad = bytes[..n].to_vec();
    edit(&mut bad);
    let crc = crc32fast::hash(&bad);
    bad.extend_from_slice(&crc.to_le_bytes());
    let err = <dyn QuantMethod>::read_layer(Cow::Borrowed(&bad), &Device::Cpu).unwrap_err();
    assert!(matches!(err, QuantError::Serialization(_)), "{err}");
    assert!(err.to_string().contains(needle), "{err}");
    let err = <dyn QuantMethod>::read_layer(Cow::Borrowed(&bytes[..n]), &Device::Cpu).unwrap_err();
    assert!(matches!(err, QuantError::Serialization(_)), "{err}");
}
