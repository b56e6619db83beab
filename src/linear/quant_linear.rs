//! [`QuantLinear`]: the one linear layer over any [`WeightFormat`] whose
//! forward takes float32 activations as they are (`UnquantLinear`,
//! `Int8Linear`, `Int4Linear` are its instantiations). Forward:
//! `y = x . W^T + bias` through the format's kernels.

use std::borrow::Cow;
use std::sync::Arc;

use super::serde::{self as ser, Reader, Writer, FLAG_BIAS};
use super::stats::Stats;
use super::{check_bias, rows_of, Device, Layer, QuantMethod, QuantizedSerde, WeightDType};
use crate::error::Result;
use crate::format::{check_float_weight, FormatId, WeightFormat};

/// A linear layer whose weight is in format `F`, with an optional bias.
#[derive(Clone, Debug)]
pub struct QuantLinear<F: WeightFormat> {
    /// `F`'s registry id (a layer exists only for registered formats).
    format: FormatId,
    weight: F::Weight,
    bias: Option<Vec<f32>>,
    merge_error: Option<f64>,
    stats: Stats,
}

impl<F: WeightFormat> QuantLinear<F> {
    /// A layer over a quantized weight; `bias` is `[out]`, finite.
    pub fn from_weight(weight: F::Weight, bias: Option<Vec<f32>>) -> Result<Self> {
        check_bias(bias.as_deref(), F::shape(&weight)[0])?;
        Ok(QuantLinear {
            format: Self::registered()?,
            weight,
            bias,
            merge_error: None,
            stats: Stats::default(),
        })
    }

    /// Quantize a finite float weight `[out, in]` with `params`.
    pub fn quantize(
        w: &[f32],
        out_feat: usize,
        in_feat: usize,
        params: F::Params,
        bias: Option<Vec<f32>>,
    ) -> Result<Self> {
        check_float_weight(w, &[out_feat, in_feat])?;
        Self::from_weight(F::quantize(w, out_feat, in_feat, params)?, bias)
    }

    /// `F`'s registry id; a format outside `crate::format`'s registry
    /// has no layer.
    fn registered() -> Result<FormatId> {
        FormatId::of::<F>().ok_or_else(|| {
            crate::error::QuantError::UnsupportedOperation(format!(
                "format {:?} is not in crate::format's registry",
                F::INFO.name
            ))
        })
    }

    /// The registered format of the weight.
    pub fn format(&self) -> FormatId {
        self.format
    }

    /// The quantized weight.
    pub fn quantized_weight(&self) -> &F::Weight {
        &self.weight
    }

    fn dims(&self) -> [usize; 2] {
        F::shape(&self.weight)
    }

    /// The same kind of layer (shape, parameters, bias) for `w`.
    fn rebuilt(&self, w: &[f32]) -> Result<Self> {
        let [out, inf] = self.dims();
        Self::quantize(w, out, inf, F::params(&self.weight), self.bias.clone())
    }

    fn write(&self, bias: Option<&[f32]>) -> Vec<u8> {
        let flags = if bias.is_some() { FLAG_BIAS } else { 0 };
        let mut w = Writer::new(F::INFO.serde_tag, flags);
        F::write_blob(&self.weight, &mut w);
        if let Some(b) = bias {
            w.f32s(&[self.dims()[0]], b);
        }
        w.finish()
    }

    fn read(data: &[u8]) -> Result<(Self, Option<Vec<f32>>)> {
        let mut r = Reader::new(data, F::INFO.serde_tag, FormatId::serde_name_of)?;
        let parts = F::read_blob(&mut r)?;
        let bias = if r.flags & FLAG_BIAS != 0 {
            Some(r.f32s("bias")?.1)
        } else {
            None
        };
        r.finish()?;
        let weight = ser::as_ser(F::from_blob(parts))?;
        ser::as_ser(check_bias(bias.as_deref(), F::shape(&weight)[0]))?;
        Ok((
            QuantLinear {
                format: Self::registered()?,
                weight,
                bias: None,
                merge_error: None,
                stats: Stats::default(),
            },
            bias,
        ))
    }
}

impl<F: WeightFormat> QuantMethod for QuantLinear<F> {
    fn weight_shape(&self) -> Vec<usize> {
        self.dims().to_vec()
    }

    fn forward_slice(&self, x: &[f32], y: &mut [f32]) -> Result<()> {
        let [out, inf] = self.dims();
        let rows = rows_of(x, y, inf, out)?;
        self.stats.observe(x, inf);
        F::matmul(&self.weight, x, rows, self.bias.as_deref(), y)
    }

    fn dequantize_w_vec(&self) -> Result<Vec<f32>> {
        Ok(F::dequantize(&self.weight))
    }

    fn dtype_and_device(&self) -> (WeightDType, Device) {
        (WeightDType::of(self.format), Device::Cpu)
    }

    fn into_layer(self: Arc<Self>) -> Layer {
        super::registered::layer_of(self)
    }

    shared_quant_method_items!(s => s.dims()[1]);
}

impl<F: WeightFormat> QuantizedSerde for QuantLinear<F> {
    fn name(&self) -> &'static str {
        let info = &F::INFO;
        info.layer_name
    }

    fn serialize(&self) -> Result<Cow<'_, [u8]>> {
        Ok(Cow::Owned(self.write(self.bias.as_deref())))
    }

    fn serialize_with_bias(&self, bias: Option<Vec<f32>>) -> Result<Cow<'_, [u8]>> {
        check_bias(bias.as_deref(), self.dims()[0])?;
        Ok(Cow::Owned(self.write(bias.as_deref())))
    }

    fn deserialize(data: Cow<'_, [u8]>, device: &Device) -> Result<Arc<dyn QuantMethod>> {
        device.require_cpu()?;
        let (mut layer, bias) = Self::read(&data)?;
        layer.bias = bias;
        Ok(Arc::new(layer))
    }

    fn deserialize_ext_bias(data: Cow<'_, [u8]>, device: &Device) -> Result<super::LayerAndBias> {
        device.require_cpu()?;
        let (layer, bias) = Self::read(&data)?;
        Ok((Arc::new(layer), bias))
    }
}
