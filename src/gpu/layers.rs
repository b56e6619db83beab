//! `QuantizedWeight` and the linear layers held on a device.
//!
//! A device object keeps only device memory (no host copy); `to_cpu`
//! copies it back and rebuilds the CPU object through its validating
//! constructor, so serializing a device object gives exactly the bytes of
//! its CPU twin.

use std::sync::Arc;

use super::context::Gpu;
use super::memory::{to_host, DeviceBuffer};
use super::ops::{self, Int4Args, LinearArgs, LinearKind, Wait};
use crate::error::{QuantError, Result};
use crate::int4::QuantizedWeight;
use crate::linear::{
    Int4Linear, Int8Linear, Layer, PerTensorFP8Linear, QuantMethod, UnquantLinear, WeightDType,
};

/// A packed INT4 weight on a device.
#[derive(Debug)]
pub struct DeviceQuantizedWeight {
    pub data: DeviceBuffer,
    pub scales: DeviceBuffer,
    pub in_feat: usize,
    pub out_feat: usize,
    pub num_groups: usize,
}

impl DeviceQuantizedWeight {
    pub fn from_cpu(gpu: &Arc<Gpu>, w: &QuantizedWeight) -> Result<Self> {
        Ok(DeviceQuantizedWeight {
            data: DeviceBuffer::from_host(gpu, w.data())?,
            scales: DeviceBuffer::from_host(gpu, w.scales())?,
            in_feat: w.in_feat(),
            out_feat: w.out_feat(),
            num_groups: w.num_groups(),
        })
    }

    pub fn gpu(&self) -> &Arc<Gpu> {
        &self.data.gpu
    }

    pub fn to_cpu(&self) -> Result<QuantizedWeight> {
        let g = self.gpu();
        QuantizedWeight::from_parts(
            to_host(g, self.data.ptr(), self.data.bytes())?,
            to_host(g, self.scales.ptr(), self.scales.bytes() / 4)?,
            self.in_feat,
            self.out_feat,
            self.num_groups,
        )
    }

    pub fn num_pairs(&self) -> usize {
        self.data.bytes() / self.out_feat
    }

    pub fn group_size(&self) -> usize {
        2 * self.num_pairs() / self.num_groups
    }

    pub fn nbytes(&self) -> usize {
        self.data.bytes() + self.scales.bytes()
    }

    pub fn args(&self) -> Int4Args {
        Int4Args {
            data: self.data.ptr(),
            scales: self.scales.ptr(),
            in_feat: self.in_feat,
            out_feat: self.out_feat,
            num_groups: self.num_groups,
            num_pairs: self.num_pairs(),
        }
    }

    /// `y [batch, out] = x [batch, in] @ W (+ bias)` on device addresses.
    pub fn matmul(&self, x: u64, batch: usize, bias: u64, y: u64, wait: Wait) -> Result<()> {
        ops::int4_matmul(self.gpu(), &self.args(), x, batch, bias, y, wait)
    }
}

/// The weight storage of a device layer.
#[derive(Debug)]
pub enum DeviceWeight {
    F32(DeviceBuffer),
    Int8 {
        q: DeviceBuffer,
        scales: DeviceBuffer,
    },
    Fp8 {
        codes: DeviceBuffer,
        weight_scale_inv: f32,
        activation_scale: Option<f32>,
    },
    Int4(DeviceQuantizedWeight),
}

/// A linear layer on a device.
#[derive(Debug)]
pub struct DeviceLinear {
    pub gpu: Arc<Gpu>,
    pub weight: DeviceWeight,
    pub bias: Option<DeviceBuffer>,
    pub out_feat: usize,
    pub in_feat: usize,
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
            ),
        };
        Ok(DeviceLinear {
            gpu: gpu.clone(),
            weight,
            bias,
            out_feat,
            in_feat,
        })
    }

    /// The CPU twin, rebuilt from copies of the device data.
    pub fn to_cpu(&self) -> Result<Arc<dyn QuantMethod>> {
        let g = &self.gpu;
        let bias = self
            .bias
            .as_ref()
            .map(|b| to_host::<f32>(g, b.ptr(), self.out_feat))
            .transpose()?;
        let (o, i) = (self.out_feat, self.in_feat);
        Ok(match &self.weight {
            DeviceWeight::F32(w) => {
                Arc::new(UnquantLinear::new(to_host(g, w.ptr(), o * i)?, o, i, bias)?)
            }
            DeviceWeight::Int8 { q, scales } => Arc::new(Int8Linear::new(
                to_host(g, q.ptr(), o * i)?,
                to_host(g, scales.ptr(), o)?,
                o,
                i,
                bias,
            )?),
            DeviceWeight::Fp8 {
                codes,
                weight_scale_inv,
                activation_scale,
            } => Arc::new(PerTensorFP8Linear::new(
                to_host(g, codes.ptr(), o * i)?,
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

    /// `y [rows, out] = x [rows, in] . W^T + bias` on device addresses.
    pub fn forward(&self, x: u64, rows: usize, y: u64, wait: Wait) -> Result<()> {
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
        match &self.weight {
            DeviceWeight::F32(w) => ops::linear_forward(
                &self.gpu,
                &args(LinearKind::F32, w.ptr(), 0, 1.0, None),
                x,
                rows,
                y,
                wait,
            ),
            DeviceWeight::Int8 { q, scales } => ops::linear_forward(
                &self.gpu,
                &args(LinearKind::I8, q.ptr(), scales.ptr(), 1.0, None),
                x,
                rows,
                y,
                wait,
            ),
            DeviceWeight::Fp8 {
                codes,
                weight_scale_inv,
                activation_scale,
            } => {
                // The CPU's multiplier: s_a * s_w with an activation scale, else s_w.
                let mult = activation_scale.map_or(*weight_scale_inv, |a| a * weight_scale_inv);
                ops::linear_forward(
                    &self.gpu,
                    &args(LinearKind::Fp8E4M3, codes.ptr(), 0, mult, *activation_scale),
                    x,
                    rows,
                    y,
                    wait,
                )
            }
            DeviceWeight::Int4(w) => w.matmul(x, rows, bias, y, wait),
        }
    }
}
