//! The trait a weight format implements once ([`WeightFormat`]) and the
//! static description it registers ([`FormatInfo`]). A leaf of the format
//! module: the formats import it, it imports no format.

use std::fmt::Debug;

use crate::error::{QuantError, Result};
use crate::linear::serde::{Reader, Writer};

/// The storage of one block: `elems` weights that share their scales,
/// encoded in `code_bytes` bytes of codes plus `scale_bytes` bytes of scales.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Block {
    /// Weights per block.
    pub elems: usize,
    /// Bytes of codes per block.
    pub code_bytes: usize,
    /// Bytes of scales per block (0 where the scale is per tensor or absent).
    pub scale_bytes: usize,
}

impl Block {
    /// Bits per weight, scales included.
    pub fn bits_per_weight(self) -> f64 {
        8.0 * (self.code_bytes + self.scale_bytes) as f64 / self.elems as f64
    }
}

/// How the codes of a `[out, in]` weight are ordered in memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RowOrder {
    /// Output-major `[out, in]`, one code (or block) after another along
    /// the input dimension, as `torch.nn.Linear` stores its weight.
    OutputMajor,
    /// Input-major `[in / 2, out]` bytes: byte `[p, o]` holds input rows
    /// `2p` (low nibble) and `2p + 1` (high nibble) of output `o`, so a
    /// matvec streams whole rows of bytes (`crate::int4`).
    InputMajorNibblePairs,
}

/// Where a format keeps its scales.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ScaleStorage {
    /// No scale: the codes are the values.
    None,
    /// One f32 for the whole tensor.
    PerTensorF32,
    /// One f32 per output row, in a tensor of its own.
    PerRowF32,
    /// One f32 per group of input rows and output, `[groups, out]`, in a
    /// tensor of its own.
    PerGroupF32,
}

/// The GPU kernels of a format: names in `crate::gpu::nvrtc` (compiled
/// with the `gpu` feature), checked by a test there.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GpuKernels {
    /// The `KernelSource::name` holding them.
    pub source: &'static str,
    /// The kernels this format's device layer launches.
    pub kernels: &'static [&'static str],
}

/// What the registry knows about a format: every name other parts of the
/// crate derive from it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FormatInfo {
    /// The canonical name (`apply_isq`, the CLI, Python).
    pub name: &'static str,
    /// Other names `parse` accepts (lower case).
    pub aliases: &'static [&'static str],
    /// The storage dtype's NumPy / ml_dtypes style name.
    pub dtype_name: &'static str,
    /// The layer type tag of the linear byte format (`linear/serde.rs`),
    /// never reused.
    pub serde_tag: u8,
    /// The name byte-format errors print for the tag.
    pub serde_name: &'static str,
    /// `QuantizedSerde::name` of its linear layer.
    pub layer_name: &'static str,
    /// The `format` metadata of its own safetensors files, if it has them.
    pub safetensors_format: Option<&'static str>,
    /// How its codes are ordered.
    pub order: RowOrder,
    /// Where its scales live.
    pub scales: ScaleStorage,
    /// Whether it has a path with int8-quantized activations.
    pub int8_activations: bool,
    /// Its GPU kernels, where it has them.
    pub gpu: Option<GpuKernels>,
}

/// One weight format, implemented once: layout, scalar reference
/// quantization and dequantization, the forward kernels (the format picks
/// its per-ISA table from `crate::simd`'s proof tokens once per call), and
/// its tensors in the layer byte format. A generic layer
/// (`crate::linear::QuantLinear`) turns any implementation into a
/// `QuantMethod`.
///
/// Weights are seen as `[out, in]` (the linear layer's orientation)
/// whatever the format stores internally.
pub trait WeightFormat: Sized + Clone + Debug + Send + Sync + 'static {
    /// The registry entry.
    const INFO: FormatInfo;
    /// Per-tensor choices made at quantization (INT4: the group size).
    type Params: Copy + Debug + PartialEq + Send + Sync;
    /// A quantized weight in this format; its constructors validate the
    /// layout, so the kernels need no checks.
    type Weight: Clone + Debug + Send + Sync;
    /// The tensors of a blob, parsed but not yet validated (validation
    /// runs after the whole blob is read, in [`Self::from_blob`]).
    type BlobParts;

    /// The block structure of a weight with `in_feat` inputs.
    fn block(params: Self::Params, in_feat: usize) -> Result<Block>;

    /// The parameters `w` was quantized with.
    fn params(w: &Self::Weight) -> Self::Params;

    /// `[out, in]` of `w`.
    fn shape(w: &Self::Weight) -> [usize; 2];

    /// Quantize a finite float weight `[out, in]` (the scalar reference;
    /// kernels never change the codes).
    fn quantize(
        w: &[f32],
        out_feat: usize,
        in_feat: usize,
        params: Self::Params,
    ) -> Result<Self::Weight>;

    /// The dequantized weight `[out, in]`.
    fn dequantize(w: &Self::Weight) -> Vec<f32>;

    /// `y = x . W^T + bias` for `x [rows, in]` (lengths checked by the
    /// caller) at the SIMD level in force.
    fn matmul(
        w: &Self::Weight,
        x: &[f32],
        rows: usize,
        bias: Option<&[f32]>,
        y: &mut [f32],
    ) -> Result<()>;

    /// [`Self::matmul`] with `x` quantized to int8 per block, where
    /// [`FormatInfo::int8_activations`] says the format has that path.
    fn matmul_int8_activations(
        w: &Self::Weight,
        x: &[f32],
        rows: usize,
        y: &mut [f32],
    ) -> Result<()> {
        let _ = (w, x, rows, y);
        Err(QuantError::UnsupportedOperation(format!(
            "{} has no int8-activation path",
            Self::INFO.name
        )))
    }

    /// The input gradient `dx = g . W` for `g` `[rows, out]`, `dx`
    /// `[rows, in]` (lengths checked here; a wrong one is an error and `dx`
    /// is untouched). This default dequantizes the whole weight once (a
    /// format with a tiled or transposed kernel overrides it so that the
    /// f32 weight is never materialized in full).
    fn matmul_transposed(w: &Self::Weight, g: &[f32], rows: usize, dx: &mut [f32]) -> Result<()> {
        let [out_feat, in_feat] = Self::shape(w);
        if rows.checked_mul(out_feat) != Some(g.len())
            || rows.checked_mul(in_feat) != Some(dx.len())
        {
            return Err(QuantError::dims(
                "grad_output / dx",
                format!("[{rows}, {out_feat}] / [{rows}, {in_feat}]"),
                format!("{} / {} elements", g.len(), dx.len()),
            ));
        }
        let wd = Self::dequantize(w);
        for (gr, dr) in g.chunks_exact(out_feat).zip(dx.chunks_exact_mut(in_feat)) {
            dr.fill(0.0);
            for (&c, wr) in gr.iter().zip(wd.chunks_exact(in_feat)) {
                for (d, &v) in dr.iter_mut().zip(wr) {
                    *d += c * v;
                }
            }
        }
        Ok(())
    }

    /// Append the weight's tensors to a layer blob.
    fn write_blob(w: &Self::Weight, out: &mut Writer);

    /// Read the tensors [`Self::write_blob`] wrote.
    fn read_blob(r: &mut Reader<'_>) -> Result<Self::BlobParts>;

    /// Validate parsed tensors into a weight.
    fn from_blob(parts: Self::BlobParts) -> Result<Self::Weight>;
}
