//! `apply_isq`: in-situ quantization of any layer into another format,
//! shared by every `QuantMethod` implementation (dequantize, re-quantize).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use super::{
    Device, Int4Linear, Int8Linear, IsqType, Layer, PerTensorFP8Linear, QuantMethod, UnquantLinear,
};
use crate::error::{QuantError, Result};
use crate::format::FormatId;

/// Convert `layer` to `dtype` (`None`: unquantized f32). An FP8 source's
/// activation scale is kept by an FP8 target (it describes the activations,
/// which do not change). `imatrix_weight` (`[in]`, finite, >= 0) only
/// applies to INT4 targets.
pub(crate) fn convert(
    layer: &Layer,
    dtype: Option<IsqType>,
    device: Device,
    n_quantized: &AtomicUsize,
    imatrix_weight: Option<Vec<f32>>,
) -> Result<Arc<dyn QuantMethod>> {
    let (src, act_scale): (&dyn QuantMethod, Option<f32>) = match layer {
        Layer::Fp8(l) => (&**l, l.activation_scale()),
        Layer::Unquant(l) => (&**l, None),
        Layer::Int8(l) => (&**l, None),
        Layer::Int4(l) => (&**l, None),
    };
    device.require_cpu()?;
    let shape = src.weight_shape();
    let in_feat = src.in_features();
    if let Some(im) = &imatrix_weight {
        if !matches!(dtype, Some(IsqType::Int4 { .. })) {
            return Err(QuantError::arg(
                "imatrix_weight only applies to int4 targets (it weights the group-scale search)",
            ));
        }
        if im.len() != in_feat {
            return Err(QuantError::dims(
                "imatrix_weight",
                format!("[{in_feat}]"),
                format!("[{}]", im.len()),
            ));
        }
        if let Some(i) = im.iter().position(|v| !(v.is_finite() && *v >= 0.0)) {
            return Err(QuantError::arg(format!(
                "imatrix_weight[{i}]: expected finite and >= 0, got {}",
                im[i]
            )));
        }
    }
    if shape.len() != 2 && dtype != Some(IsqType::Fp8E4M3) {
        return Err(QuantError::UnsupportedOperation(format!(
            "expert-stacked weights {shape:?} only convert to fp8_e4m3"
        )));
    }
    let w = src.dequantize_w_vec()?;
    let bias = src.bias().map(<[f32]>::to_vec);
    let out_feat = src.out_features();
    let Some(target) = dtype else {
        return Ok(Arc::new(UnquantLinear::new(w, out_feat, in_feat, bias)?));
    };
    // One arm per registered format: its layer's constructor from floats.
    let layer: Arc<dyn QuantMethod> = match target.format() {
        FormatId::Float32 => Arc::new(UnquantLinear::new(w, out_feat, in_feat, bias)?),
        FormatId::Fp8E4M3 => Arc::new(PerTensorFP8Linear::from_float(&w, shape, bias, act_scale)?),
        FormatId::Int8 => Arc::new(Int8Linear::from_float(&w, out_feat, in_feat, bias)?),
        FormatId::Int4 => {
            let group_size = match target {
                IsqType::Int4 { group_size } => group_size,
                _ => crate::int4::DEFAULT_GROUP_SIZE,
            };
            Arc::new(Int4Linear::from_float(
                &w,
                out_feat,
                in_feat,
                group_size,
                bias,
                imatrix_weight.as_deref(),
            )?)
        }
        // The GGUF block formats are loaded from files, not an ISQ target.
        other => {
            return Err(QuantError::UnsupportedOperation(format!(
                "{} is not an ISQ target",
                other.info().name
            )))
        }
    };
    n_quantized.fetch_add(1, Ordering::Relaxed);
    Ok(layer)
}
