//! The per-tensor FP8 checkpoint dialects `PerTensorFP8Linear::from_safetensors`
//! reads, told apart by tensor names and scale shapes (docs/checkpoints.md):
//!
//! | dialect              | weight scale                     | activation scale      |
//! |----------------------|----------------------------------|-----------------------|
//! | `compressed-tensors` | `weight_scale` `[1]` (F32/BF16/F16) | `input_scale` `[1]` |
//! | `fp8` (AutoFP8/vLLM) | `weight_scale` `[]` F32          | `input_scale` `[]`    |
//! | `mistralrs`          | `weight_scale_inv` `[]` F32      | `activation_scale` `[]` |
//!
//! All three mean the same thing: `W = decode(codes) * scale` and, when an
//! activation scale exists, `x_q = encode(x / s_a)`. Per-channel scales
//! (`weight_scale` `[out, 1]` / `[out]`) and 128x128 block scales
//! (`weight_scale_inv` `[ceil(out/128), ceil(in/128)]`) are not per-tensor: they
//! are refused here with the reason, and `quantrs.formats.load_fp8(...,
//! requantize=True)` re-quantizes them per tensor with the error reported.
//! Kept apart from the layer so the layer's file holds only the kernels.

use crate::error::{QuantError, Result};
use crate::st::{Dtype, OwnedTensor, StFile};

/// The tensors of one per-tensor FP8 layer, in `PerTensorFP8Linear::new` terms.
#[derive(Clone, Debug)]
pub(crate) struct Fp8Parts {
    /// Which dialect the names matched (checked by the tests; `quantrs inspect`
    /// names dialects on the Python side).
    #[cfg_attr(not(test), allow(dead_code))]
    pub dialect: &'static str,
    pub codes: Vec<u8>,
    pub shape: Vec<usize>,
    pub weight_scale: f32,
    pub activation_scale: Option<f32>,
    pub bias: Option<Vec<f32>>,
}

/// IEEE half (binary16) bits to f32, exact (every half is an f32).
pub(crate) fn f16_to_f32(h: u16) -> f32 {
    let sign = if h & 0x8000 != 0 { -1.0f32 } else { 1.0 };
    let exp = i32::from((h >> 10) & 0x1F);
    let man = f32::from(h & 0x3FF);
    match exp {
        0 => sign * man * 2f32.powi(-24),
        31 if man == 0.0 => sign * f32::INFINITY,
        31 => f32::NAN,
        _ => sign * (1.0 + man / 1024.0) * 2f32.powi(exp - 15),
    }
}

/// A float tensor (F32, F16 or BF16) as f32 values.
pub(crate) fn float_values(name: &str, t: &OwnedTensor) -> Result<Vec<f32>> {
    let pairs = || {
        t.data
            .chunks_exact(2)
            .map(|c| u16::from_le_bytes([c[0], c[1]]))
    };
    match t.dtype {
        Dtype::F32 => crate::st::le_to_f32(&t.data),
        Dtype::F16 => Ok(pairs().map(f16_to_f32).collect()),
        Dtype::BF16 => Ok(pairs()
            .map(|b| f32::from_bits(u32::from(b) << 16))
            .collect()),
        d => Err(QuantError::ser(format!(
            "tensor {name:?}: expected dtype F32, F16 or BF16, got {d}"
        ))),
    }
}

/// Read the per-tensor FP8 layer `prefix` (`""` for top-level names) of `f`.
pub(crate) fn read_per_tensor(f: &StFile, prefix: &str) -> Result<Fp8Parts> {
    let key = |s: &str| match prefix {
        "" => s.to_string(),
        p => format!("{p}.{s}"),
    };
    let wkey = key("weight");
    let w = f
        .tensors
        .get(&wkey)
        .ok_or_else(|| QuantError::ser(format!("missing tensor {wkey:?}")))?;
    if w.dtype != Dtype::F8_E4M3 {
        return Err(QuantError::ser(format!(
            "tensor {wkey:?}: expected dtype F8_E4M3, got {}",
            w.dtype
        )));
    }
    let get = |s: &str| f.tensors.get(&key(s)).map(|t| (key(s), t));
    let (dialect, (sname, st), act) = if let Some(s) = get("weight_scale_inv") {
        ("mistralrs", s, get("activation_scale"))
    } else if let Some(s) = get("weight_scale") {
        let d = if s.1.shape.is_empty() && s.1.dtype == Dtype::F32 {
            "fp8"
        } else {
            "compressed-tensors"
        };
        (d, s, get("input_scale"))
    } else {
        return Err(QuantError::ser(format!(
            "missing tensor {:?} (compressed-tensors / AutoFP8) or {:?} (mistral.rs): no \
             per-tensor FP8 weight scale for {wkey:?}",
            key("weight_scale"),
            key("weight_scale_inv")
        )));
    };
    let scale = per_tensor_scale(&sname, st, &w.shape)?;
    let activation_scale = match act {
        Some((aname, a)) => Some(per_tensor_scale(&aname, a, &w.shape)?),
        None => None,
    };
    let bias = match get("bias") {
        Some((bname, b)) => Some(float_values(&bname, b)?),
        None => None,
    };
    Ok(Fp8Parts {
        dialect,
        codes: w.data.clone(),
        shape: w.shape.clone(),
        weight_scale: scale,
        activation_scale,
        bias,
    })
}

/// The one value of a per-tensor scale, or an error saying which kind of
/// non-per-tensor scale it is.
fn per_tensor_scale(name: &str, t: &OwnedTensor, wshape: &[usize]) -> Result<f32> {
    let n: usize = t.shape.iter().product();
    if n != 1 {
        let kind = match (t.shape.as_slice(), wshape) {
            ([o, 1], [wo, _]) | ([o], [wo, _]) if o == wo => "per-channel scales",
            ([a, b], [wo, wi]) if *a == wo.div_ceil(128) && *b == wi.div_ceil(128) => {
                "128x128 block scales"
            }
            _ => "scales of an unknown layout",
        };
        return Err(QuantError::ser(format!(
            "{name}: shape {:?} holds {kind}, expected a scalar (one per-tensor scale); \
             quantrs.formats.load_fp8(path, prefix, requantize=True) re-quantizes it per tensor",
            t.shape
        )));
    }
    Ok(float_values(name, t)?[0])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn f16_to_f32_matches_known_values() {
        for (h, v) in [
            (0x3C00u16, 1.0f32),
            (0xC000, -2.0),
            (0x7BFF, 65504.0),
            (0x0001, 2f32.powi(-24)),
            (0x0400, 2f32.powi(-14)),
            (0x3555, 0.333_251_95),
            (0x8000, -0.0),
        ] {
            assert_eq!(f16_to_f32(h), v, "{h:#06x}");
        }
        assert!(f16_to_f32(0x7E00).is_nan());
        assert_eq!(f16_to_f32(0xFC00), f32::NEG_INFINITY);
    }

    fn file(tensors: &[(&str, Dtype, Vec<usize>, Vec<u8>)]) -> StFile {
        let views: Vec<_> = tensors
            .iter()
            .map(|(n, d, s, b)| (*n, *d, s.clone(), b.as_slice()))
            .collect();
        crate::st::from_bytes(&crate::st::to_bytes(&views, Default::default()).unwrap()).unwrap()
    }

    #[test]
    fn reads_each_dialect_and_refuses_non_per_tensor_scales() {
        let codes = vec![0x38u8; 6]; // E4M3 1.0
        let w = ("l.weight", Dtype::F8_E4M3, vec![2, 3], codes);
        let bf16 = |v: f32| ((v.to_bits() >> 16) as u16).to_le_bytes().to_vec();
        let f32b = |v: f32| v.to_le_bytes().to_vec();
        let cases = [
            (
                "compressed-tensors",
                "weight_scale",
                Dtype::BF16,
                vec![1],
                bf16(0.5),
                "input_scale",
            ),
            (
                "fp8",
                "weight_scale",
                Dtype::F32,
                vec![],
                f32b(0.5),
                "input_scale",
            ),
            (
                "mistralrs",
                "weight_scale_inv",
                Dtype::F32,
                vec![],
                f32b(0.5),
                "activation_scale",
            ),
        ];
        for (dialect, sname, dt, shape, bytes, aname) in cases {
            let f = file(&[
                w.clone(),
                (&format!("l.{sname}"), dt, shape.clone(), bytes.clone()),
                (&format!("l.{aname}"), dt, shape, bytes),
            ]);
            let p = read_per_tensor(&f, "l").unwrap();
            assert_eq!(p.dialect, dialect);
            assert_eq!((p.weight_scale, p.activation_scale), (0.5, Some(0.5)));
            assert_eq!((p.shape, p.codes), (vec![2, 3], vec![0x38; 6]));
        }
        let per_channel = file(&[
            w.clone(),
            (
                "l.weight_scale",
                Dtype::F32,
                vec![2, 1],
                [f32b(1.0), f32b(2.0)].concat(),
            ),
        ]);
        let e = read_per_tensor(&per_channel, "l").unwrap_err().to_string();
        assert!(
            e.contains("per-channel") && e.contains("requantize=True"),
            "{e}"
        );
        let block = file(&[
            w,
            ("l.weight_scale_inv", Dtype::F32, vec![1, 1, 1], f32b(1.0)),
        ]);
        assert!(read_per_tensor(&block, "l").is_ok()); // one value is per-tensor
    }
}
