//! The grid of the view: one quantizer per tensor (the seed's grid), or the
//! grid a serving layer stores (docs/qat.md "Deploy grid").
//!
//! The deploy view of a 2-D weight `[out_features, in_features]` is the
//! serving format's own quantize-then-dequantize (`WeightFormat::quantize`
//! then `dequantize`, the calls `QuantLinear::quantize` / `dequantize_w`
//! make), applied to the master rounded to f32 (what a serving layer is
//! built from). No grid rule is written a second time here, so the view is,
//! bit for bit, what the served layer computes with:
//! - INT4: `Int4` (`QuantizedWeight`): one `max(absmax / 7, 1e-8)` scale per
//!   `group_size` inputs of each output;
//! - INT8: `Int8` (`Int8Linear`): one `absmax / 127` scale per output row;
//! - FP8 E4M3: `Fp8E4M3` (`PerTensorFP8Linear`): one `absmax / 448` scale
//!   per tensor, saturating codes.

use super::config::{IntDtype, QatConfig, QuantScheme, QuantTarget, RoundingMode};
use super::element::Master;
use crate::error::{QuantError, Result};
use crate::format::{Fp8E4M3, Int4, Int8, WeightFormat};
use crate::fp8::Fp8Format;

/// The shape and grouping of a deploy grid.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct DeployGrid {
    /// Rows of the weight (outputs).
    pub out_features: usize,
    /// Columns of the weight (inputs).
    pub in_features: usize,
    /// INT4 inputs per scale (even, >= 2; ignored by INT8 and FP8).
    pub group_size: usize,
}

/// Which grid the fake-quantized view lies on.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum QatGrid {
    /// One quantizer for the whole tensor, calibrated on the master's range
    /// after every step (the default).
    #[default]
    PerTensor,
    /// The serving layer's grid for a row-major `[out, in]` weight.
    Deploy(DeployGrid),
}

impl QatGrid {
    /// The deploy grid of a `[out_features, in_features]` weight.
    pub fn deploy(out_features: usize, in_features: usize, group_size: usize) -> QatGrid {
        QatGrid::Deploy(DeployGrid {
            out_features,
            in_features,
            group_size,
        })
    }

    /// Check the grid against the configuration and the master's length:
    /// a deploy grid needs a target with a serving layer (int4, int8,
    /// fp8_e4m3), the symmetric scheme and nearest rounding (as the serving
    /// quantizers), an even `group_size >= 2` and `out * in == len`.
    pub(crate) fn validate(&self, config: &QatConfig, len: usize) -> Result<()> {
        let QatGrid::Deploy(g) = self else {
            return Ok(());
        };
        if matches!(config.target, QuantTarget::Fp8(Fp8Format::E5M2)) {
            return Err(QuantError::arg(
                "target: the deploy grid expects 'int4', 'int8' or 'fp8_e4m3' (the targets \
                 with a serving layer), got 'fp8_e5m2'",
            ));
        }
        if config.scheme != QuantScheme::Symmetric {
            return Err(QuantError::arg(
                "scheme: the deploy grid is symmetric (as the serving layers), got 'affine'",
            ));
        }
        if config.rounding != RoundingMode::Nearest {
            return Err(QuantError::arg(
                "rounding: the deploy grid rounds to nearest (as the serving quantizers), \
                 got 'stochastic'",
            ));
        }
        if g.group_size < 2 || !g.group_size.is_multiple_of(2) {
            return Err(QuantError::arg(format!(
                "group_size: expected an even number >= 2, got {}",
                g.group_size
            )));
        }
        let n = g.out_features.checked_mul(g.in_features);
        if g.out_features == 0 || g.in_features == 0 || n != Some(len) {
            return Err(QuantError::dims(
                "master",
                format!(
                    "out_features * in_features = {} * {} elements",
                    g.out_features, g.in_features
                ),
                len,
            ));
        }
        Ok(())
    }
}

/// The serving format's dequantized weight for `master`, written to `view`.
/// Errors only for a master the format refuses (non-finite values; the
/// optimizer checks those first).
pub(crate) fn fill_view<T: Master>(
    master: &[T],
    view: &mut [T],
    target: QuantTarget,
    g: &DeployGrid,
) -> Result<()> {
    let w: Vec<f32> = master.iter().map(|&x| x.into() as f32).collect();
    let (o, i) = (g.out_features, g.in_features);
    let deq = match target {
        QuantTarget::Int(IntDtype::Int4) => {
            Int4::dequantize(&Int4::quantize(&w, o, i, g.group_size)?)
        }
        QuantTarget::Int(IntDtype::Int8) => Int8::dequantize(&Int8::quantize(&w, o, i, ())?),
        QuantTarget::Fp8(Fp8Format::E4M3) => Fp8E4M3::dequantize(&Fp8E4M3::quantize(&w, o, i, ())?),
        QuantTarget::Fp8(Fp8Format::E5M2) => {
            return Err(QuantError::arg("target: fp8_e5m2 has no serving layer"))
        }
    };
    for (v, &d) in view.iter_mut().zip(&deq) {
        *v = T::from_f64(d as f64);
    }
    Ok(())
}
