//! `QuantizedWeight` and the linear layers held on a device.
//!
//! A device object keeps only device memory (no host copy); `to_cpu`
//! copies it back and rebuilds the CPU object through its validating
//! constructor, so serializing a device object gives exactly the bytes of
//! its CPU twin. The fields are private: the buffers' sizes are what the
//! kernels rely on, checked once when the object is built from its CPU
//! twin. Inputs and outputs are typed views checked against the shapes;
//! the kernels are queued (docs/gpu.md, "Streams").

use std::sync::Arc;

use super::context::Gpu;
use super::memory::{check_view, DeviceBuffer, DeviceSlice, DeviceSliceMut};
use super::ops::{self, Int4Args, LinearArgs, LinearKind};
use crate::error::{QuantError, Result};
use crate::int4::QuantizedWeight;
use crate::linear::{
    Int4Linear, Int8Linear, Layer, PerTensorFP8Linear, QuantMethod, UnquantLinear, WeightDType,
};

/// A packed INT4 weight (`QuantizedWeight`) on a device.
#[derive(Debug)]
pub struct DeviceQuantizedWeight {
    data: DeviceBuffer,
    scales: DeviceBuffer,
    in_feat: usize,
    out_feat: usize,
    num_groups: usize,
}

impl DeviceQuantizedWeight {
    /// A copy of the CPU weight `w` on `gpu`.
    pub fn from_cpu(gpu: &Arc<Gpu>, w: &QuantizedWeight) -> Result<Self> {
        Ok(DeviceQuantizedWeight {
            data: DeviceBuffer::from_host(gpu, w.data())?,
            scales: DeviceBuffer::from_host(gpu, w.scales())?,
            in_feat: w.in_feat(),
            out_feat: w.out_feat(),
            num_groups: w.num_groups(),
        })
    }

    /// The device holding the weight.
    pub fn gpu(&self) -> &Arc<Gpu> {
        self.data.gpu()
    }

    /// The CPU twin, rebuilt from copies of the device data.
    pub fn to_cpu(&self) -> Result<QuantizedWeight> {
        QuantizedWeight::from_parts(
            self.data.to_host()?,
            self.scales.to_host()?,
            self.in_feat,
            self.out_feat,
            self.num_groups,
        )
    }

    /// Input features (rows of `W [in_feat, out_feat]`).
    pub fn in_feat(&self) -> usize {
        self.in_feat
    }

    /// Output features.
    pub fn out_feat(&self) -> usize {
        self.out_feat
    }

    /// Scale groups along the input dimension.
    pub fn num_groups(&self) -> usize {
        self.num_groups
    }

    /// Packed rows (two input features a byte).
    pub fn num_pairs(&self) -> usize {
        self.data.bytes() / self.out_feat
    }

    /// Input features per scale group.
    pub fn group_size(&self) -> usize {
        2 * self.num_pairs() / self.num_groups
    }

    /// Device bytes of packed data plus scales.
    pub fn nbytes(&self) -> usize {
        self.data.bytes() + self.scales.bytes()
    }

    fn args(&self) -> Int4Args {
        Int4Args {
            data: self.data.ptr(),
            scales: self.scales.ptr(),
            in_feat: self.in_feat,
            out_feat: self.out_feat,
            num_groups: self.num_groups,
            num_pairs: self.num_pairs(),
        }
    }

    /// Queue `y [batch, out_feat] = x [batch, in_feat] @ W` (row-major).
    pub fn matmul(
        &self,
        x: &DeviceSlice<'_, f32>,
        batch: usize,
        y: &mut DeviceSliceMut<'_, f32>,
    ) -> Result<()> {
        self.matmul_bias(x, batch, None, y)
    }

    /// `matmul` plus `bias [out_feat]` (checked by the caller).
    fn matmul_bias(
        &self,
        x: &DeviceSlice<'_, f32>,
        batch: usize,
        bias: Option<&DeviceBuffer>,
        y: &mut DeviceSliceMut<'_, f32>,
    ) -> Result<()> {
        let g = self.gpu();
        check_view(g, "x", x.gpu(), x.len(), batch * self.in_feat)?;
        check_view(g, "y", y.gpu(), y.len(), batch * self.out_feat)?;
        let b = bias.map_or(0, DeviceBuffer::ptr);
        // SAFETY: the weight's buffers were sized from a validated
        // `QuantizedWeight` and are private; x and y are views of the
        // checked lengths on this device (y borrowed mutably: no overlap);
        // the bias is `out_feat` f32 of the layer (`DeviceLinear`).
        unsafe { ops::int4_matmul(g, &self.args(), x.ptr(), batch, b, y.ptr()) }
    }
}

/// The weight storage of a device layer.
#[derive(Debug)]
pub enum DeviceWeight {
    /// `UnquantLinear`: f32 `[out, in]`.
    F32(DeviceBuffer),
    /// `Int8Linear`: int8 `[out, in]` and one f32 scale per output.
    Int8 {
        /// The int8 weight.
        q: DeviceBuffer,
        /// Per-output scales.
        scales: DeviceBuffer,
    },
    /// `PerTensorFP8Linear`: E4M3 codes `[out, in]`.
    Fp8 {
        /// The E4M3 codes.
        codes: DeviceBuffer,
        /// The weight's dequantization multiplier.
        weight_scale_inv: f32,
        /// W8A8: the activation scale.
        activation_scale: Option<f32>,
    },
    /// `Int4Linear`: the packed INT4 weight.
    Int4(DeviceQuantizedWeight),
}

/// A linear layer (`UnquantLinear`, `Int8Linear`, `PerTensorFP8Linear`,
/// `Int4Linear`) on a device.
#[derive(Debug)]
pub struct DeviceLinear {
    gpu: Arc<Gpu>,
    weight: DeviceWeight,
    bias: Option<DeviceBuffer>,
    out_feat: usize,
    in_feat: usize,
}

fn bias_of(gpu: &Arc<Gpu>, b: Option<&[f32]>) -> Result<Option<DeviceBuffer>> {
    b.map(|b| DeviceBuffer::from_host(gpu, b)).transpose()
}

impl DeviceLinear {
    /// Copy a CPU layer onto `gpu`. Expert-stacked FP8 weights are refused.
    pub fn from_layer(gpu: &Arc<Gpu>, layer: &Layer) -> Result<Self> {
        let (weight, bias, out_feat, in_feat) = match layer {
            Layer::Unquant(l) => (
                DeviceWeight::F32(DeviceBuffer::from_host(gpu, l.weight())?),
                bias_of(gpu, l.bias())?,
                l.out_features(),
                l.in_features(),
            ),
            Layer::Int8(l) => (
                DeviceWeight::Int8 {
                    q: DeviceBuffer::from_host(gpu, l.q())?,
                    scales: DeviceBuffer::from_host(gpu, l.scales())?,
                },
                bias_of(gpu, l.bias())?,
                l.out_features(),
                l.in_features(),
            ),
            Layer::Fp8(l) => {
                if l.shape().len() != 2 {
                    return Err(QuantError::UnsupportedOperation(format!(
                        "moving expert-stacked FP8 weights {:?} to a GPU (only [out, in] layers run there)",
                        l.shape()
                    )));
                }
                (
                    DeviceWeight::Fp8 {
                        codes: DeviceBuffer::from_host(gpu, l.weight())?,
                        weight_scale_inv: l.weight_scale_inv(),
                        activation_scale: l.activation_scale(),
                    },
                    bias_of(gpu, l.bias())?,
                    l.out_features(),
                    l.in_features(),
                )
            }
            Layer::Int4(l) => (
                DeviceWeight::Int4(DeviceQuantizedWeight::from_cpu(gpu, l.qweight())?),
                bias_of(gpu, l.bias())?,
                l.out_features(),
                l.in_features(),
            ),            Layer::Registered { format, .. } => {
                return Err(QuantError::UnsupportedOperation(format!(
                    "moving a {} layer to a GPU: the format has no GPU kernels (it runs on the CPU)",
                    format.info().name
                )))
            }
        };
        Ok(DeviceLinear {
            gpu: gpu.clone(),
            weight,
            bias,
            out_feat,
            in_feat,
        })
    }

    /// The device holding the layer.
    pub fn gpu(&self) -> &Arc<Gpu> {
        &self.gpu
    }

    /// The weight storage.
    pub fn weight(&self) -> &DeviceWeight {
        &self.weight
    }

    /// Input features.
    pub fn in_features(&self) -> usize {
        self.in_feat
    }

    /// Output features.
    pub fn out_features(&self) -> usize {
        self.out_feat
    }

    /// The CPU twin, rebuilt from copies of the device data.
    pub fn to_cpu(&self) -> Result<Arc<dyn QuantMethod>> {
        let bias = self.bias.as_ref().map(|b| b.to_host()).transpose()?;
        let (o, i) = (self.out_feat, self.in_feat);
        Ok(match &self.weight {
            DeviceWeight::F32(w) => Arc::new(UnquantLinear::new(w.to_host()?, o, i, bias)?),
            DeviceWeight::Int8 { q, scales } => Arc::new(Int8Linear::new(
                q.to_host()?,
                scales.to_host()?,
                o,
                i,
                bias,
            )?),
            DeviceWeight::Fp8 {
                codes,
                weight_scale_inv,
                activation_scale,
            } => Arc::new(PerTensorFP8Linear::new(
                codes.to_host()?,
                vec![o, i],
                *weight_scale_inv,
                *activation_scale,
                bias,
            )?),
            DeviceWeight::Int4(w) => Arc::new(Int4Linear::new(w.to_cpu()?, bias)?),
        })
    }

    /// The storage dtype, as `dtype_and_device` reports it.
    pub fn dtype(&self) -> WeightDType {
        match self.weight {
            DeviceWeight::F32(_) => WeightDType::F32,
            DeviceWeight::Int8 { .. } => WeightDType::I8,
            DeviceWeight::Fp8 { .. } => WeightDType::F8E4M3,
            DeviceWeight::Int4(_) => WeightDType::I4,
        }
    }

    /// Device bytes of weight, scales and bias.
    pub fn nbytes(&self) -> usize {
        let w = match &self.weight {
            DeviceWeight::F32(w) => w.bytes(),
            DeviceWeight::Int8 { q, scales } => q.bytes() + scales.bytes(),
            DeviceWeight::Fp8 { codes, .. } => codes.bytes(),
            DeviceWeight::Int4(w) => w.nbytes(),
        };
        w + self.bias.as_ref().map_or(0, |b| b.bytes())
    }

    /// Queue `y [rows, out] = x [rows, in] . W^T + bias` (row-major).
    pub fn forward(
        &self,
        x: &DeviceSlice<'_, f32>,
        rows: usize,
        y: &mut DeviceSliceMut<'_, f32>,
    ) -> Result<()> {
        check_view(&self.gpu, "x", x.gpu(), x.len(), rows * self.in_feat)?;
        check_view(&self.gpu, "y", y.gpu(), y.len(), rows * self.out_feat)?;
        let bias = self.bias.as_ref().map_or(0, |b| b.ptr());
        let args = |kind, weight, row_scale, mult, act_scale| LinearArgs {
            kind,
            weight,
            row_scale,
            mult,
            act_scale,
            bias,
            out_feat: self.out_feat,
            in_feat: self.in_feat,
        };
        let l = match &self.weight {
            DeviceWeight::F32(w) => args(LinearKind::F32, w.ptr(), 0, 1.0, None),
            DeviceWeight::Int8 { q, scales } => {
                args(LinearKind::I8, q.ptr(), scales.ptr(), 1.0, None)
            }
            DeviceWeight::Fp8 {
                codes,
                weight_scale_inv,
                activation_scale,
            } => {
                // The CPU's multiplier: s_a * s_w with an activation scale, else s_w.
                let mult = activation_scale.map_or(*weight_scale_inv, |a| a * weight_scale_inv);
                args(LinearKind::Fp8E4M3, codes.ptr(), 0, mult, *activation_scale)
            }
            DeviceWeight::Int4(w) => return w.matmul_bias(x, rows, self.bias.as_ref(), y),
        };
        // SAFETY: the layer's buffers were sized from a validated CPU layer
        // (`out_feat x in_feat` weight, `out_feat` scales and bias) and are
        // private; x and y are views of the checked lengths on this device
        // (y borrowed mutably: no overlap).
        unsafe { ops::linear_forward(&self.gpu, &l, x.ptr(), rows, y.ptr()) }
    }
}
