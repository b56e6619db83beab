//! Cross test: `QuantizedWeight` against vectors written by the NumPy
//! reference (`tests/data/make_int4_cases.py`), bit for bit.

use std::path::Path;

use quantrs::st::{self, Dtype};
use quantrs::QuantizedWeight;

#[test]
fn matches_numpy_reference_vectors() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/int4_cases.safetensors");
    let f = st::load(&path).expect("reading the cross-test vectors");
    let cases: Vec<(usize, usize, usize, u64)> =
        serde_json::from_str(&f.metadata["cases"]).expect("case list");
    assert!(!cases.is_empty());
    for (i, &(k, n, gs, _)) in cases.iter().enumerate() {
        let get_f32 = |name: &str| {
            st::le_to_f32(&f.get(&format!("case{i}.{name}"), Dtype::F32).unwrap().data).unwrap()
        };
        let w = get_f32("w");
        let qw = QuantizedWeight::quantize_grouped(&w, k, n, gs).unwrap();
        let data = &f.get(&format!("case{i}.data"), Dtype::U8).unwrap().data;
        assert_eq!(&qw.data, data, "case {i}: packed bytes");
        let scales = get_f32("scales");
        let same_bits = |a: &[f32], b: &[f32]| {
            a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits())
        };
        assert!(same_bits(&qw.scales, &scales), "case {i}: scales");
        assert!(
            same_bits(&qw.dequantize(), &get_f32("dequant")),
            "case {i}: dequantized"
        );
    }
}
