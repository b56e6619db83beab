//! What every layer type implements the same way, written once: the
//! output types the forward engines share (`kernels.rs` and the AMX path
//! `amx.rs`, which `kernels.rs` calls), and the trait items below.
//!
//! Each layer struct has the fields `bias: Option<Vec<f32>>`,
//! `stats: Stats` and `merge_error: Option<f64>`, its own
//! `fn write(&self, bias: Option<&[f32]>) -> Vec<u8>` and
//! `fn read(&[u8]) -> Result<(Self, Option<Vec<f32>>)>` (its versioned,
//! CRC-checked byte format), and `fn rebuilt(&self, w: &[f32]) -> Result<Self>`
//! (the same kind of layer, same bias, for the float weight `w`). These
//! macros add the trait items built on them.

/// A raw output pointer shared by tasks that write disjoint elements.
#[derive(Clone, Copy)]
pub(super) struct OutPtr(pub(super) *mut f32);
// SAFETY: tasks write disjoint indices of one live buffer (see each use).
unsafe impl Send for OutPtr {}
// SAFETY: as above.
unsafe impl Sync for OutPtr {}

/// What is applied to each finished dot product: `v * scale(r) + bias[r]`.
pub(crate) struct Epilogue<'a> {
    /// The multiplier of output row `r`.
    pub scale: &'a (dyn Fn(usize) -> f32 + Sync),
    /// The bias `[n]`, if any.
    pub bias: Option<&'a [f32]>,
}

/// The `QuantMethod` items every layer implements the same way: `bias`, the
/// imatrix tracking, `merge_error` and `add_delta_w` (through `rebuilt`).
/// `$s => $in_feat` gives the input width from `self` bound as `$s`.
macro_rules! shared_quant_method_items {
    ($s:ident => $in_feat:expr) => {
        fn serde_name(&self) -> &'static str {
            $crate::linear::QuantizedSerde::name(self)
        }

        fn serialize_layer(&self) -> $crate::error::Result<std::borrow::Cow<'_, [u8]>> {
            $crate::linear::QuantizedSerde::serialize(self)
        }

        fn serialize_layer_with_bias(
            &self,
            bias: Option<Vec<f32>>,
        ) -> $crate::error::Result<std::borrow::Cow<'_, [u8]>> {
            $crate::linear::QuantizedSerde::serialize_with_bias(self, bias)
        }

        fn add_delta_w_slice(
            &self,
            delta: &[f32],
        ) -> $crate::error::Result<std::sync::Arc<dyn $crate::linear::QuantMethod>> {
            let w = $crate::linear::merged(&self.dequantize_w_vec()?, delta, &self.weight_shape())?;
            let mut layer = self.rebuilt(&w)?;
            layer.merge_error = Some($crate::linear::rel_frobenius(
                &w,
                &layer.dequantize_w_vec()?,
            ));
            Ok(std::sync::Arc::new(layer))
        }

        fn bias(&self) -> Option<&[f32]> {
            self.bias.as_deref()
        }

        fn begin_track_stats(&self) -> $crate::error::Result<()> {
            let $s = self;
            self.stats.begin($in_feat);
            Ok(())
        }

        fn end_track_stats(&self) -> $crate::error::Result<Vec<f32>> {
            self.stats.end()
        }

        fn merge_error(&self) -> Option<f64> {
            self.merge_error
        }
    };
}

/// `QuantizedSerde` over the layer's own `write` / `read`. `$s => $out_feat`
/// gives the output width (the length a bias must have).
macro_rules! impl_quantized_serde {
    ($ty:ty, $name:literal, $s:ident => $out_feat:expr) => {
        impl $crate::linear::QuantizedSerde for $ty {
            fn name(&self) -> &'static str {
                $name
            }

            fn serialize(&self) -> $crate::error::Result<std::borrow::Cow<'_, [u8]>> {
                Ok(std::borrow::Cow::Owned(self.write(self.bias.as_deref())))
            }

            fn serialize_with_bias(
                &self,
                bias: Option<Vec<f32>>,
            ) -> $crate::error::Result<std::borrow::Cow<'_, [u8]>> {
                let $s = self;
                $crate::linear::check_bias(bias.as_deref(), $out_feat)?;
                Ok(std::borrow::Cow::Owned(self.write(bias.as_deref())))
            }

            fn deserialize(
                data: std::borrow::Cow<'_, [u8]>,
                device: &$crate::linear::Device,
            ) -> $crate::error::Result<std::sync::Arc<dyn $crate::linear::QuantMethod>> {
                device.require_cpu()?;
                let (mut layer, bias) = Self::read(&data)?;
                layer.bias = bias;
                Ok(std::sync::Arc::new(layer))
            }

            fn deserialize_ext_bias(
                data: std::borrow::Cow<'_, [u8]>,
                device: &$crate::linear::Device,
            ) -> $crate::error::Result<(
                std::sync::Arc<dyn $crate::linear::QuantMethod>,
                Option<Vec<f32>>,
            )> {
                device.require_cpu()?;
                let (layer, bias) = Self::read(&data)?;
                Ok((std::sync::Arc::new(layer), bias))
            }
        }
    };
}
