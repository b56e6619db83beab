//! Weight formats behind one trait, [`WeightFormat`], and the registry,
//! [`FormatId`]: the one list of the formats, from which the layer types,
//! `IsqType::parse`, `WeightDType`'s names and the layer byte format's type
//! tags derive (docs/architecture.md walks through adding a format).
//!
//! Imports go one way: `weight_format` (the trait, a leaf) <- each format
//! file (`float32`, `int8`, `int4`, `fp8_e4m3`, which call the kernels of
//! `crate::int4`, `crate::linear::kernels` and `crate::fp8`) <- this file
//! (the registry) <- `crate::linear`'s layers and the bindings.

mod float32;
mod fp8_e4m3;
mod gguf_blocks;
mod int4;
mod int4_asym;
mod int4_k;
mod int8;
mod int_zp;
mod nibble_rows;
#[cfg(test)]
mod row_format_checks;
mod row_forward;
#[cfg(test)]
mod sign8_test_format;
mod weight_format;

pub(crate) use float32::check_float_weight;
pub use float32::{Float32, FloatWeight};
pub(crate) use fp8_e4m3::{check_codes, check_scale, dequantize_e4m3, quantize_e4m3, E4m3Rows};
pub use fp8_e4m3::{Fp8E4M3, Fp8Weight};
pub use gguf_blocks::{matmul_blocks, GgufBlocks, GgufWeight};
pub use int4::{quantize_weighted as quantize_int4_weighted, weighted_group_scale, Int4};
pub use int4_asym::Int4Asym;
pub use int4_k::Int4K;
pub(crate) use int8::Int8Rows;
pub use int8::{Int8, Int8Weight};
pub use int_zp::IntZp;
pub use weight_format::{Block, FormatInfo, GpuKernels, RowOrder, ScaleStorage, WeightFormat};

/// The GGUF block formats under one name each (the registry takes plain
/// type paths).
pub type GgufQ8_0 = GgufBlocks<crate::ggml::Q8_0>;
/// GGUF Q4_0.
pub type GgufQ4_0 = GgufBlocks<crate::ggml::Q4_0>;
/// GGUF Q4_1.
pub type GgufQ4_1 = GgufBlocks<crate::ggml::Q4_1>;
/// GGUF Q5_0.
pub type GgufQ5_0 = GgufBlocks<crate::ggml::Q5_0>;
/// GGUF Q5_1.
pub type GgufQ5_1 = GgufBlocks<crate::ggml::Q5_1>;
/// GGUF Q4_K.
pub type GgufQ4K = GgufBlocks<crate::ggml::Q4K>;
/// GGUF Q5_K.
pub type GgufQ5K = GgufBlocks<crate::ggml::Q5K>;
/// GGUF Q6_K.
pub type GgufQ6K = GgufBlocks<crate::ggml::Q6K>;

/// Declares [`FormatId`] with one line per format: `Variant => type`
/// (`#[cfg(test)]` before a line registers a test-only format), and
/// `for_each_format!`, which hands the same list to a callback macro so the
/// layer dispatch (`crate::linear::registered`) covers every format without
/// a line per format.
macro_rules! registry {
    ($($(#[doc = $doc:expr])* $(#[cfg($cfg:meta)])? $id:ident => $($ty:ident)::+,)*) => {
        /// Every weight format of the crate, in registration order.
        #[allow(non_camel_case_types)] // gguf's type names: Q4_0, Q4_K.
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        pub enum FormatId {
            $($(#[doc = $doc])* $(#[cfg($cfg)])? $id,)*
        }

        impl FormatId {
            /// Every registered format.
            pub const ALL: &'static [FormatId] = &[$($(#[cfg($cfg)])? FormatId::$id,)*];

            /// The format's registry entry.
            pub fn info(self) -> &'static FormatInfo {
                match self {
                    $($(#[cfg($cfg)])? FormatId::$id => &<$($ty)::+ as WeightFormat>::INFO,)*
                }
            }

            /// The registered id of format type `F` (None: not registered).
            pub fn of<F: WeightFormat>() -> Option<FormatId> {
                let t = std::any::TypeId::of::<F>();
                $($(#[cfg($cfg)])? if t == std::any::TypeId::of::<$($ty)::+>() {
                    return Some(FormatId::$id);
                })*
                None
            }
        }

        /// Each registered format's type under its id's name, so
        /// `for_each_format!` callbacks name them from anywhere.
        #[allow(non_camel_case_types)] // gguf's type names: Q4_0, Q4_K.
        pub(crate) mod types {
            $($(#[cfg($cfg)])? pub(crate) type $id = super::$($ty)::+;)*
        }

        /// `for_each_format!(callback)` expands to `callback! { Id => Type, ... }`
        /// over every registered format (with its `#[cfg(...)]`, if any).
        macro_rules! for_each_format {
            ($cb:ident) => {
                $cb! { $($(#[cfg($cfg)])? $id => $crate::format::types::$id,)* }
            };
        }
        pub(crate) use for_each_format;
    };
}

registry! {
    /// float32, unquantized ([`Float32`]).
    Float32 => Float32,
    /// int8 codes, one absmax scale per output row ([`Int8`]).
    Int8 => Int8,
    /// Packed symmetric INT4, f32 scales per group of inputs ([`Int4`]).
    Int4 => Int4,
    /// FP8 E4M3 codes, one scale per tensor ([`Fp8E4M3`]).
    Fp8E4M3 => Fp8E4M3,
    /// Asymmetric INT4, half step and minimum per group ([`Int4Asym`]).
    Int4Asym => Int4Asym,
    /// Zero-point INT4 / INT8, GPTQ's and AWQ's math ([`IntZp`]).
    IntZp => IntZp,
    /// GGUF Q8_0 blocks ([`crate::ggml::Q8_0`]).
    Q8_0 => GgufQ8_0,
    /// GGUF Q4_0 blocks ([`crate::ggml::Q4_0`]).
    Q4_0 => GgufQ4_0,
    /// GGUF Q4_1 blocks ([`crate::ggml::Q4_1`]).
    Q4_1 => GgufQ4_1,
    /// GGUF Q5_0 blocks ([`crate::ggml::Q5_0`]).
    Q5_0 => GgufQ5_0,
    /// GGUF Q5_1 blocks ([`crate::ggml::Q5_1`]).
    Q5_1 => GgufQ5_1,
    /// GGUF Q4_K super-blocks ([`crate::ggml::Q4K`]).
    Q4_K => GgufQ4K,
    /// GGUF Q5_K super-blocks ([`crate::ggml::Q5K`]).
    Q5_K => GgufQ5K,
    /// GGUF Q6_K super-blocks ([`crate::ggml::Q6K`]).
    Q6_K => GgufQ6K,
    /// k-quant-style INT4: 6-bit step / minimum codes per group of 32
    /// under a half pair per super-block ([`Int4K`]).
    Int4K => Int4K,
    /// A scalar-only format that exists to test the registry mechanism
    /// (`sign8_test_format`): its module and this line are all it adds.
    #[cfg(test)]
    TestSign8 => sign8_test_format::Sign8,
}

impl FormatId {
    /// The format named `s` (its name or an alias, any case).
    pub fn parse(s: &str) -> Option<FormatId> {
        let s = s.to_ascii_lowercase();
        Self::ALL.iter().copied().find(|id| {
            let info = id.info();
            info.name == s || info.aliases.contains(&s.as_str())
        })
    }

    /// The format whose layer blobs carry type tag `tag`.
    pub fn from_serde_tag(tag: u8) -> Option<FormatId> {
        Self::ALL
            .iter()
            .copied()
            .find(|id| id.info().serde_tag == tag)
    }

    /// The name byte-format errors print for `tag`.
    pub fn serde_name_of(tag: u8) -> Option<&'static str> {
        Self::from_serde_tag(tag).map(|id| id.info().serde_name)
    }
}

#[cfg(test)]
mod tests;
