// Over 400 lines: the layer trait with every item documented, and the
// checks all layers share.
//! Linear layers behind one trait, [`QuantMethod`], with their
//! serialization trait [`QuantizedSerde`]:
//!
//! - [`QuantLinear`]: the one layer over any `crate::format::WeightFormat`
//!   with float32 activations; [`UnquantLinear`] (float32, the
//!   `apply_isq(None)` target), [`Int8Linear`] (int8, per-output-row
//!   scales) and [`Int4Linear`] (packed INT4 over
//!   [`crate::int4::QuantizedWeight`]) are its instantiations.
//! - [`PerTensorFP8Linear`]: FP8 E4M3 weight codes with a per-tensor scale,
//!   static-activation (W8A8) or weight-only (W8A32) forward, also on
//!   expert-stacked weights.
//!
//! Weights are `[out, in]` row-major like `torch.nn.Linear`; inputs are
//! `[rows, in]` (the bindings flatten any leading dimensions).
//!
//! Tensors are ndarray arrays in the tensor methods (`forward`,
//! `dequantize_w`, `add_delta_w`, ...; `array_api.rs`), each backed by a
//! `*_slice` twin on slices with explicit shapes that the kernels and the
//! Python binding use. There is one device and no tensor parallelism, and
//! `begin_track_stats` takes `&self` (stats live behind a mutex) so that
//! layers shared through `Arc` can be tracked (docs/rust.md compares the
//! signatures with the original crates').
//!
//! The kernel files (`dispatch`, `format`, `kernels`, `avx2`, `avx512`,
//! `amx`, `serde`, `common`) sit below `crate::format`; the layer files
//! (`quant_linear`, `*_linear`, `unquant`, `isq`, this one) above it
//! (docs/architecture.md).

#[cfg(target_arch = "x86_64")]
mod amx;
mod array_api;
#[cfg(target_arch = "x86_64")]
pub(crate) mod tiles;
#[macro_use]
mod common;
#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx2_e4m3;
#[cfg(target_arch = "x86_64")]
mod avx512;
pub mod borrowed;
pub(crate) mod dispatch;
#[cfg(target_arch = "x86_64")]
mod dots;
mod e4m3_round;
mod e4m3_rows;
mod format;
pub(crate) mod fp8_dialect;
mod fp8_linear;
pub(crate) mod grad_input;
mod grad_layers;
mod int4_linear;
mod int8_linear;
mod isq;
pub(crate) mod kernels;
mod quant_linear;
mod registered;
pub mod serde;
mod stats;
mod unquant;

use std::borrow::Cow;
use std::sync::atomic::AtomicUsize;
use std::sync::Arc;

use ndarray::{ArrayD, ArrayViewD};

pub use fp8_linear::PerTensorFP8Linear;
pub use int4_linear::Int4Linear;
pub use int8_linear::Int8Linear;
pub use quant_linear::QuantLinear;
pub use registered::{
    quantize_layer, IsqParams, ParamsFromIsq, ParamsProbe, ParamsUnknown, ReadLayer,
};
pub use unquant::UnquantLinear;

use crate::error::{QuantError, Result};
use crate::format::FormatId;

/// Target of [`QuantMethod::apply_isq`] (`None` there means unquantized f32).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IsqType {
    /// Packed INT4, groups of `group_size` along the input dimension.
    Int4 {
        /// Input rows per scale.
        group_size: usize,
    },
    /// FP8 E4M3 with a fresh per-tensor scale.
    Fp8E4M3,
    /// int8 per-output-row symmetric absmax.
    Int8,
    /// Any other registered format, quantized through its
    /// [`crate::format::WeightFormat`] implementation; `group_size` is
    /// used by formats whose parameters are a group size
    /// ([`IsqParams`]).
    Registered {
        /// The target format.
        format: FormatId,
        /// Input rows per scale, for formats that take one.
        group_size: usize,
    },
}

impl IsqType {
    /// Parse a quantized format's registered name or alias
    /// (`crate::format::FormatId::parse`: `"int4"`, `"fp8_e4m3"` or `"fp8"`,
    /// `"int8"`, ...); float32 is `None` in `apply_isq`, not an `IsqType`.
    pub fn parse(s: &str, group_size: usize) -> Option<IsqType> {
        match FormatId::parse(s)? {
            FormatId::Int4 => Some(IsqType::Int4 { group_size }),
            FormatId::Fp8E4M3 => Some(IsqType::Fp8E4M3),
            FormatId::Int8 => Some(IsqType::Int8),
            FormatId::Float32 => None,
            #[allow(unreachable_patterns)] // reached once a format registers without a variant here
            format => Some(IsqType::Registered { format, group_size }),
        }
    }

    /// The registered format this target quantizes to.
    pub fn format(self) -> FormatId {
        match self {
            IsqType::Int4 { .. } => FormatId::Int4,
            IsqType::Fp8E4M3 => FormatId::Fp8E4M3,
            IsqType::Int8 => FormatId::Int8,
            IsqType::Registered { format, .. } => format,
        }
    }
}

/// Where a layer's weight lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Device {
    /// Host memory (where every layer computes).
    Cpu,
    /// A CUDA device by ordinal.
    Cuda(usize),
}

impl Device {
    /// Parse `"cpu"`, `"cuda"`, `"cuda:N"`.
    pub fn parse(s: &str) -> Option<Device> {
        let s = s.trim().to_ascii_lowercase();
        match s.as_str() {
            "cpu" => Some(Device::Cpu),
            "cuda" => Some(Device::Cuda(0)),
            _ => s
                .strip_prefix("cuda:")
                .and_then(|n| n.parse().ok())
                .map(Device::Cuda),
        }
    }

    /// `"cpu"` or `"cuda:N"`.
    pub fn name(&self) -> String {
        match self {
            Device::Cpu => "cpu".into(),
            Device::Cuda(i) => format!("cuda:{i}"),
        }
    }

    /// Layers compute on the CPU only; a CUDA request is refused honestly.
    pub fn require_cpu(&self) -> Result<()> {
        match self {
            Device::Cpu => Ok(()),
            Device::Cuda(_) => Err(QuantError::CudaNotAvailable(format!(
                "{} requested, but quantrs linear layers run on the CPU",
                self.name()
            ))),
        }
    }
}

/// Storage type of a layer's weight, as `dtype_and_device` reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WeightDType {
    /// float32.
    F32,
    /// FP8 E4M3 codes.
    F8E4M3,
    /// int8 codes.
    I8,
    /// Packed INT4 (two per byte).
    I4,
    /// Any other registered format's storage.
    Registered(FormatId),
}

impl WeightDType {
    /// The registered format stored in this dtype.
    pub fn format(self) -> FormatId {
        match self {
            WeightDType::F32 => FormatId::Float32,
            WeightDType::F8E4M3 => FormatId::Fp8E4M3,
            WeightDType::I8 => FormatId::Int8,
            WeightDType::I4 => FormatId::Int4,
            WeightDType::Registered(id) => id,
        }
    }

    /// The dtype of format `id`'s storage.
    pub fn of(id: FormatId) -> WeightDType {
        match id {
            FormatId::Float32 => WeightDType::F32,
            FormatId::Fp8E4M3 => WeightDType::F8E4M3,
            FormatId::Int8 => WeightDType::I8,
            FormatId::Int4 => WeightDType::I4,
            #[allow(unreachable_patterns)] // reached once a format registers without a variant here
            id => WeightDType::Registered(id),
        }
    }

    /// The NumPy / ml_dtypes style name (the format's `dtype_name`).
    pub fn name(self) -> &'static str {
        let info = self.format().info();
        info.dtype_name
    }
}

/// Tensor-parallel kind (none of our layers is distributed).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DistributedKind {
    /// Output columns split across ranks.
    ColumnParallel,
    /// Input rows split across ranks.
    RowParallel,
    /// The whole weight on every rank.
    Replicated,
}

/// A layer by concrete type, for code that needs more than the trait
/// (the Python bindings pick the class from it).
#[derive(Clone, Debug)]
pub enum Layer {
    /// [`PerTensorFP8Linear`].
    Fp8(Arc<PerTensorFP8Linear>),
    /// [`UnquantLinear`].
    Unquant(Arc<UnquantLinear>),
    /// [`Int8Linear`].
    Int8(Arc<Int8Linear>),
    /// [`Int4Linear`].
    Int4(Arc<Int4Linear>),
    /// A [`QuantLinear`] over any other registered format.
    Registered {
        /// Its format.
        format: FormatId,
        /// The layer.
        layer: Arc<dyn QuantMethod>,
    },
}

/// The layer interface. Shapes: weight `[out, in]` (FP8 layers
/// may also hold expert-stacked `[E, out, in]`), inputs `[rows, in]`.
pub trait QuantMethod: Send + Sync + std::fmt::Debug {
    /// The weight's logical shape (`[out, in]` or `[E, out, in]`).
    fn weight_shape(&self) -> Vec<usize>;

    /// `in` (the last dimension of the weight).
    fn in_features(&self) -> usize {
        *self.weight_shape().last().unwrap_or(&0)
    }

    /// `out` (the second-to-last dimension of the weight).
    fn out_features(&self) -> usize {
        let s = self.weight_shape();
        s[s.len() - 2]
    }

    /// `y = x . W^T + bias` for `x [rows, in]` into `y [rows, out]`.
    fn forward_slice(&self, x: &[f32], y: &mut [f32]) -> Result<()>;

    /// [`forward_slice`](Self::forward_slice) with the activation cast to the layer's
    /// activation type and back. On f32 slices the casts are the identity
    /// (an FP8 layer quantizes activations inside `forward` already); the
    /// Python binding does the float16/float64/bfloat16 casts around it.
    fn forward_autocast_slice(&self, x: &[f32], y: &mut [f32]) -> Result<()> {
        self.forward_slice(x, y)
    }

    /// Expert-stacked forward: `x [tokens, in]`, `indices [tokens, k]` ->
    /// `y [tokens, k, out]`.
    fn gather_forward_slice(
        &self,
        _x: &[f32],
        _indices: &[i64],
        _k: usize,
        _y: &mut [f32],
    ) -> Result<()> {
        Err(QuantError::UnsupportedOperation(format!(
            "gather_forward needs expert-stacked [E, out, in] weights; this layer holds {:?}",
            self.weight_shape()
        )))
    }

    /// [`gather_forward_slice`](Self::gather_forward_slice) with activation casts.
    fn gather_forward_autocast_slice(
        &self,
        x: &[f32],
        indices: &[i64],
        k: usize,
        y: &mut [f32],
    ) -> Result<()> {
        self.gather_forward_slice(x, indices, k, y)
    }

    /// The dequantized weight, f32, in [`weight_shape`](Self::weight_shape).
    fn dequantize_w_vec(&self) -> Result<Vec<f32>>;

    /// The activation type a quantized forward uses (FP8 E4M3 with a static
    /// activation scale), else `None`.
    fn quantized_act_type(&self) -> Option<crate::fp8::Fp8Format> {
        None
    }

    /// A new layer for `W + delta` (LoRA merge; `delta` pre-scaled by alpha),
    /// re-quantized in this layer's format.
    fn add_delta_w_slice(&self, delta: &[f32]) -> Result<Arc<dyn QuantMethod>>;

    /// Storage dtype of the weight and its device.
    fn dtype_and_device(&self) -> (WeightDType, Device);

    /// A new layer of another quantization (`None`: unquantized f32).
    /// `n_quantized` is incremented once per layer that gets quantized.
    /// Every layer converts the same way (`linear/isq.rs`).
    fn apply_isq(
        self: Arc<Self>,
        dtype: Option<IsqType>,
        device: Device,
        n_quantized: &AtomicUsize,
        imatrix_weight: Option<Vec<f32>>,
    ) -> Result<Arc<dyn QuantMethod>> {
        isq::convert(
            &self.into_layer(),
            dtype,
            device,
            n_quantized,
            imatrix_weight,
        )
    }

    /// `(W, bias)` dequantized.
    fn unquant_weight_bias(&self) -> Option<(Vec<f32>, Option<Vec<f32>>)> {
        let w = self.dequantize_w_vec().ok()?;
        Some((w, self.bias().map(<[f32]>::to_vec)))
    }

    /// The bias `[out]` (or `[E, out]` for stacked weights), if any.
    fn bias(&self) -> Option<&[f32]>;

    /// Start accumulating the imatrix (mean of `x_i^2` over the rows that
    /// `forward` sees); restarts it if already tracking.
    fn begin_track_stats(&self) -> Result<()>;

    /// The imatrix `[in]` since `begin_track_stats`; tracking stops.
    fn end_track_stats(&self) -> Result<Vec<f32>>;

    /// How the weight is split across ranks (never, here).
    fn is_distributed(&self) -> Option<DistributedKind> {
        None
    }

    /// The relative Frobenius error of the re-quantization that made this
    /// layer in `add_delta_w`, if it was made that way.
    fn merge_error(&self) -> Option<f64> {
        None
    }

    /// This layer by concrete type.
    fn into_layer(self: Arc<Self>) -> Layer;

    /// [`QuantizedSerde::name`], callable on a `dyn QuantMethod`.
    fn serde_name(&self) -> &'static str;

    /// [`QuantizedSerde::serialize`], callable on a `dyn QuantMethod`.
    fn serialize_layer(&self) -> Result<Cow<'_, [u8]>>;

    /// [`QuantizedSerde::serialize_with_bias`], callable on a `dyn QuantMethod`.
    fn serialize_layer_with_bias(&self, bias: Option<Vec<f32>>) -> Result<Cow<'_, [u8]>>;

    /// `forward`: `y = x . W^T + bias` for `x [..., in]` (any
    /// leading dimensions, standard layout) -> `[..., out]`.
    fn forward(&self, x: ArrayViewD<'_, f32>) -> Result<ArrayD<f32>> {
        array_api::forward(self, x, false)
    }

    /// `forward_autocast` (see [`Self::forward_autocast_slice`]).
    fn forward_autocast(&self, x: ArrayViewD<'_, f32>) -> Result<ArrayD<f32>> {
        array_api::forward(self, x, true)
    }

    /// `gather_forward`: `x [tokens, in]`, `indices [tokens, k]`
    /// -> `[tokens, k, out]` (expert-stacked weights only).
    fn gather_forward(
        &self,
        x: ArrayViewD<'_, f32>,
        indices: ArrayViewD<'_, i64>,
    ) -> Result<ArrayD<f32>> {
        array_api::gather_forward(self, x, indices, false)
    }

    /// [`Self::gather_forward`] with activation casts.
    fn gather_forward_autocast(
        &self,
        x: ArrayViewD<'_, f32>,
        indices: ArrayViewD<'_, i64>,
    ) -> Result<ArrayD<f32>> {
        array_api::gather_forward(self, x, indices, true)
    }

    /// `dequantize_w`: the f32 weight in
    /// [`weight_shape`](Self::weight_shape).
    fn dequantize_w(&self) -> Result<ArrayD<f32>> {
        array_api::dequantize_w(self)
    }

    /// `add_delta_w`: a new layer for `W + delta` (`delta` of the
    /// weight's shape, pre-scaled by the LoRA alpha), re-quantized in this
    /// layer's format.
    fn add_delta_w(&self, delta: ArrayViewD<'_, f32>) -> Result<Arc<dyn QuantMethod>> {
        array_api::add_delta_w(self, delta)
    }
}

/// A layer and a bias kept outside it (`deserialize_ext_bias`).
pub type LayerAndBias = (Arc<dyn QuantMethod>, Option<Vec<f32>>);

/// Serialization of a layer; the byte format
/// is described in `linear/serde.rs`.
pub trait QuantizedSerde {
    /// The layer type's serialized name.
    fn name(&self) -> &'static str;

    /// Whether a layer made by ISQ can be serialized (always, here).
    fn isq_serde_supported(&self) -> bool {
        true
    }

    /// The layer (with its own bias) as bytes.
    fn serialize(&self) -> Result<Cow<'_, [u8]>>;

    /// The layer with `bias` in place of its own.
    fn serialize_with_bias(&self, bias: Option<Vec<f32>>) -> Result<Cow<'_, [u8]>>;

    /// The layer (with its bias) from bytes written by `serialize`.
    fn deserialize(data: Cow<'_, [u8]>, device: &Device) -> Result<Arc<dyn QuantMethod>>
    where
        Self: Sized;

    /// The layer without its bias, and the bias separately.
    fn deserialize_ext_bias(data: Cow<'_, [u8]>, device: &Device) -> Result<LayerAndBias>
    where
        Self: Sized;
}

/// Rows of `x` for a layer with `in_feat` inputs, checking the lengths.
pub(crate) fn rows_of(x: &[f32], y: &[f32], in_feat: usize, out_feat: usize) -> Result<usize> {
    let rows = rows_in(x, in_feat)?;
    if Some(y.len()) != rows.checked_mul(out_feat) {
        return Err(QuantError::dims(
            "y length",
            format!("{rows} x {out_feat}"),
            y.len(),
        ));
    }
    Ok(rows)
}

/// Rows of `x` for `in_feat` inputs: an error unless its length is a
/// multiple of `in_feat` (> 0).
pub(crate) fn rows_in(x: &[f32], in_feat: usize) -> Result<usize> {
    if in_feat == 0 || !x.len().is_multiple_of(in_feat) {
        return Err(QuantError::dims(
            "x length",
            format!("a multiple of in_features={in_feat}"),
            x.len(),
        ));
    }
    Ok(x.len() / in_feat)
}

/// Validate a bias against `[out]`: length and finiteness.
pub(crate) fn check_bias(bias: Option<&[f32]>, len: usize) -> Result<()> {
    if let Some(b) = bias {
        if b.len() != len {
            return Err(QuantError::dims(
                "bias",
                format!("[{len}]"),
                format!("[{}]", b.len()),
            ));
        }
        if let Some(i) = b.iter().position(|v| !v.is_finite()) {
            return Err(QuantError::arg(format!(
                "bias[{i}] is not finite ({})",
                b[i]
            )));
        }
    }
    Ok(())
}

/// Relative Frobenius error `||a - b|| / ||a||` (0 when `a` is all zero).
pub(crate) fn rel_frobenius(a: &[f32], b: &[f32]) -> f64 {
    let (mut num, mut den) = (0f64, 0f64);
    for (&x, &y) in a.iter().zip(b) {
        num += (x as f64 - y as f64).powi(2);
        den += (x as f64).powi(2);
    }
    if den == 0.0 {
        num.sqrt()
    } else {
        (num / den).sqrt()
    }
}

/// `w + delta`, validated.
pub(crate) fn merged(w: &[f32], delta: &[f32], shape: &[usize]) -> Result<Vec<f32>> {
    if delta.len() != w.len() {
        return Err(QuantError::dims(
            "delta",
            format!("{shape:?}"),
            format!("{} elements", delta.len()),
        ));
    }
    if let Some(i) = delta.iter().position(|v| !v.is_finite()) {
        return Err(QuantError::arg(format!(
            "delta[{i}] is not finite ({})",
            delta[i]
        )));
    }
    let out: Vec<f32> = w.iter().zip(delta).map(|(a, b)| a + b).collect();
    if let Some(i) = out.iter().position(|v| !v.is_finite()) {
        return Err(QuantError::arg(format!("W + delta overflows at index {i}")));
    }
    Ok(out)
}
