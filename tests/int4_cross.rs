//! Cross test: `QuantizedWeight` against vectors written by the NumPy
//! reference (`tests/data/make_int4_cases.py`), bit for bit. The file is
//! read with the `safetensors` crate itself, not the crate's own reader.

use std::path::Path;

use quantrs::QuantizedWeight;
use safetensors::{Dtype, SafeTensors};

#[test]
fn matches_numpy_reference_vectors() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/int4_cases.safetensors");
    let bytes = std::fs::read(&path).expect("reading the cross-test vectors");
    let (_, meta) = SafeTensors::read_metadata(&bytes).expect("safetensors header");
    let cases: Vec<(usize, usize, usize, u64)> =
        serde_json::from_str(&meta.metadata().as_ref().expect("metadata")["cases"])
            .expect("case list");
    let f = SafeTensors::deserialize(&bytes).expect("safetensors file");
    assert!(!cases.is_empty());
    let raw = |name: String, dtype: Dtype| {
        let t = f.tensor(&name).unwrap();
        assert_eq!(t.dtype(), dtype, "{name}");
        t.data().to_vec()
    };
    for (i, &(k, n, gs, _)) in cases.iter().enumerate() {
        let get_f32 = |name: &str| -> Vec<f32> {
            raw(format!("case{i}.{name}"), Dtype::F32)
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect()
        };
        let w = get_f32("w");
        let qw = QuantizedWeight::quantize_grouped(&w, k, n, gs).unwrap();
        assert_eq!(
            qw.data(),
            raw(format!("case{i}.data"), Dtype::U8),
            "case {i}: packed bytes"
        );
        let scales = get_f32("scales");
        let same_bits = |a: &[f32], b: &[f32]| {
            a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits())
        };
        assert!(same_bits(qw.scales(), &scales), "case {i}: scales");
        assert!(
            same_bits(&qw.dequantize(), &get_f32("dequant")),
            "case {i}: dequantized"
        );
    }
}
