//! The layer dispatch over every registered format, generated from
//! `crate::format`'s registry (`for_each_format!`), so a format added there
//! is a layer here without a line of its own: [`layer_of`] (a
//! `QuantLinear<F>` by concrete type), [`quantize_layer`] (`apply_isq`'s
//! target for any format), [`deserialize`] / [`deserialize_ext_bias`] (a
//! blob of any registered layer, by its type tag), and `QuantizedSerde`
//! for `dyn QuantMethod` built on them.
//!
//! `apply_isq` builds a format's `Params` from the request's group size
//! through [`IsqParams`]: implemented for `()` (no parameters) and `usize`
//! (a group size); a format with other parameters implements it for its
//! own `Params` type in its module, or `apply_isq` to it is refused.

use std::any::Any;
use std::borrow::Cow;
use std::marker::PhantomData;
use std::sync::Arc;

use super::serde::Reader;
use super::{
    Device, Int4Linear, Int8Linear, Layer, LayerAndBias, PerTensorFP8Linear, QuantLinear,
    QuantMethod, QuantizedSerde, UnquantLinear,
};
use crate::error::{QuantError, Result};
use crate::format::{for_each_format, FormatId, WeightFormat};

/// A format's quantization parameters from `apply_isq`'s arguments.
pub trait IsqParams: Sized {
    /// The parameters for a request with `group_size`.
    fn from_group_size(group_size: usize) -> Result<Self>;
}

impl IsqParams for () {
    fn from_group_size(_: usize) -> Result<()> {
        Ok(())
    }
}

impl IsqParams for usize {
    fn from_group_size(group_size: usize) -> Result<usize> {
        Ok(group_size)
    }
}

/// Picks [`ParamsFromIsq`] where `P: IsqParams` and [`ParamsUnknown`]
/// otherwise (method resolution tries `&ParamsProbe` before `&&ParamsProbe`),
/// so the generated dispatch compiles for every format.
pub struct ParamsProbe<P>(PhantomData<P>);

/// The parameters of a format whose `Params` implement [`IsqParams`].
pub trait ParamsFromIsq<P> {
    /// `P::from_group_size`.
    fn params(&self, name: &str, group_size: usize) -> Result<P>;
}

impl<P: IsqParams> ParamsFromIsq<P> for ParamsProbe<P> {
    fn params(&self, _: &str, group_size: usize) -> Result<P> {
        P::from_group_size(group_size)
    }
}

/// The refusal for a format whose `Params` do not implement [`IsqParams`].
pub trait ParamsUnknown<P> {
    /// An `UnsupportedOperation` naming the format.
    fn params(&self, name: &str, group_size: usize) -> Result<P>;
}

impl<P> ParamsUnknown<P> for &ParamsProbe<P> {
    fn params(&self, name: &str, _: usize) -> Result<P> {
        Err(QuantError::UnsupportedOperation(format!(
            "apply_isq to {name:?}: its parameters are not built from a group size \
             (the format implements IsqParams for them to allow it)"
        )))
    }
}

/// The layer enum entry of `layer`: the named variants for the formats with
/// a class of their own, [`Layer::Registered`] for the others.
pub(crate) fn layer_of<F: WeightFormat>(layer: Arc<QuantLinear<F>>) -> Layer {
    let format = layer.format();
    let any: Arc<dyn Any + Send + Sync> = layer.clone();
    let any = match any.downcast::<UnquantLinear>() {
        Ok(l) => return Layer::Unquant(l),
        Err(a) => a,
    };
    let any = match any.downcast::<Int8Linear>() {
        Ok(l) => return Layer::Int8(l),
        Err(a) => a,
    };
    if let Ok(l) = any.downcast::<Int4Linear>() {
        return Layer::Int4(l);
    }
    Layer::Registered { format, layer }
}

/// The type tag of a blob, validated (CRC, version, a registered tag).
fn tag_of(data: &[u8]) -> Result<FormatId> {
    let tag = data.get(4).copied().unwrap_or(0);
    // Reader::new checks the CRC, version and tag, with the same errors as
    // a typed deserialize; expecting the blob's own tag never mismatches.
    Reader::new(data, tag, FormatId::serde_name_of)?;
    FormatId::from_serde_tag(tag)
        .ok_or_else(|| QuantError::ser(format!("unknown layer type tag {tag}")))
}

macro_rules! dispatch {
    ($($(#[cfg($cfg:meta)])? $id:ident => $ty:ty,)*) => {
        /// A layer of format `format` quantized from the finite float weight
        /// `w [out, in]` (FP8 with a fresh per-tensor scale, no activation
        /// scale). `group_size` is read by the formats whose parameter is a group
        /// size (INT4) and ignored by those without parameters; a format whose
        /// parameters are built otherwise is an `UnsupportedOperation` error.
        pub fn quantize_layer(
            format: FormatId,
            w: &[f32],
            out_feat: usize,
            in_feat: usize,
            group_size: usize,
            bias: Option<Vec<f32>>,
        ) -> Result<Arc<dyn QuantMethod>> {
            if format == FormatId::Fp8E4M3 {
                return Ok(Arc::new(PerTensorFP8Linear::from_float(
                    w,
                    vec![out_feat, in_feat],
                    bias,
                    None,
                )?));
            }
            match format {
                $($(#[cfg($cfg)])? FormatId::$id => {
                    let name = <$ty as WeightFormat>::INFO.name;
                    let params = (&ParamsProbe::<<$ty as WeightFormat>::Params>(PhantomData))
                        .params(name, group_size)?;
                    Ok(Arc::new(QuantLinear::<$ty>::quantize(w, out_feat, in_feat, params, bias)?))
                })*
            }
        }

        /// `QuantizedSerde::deserialize` (`ext_bias`: `deserialize_ext_bias`)
        /// of the layer type the blob's tag names.
        fn deserialize_as(data: Cow<'_, [u8]>, device: &Device, ext_bias: bool) -> Result<LayerAndBias> {
            fn read<L: QuantizedSerde>(data: Cow<'_, [u8]>, device: &Device, ext_bias: bool) -> Result<LayerAndBias> {
                if ext_bias {
                    L::deserialize_ext_bias(data, device)
                } else {
                    Ok((L::deserialize(data, device)?, None))
                }
            }
            let format = tag_of(&data)?;
            if format == FormatId::Fp8E4M3 {
                return read::<PerTensorFP8Linear>(data, device, ext_bias);
            }
            match format {
                $($(#[cfg($cfg)])? FormatId::$id => read::<QuantLinear<$ty>>(data, device, ext_bias),)*
            }
        }
    };
}

for_each_format!(dispatch);

/// A layer of any registered type from `serialize` bytes.
pub(crate) fn deserialize(data: Cow<'_, [u8]>, device: &Device) -> Result<Arc<dyn QuantMethod>> {
    Ok(deserialize_as(data, device, false)?.0)
}

/// A layer of any registered type and its bias, from bytes.
pub(crate) fn deserialize_ext_bias(data: Cow<'_, [u8]>, device: &Device) -> Result<LayerAndBias> {
    deserialize_as(data, device, true)
}

/// Reading a layer from bytes, for a concrete layer type (its
/// `QuantizedSerde`) and for `dyn QuantMethod` (any registered layer, by
/// the blob's tag).
pub trait ReadLayer {
    /// The layer (with its bias) from `serialize` bytes.
    fn read_layer(data: Cow<'_, [u8]>, device: &Device) -> Result<Arc<dyn QuantMethod>>;
    /// The layer without its bias, and the bias.
    fn read_layer_ext_bias(data: Cow<'_, [u8]>, device: &Device) -> Result<LayerAndBias>;
}

impl<L: QuantizedSerde> ReadLayer for L {
    fn read_layer(data: Cow<'_, [u8]>, device: &Device) -> Result<Arc<dyn QuantMethod>> {
        L::deserialize(data, device)
    }
    fn read_layer_ext_bias(data: Cow<'_, [u8]>, device: &Device) -> Result<LayerAndBias> {
        L::deserialize_ext_bias(data, device)
    }
}

impl ReadLayer for dyn QuantMethod {
    fn read_layer(data: Cow<'_, [u8]>, device: &Device) -> Result<Arc<dyn QuantMethod>> {
        deserialize(data, device)
    }
    fn read_layer_ext_bias(data: Cow<'_, [u8]>, device: &Device) -> Result<LayerAndBias> {
        deserialize_ext_bias(data, device)
    }
}

/// Serialization of a layer of any format, through [`QuantMethod`]
/// (the trait's `deserialize` reads whichever registered layer the bytes hold).
impl QuantizedSerde for dyn QuantMethod {
    fn name(&self) -> &'static str {
        self.serde_name()
    }

    fn serialize(&self) -> Result<Cow<'_, [u8]>> {
        self.serialize_layer()
    }

    fn serialize_with_bias(&self, bias: Option<Vec<f32>>) -> Result<Cow<'_, [u8]>> {
        self.serialize_layer_with_bias(bias)
    }
}

#[cfg(test)]
mod tests;
