//! GGUF's block-quantized weights (`crate::ggml`'s types), one generic
//! format for them all: the weight keeps the `[out, in]` rows of blocks
//! exactly as a GGUF file stores them (no float copy); the forward runs the
//! shared row engine (`crate::linear::kernels`: rayon over output rows)
//! with the fused block dots of `crate::ggml` (no float weight) for few
//! batch rows, and tiles decoded once per block of rows, with the SIMD
//! block decode of the level in force, for larger batches.

use std::marker::PhantomData;
use std::ops::Range;

use rayon::prelude::*;

use super::row_forward::forward_rows;
use super::weight_format::{Block, FormatInfo, RowOrder, ScaleStorage, WeightFormat};
use crate::error::{QuantError, Result};
use crate::ggml::quantize::{quantize_matrix, QuantizeRow};
use crate::ggml::{
    bad_scale, decode_block, dot_row, dot_row_a8, dot_rows, A8Dots, GgmlType, Xq, MAX_BLOCK_ELEMS,
};
use crate::linear::dispatch::Dots;
use crate::linear::kernels::RowSource;
use crate::linear::serde::{DType, Reader, Writer};

/// The weight format of ggml block type `T` (`GgufBlocks<Q4_0>`, ...).
#[derive(Clone, Copy, Debug, Default)]
pub struct GgufBlocks<T>(PhantomData<T>);

/// A `[out, in]` weight as GGUF rows of `T` blocks.
#[derive(Clone, Debug, PartialEq)]
pub struct GgufWeight<T> {
    data: Vec<u8>,
    out_feat: usize,
    in_feat: usize,
    kind: PhantomData<T>,
}

impl<T: GgmlType> GgufWeight<T> {
    /// Validated: `in` a positive multiple of `T::ELEMS`, `out > 0`,
    /// `data` exactly `out * in / ELEMS` blocks, every half scale finite.
    pub fn new(data: Vec<u8>, out_feat: usize, in_feat: usize) -> Result<Self> {
        let row = blocks_len::<T>(data.len(), out_feat, in_feat)?;
        let bad = data
            .par_chunks(row)
            .enumerate()
            .find_map_first(|(r, bytes)| bad_scale::<T>(bytes).map(|(b, v)| (r, b, v)));
        if let Some((r, b, v)) = bad {
            return Err(QuantError::arg(format!(
                "{} weight row {r} block {b}: scale {v}, expected a finite half",
                T::NAME
            )));
        }
        // A batch-1 matvec streams the blocks from DRAM on every call.
        crate::hugepages::advise(&data);
        Ok(GgufWeight {
            data,
            out_feat,
            in_feat,
            kind: PhantomData,
        })
    }

    /// The packed blocks, `[out, in / ELEMS]` blocks of `BYTES` bytes.
    pub fn bytes(&self) -> &[u8] {
        &self.data
    }

    /// Rows `rows` of the weight as float32 `[rows.len(), in]`, exactly as
    /// ggml decodes them (the gradient's tiles: the whole weight is never
    /// decoded at once).
    pub fn dequantize_rows(&self, rows: Range<usize>) -> Result<Vec<f32>> {
        crate::error::check_rows(&rows, self.out_feat)?;
        Ok(self.decode_rows(rows))
    }

    /// [`Self::dequantize_rows`] of a range already checked.
    fn decode_rows(&self, rows: Range<usize>) -> Vec<f32> {
        let row = self.data.len() / self.out_feat;
        let bytes = &self.data[rows.start * row..rows.end * row];
        let mut out = vec![0f32; rows.len() * self.in_feat];
        out.par_chunks_mut(T::ELEMS)
            .zip(bytes.par_chunks(T::BYTES))
            .with_min_len(64)
            .for_each(|(o, b)| T::dequantize_block(b, o));
        out
    }
}

/// `y = x . W^T + bias` for `x [rows, in]` over `W` `[out, in]` given as
/// GGUF rows of `T` blocks that the caller owns (`data`, as
/// [`GgufWeight::bytes`]): the forward of [`GgufWeight`] for bytes held
/// elsewhere (a torch module's buffer), so a layer holds them once. Every
/// length is checked in O(1); the scales are not (a non-finite half gives a
/// non-finite output, never an out-of-bounds read).
pub fn matmul_blocks<T: GgmlType>(
    data: &[u8],
    [out_feat, in_feat]: [usize; 2],
    x: &[f32],
    rows: usize,
    bias: Option<&[f32]>,
    y: &mut [f32],
) -> Result<()> {
    let row = blocks_len::<T>(data.len(), out_feat, in_feat)?;
    let rows_ok =
        Some(x.len()) == rows.checked_mul(in_feat) && Some(y.len()) == rows.checked_mul(out_feat);
    if !rows_ok {
        return Err(QuantError::dims(
            "x / y lengths",
            format!("{rows} x {in_feat} / {rows} x {out_feat}"),
            format!("{} / {}", x.len(), y.len()),
        ));
    }
    if let Some(b) = bias.filter(|b| b.len() != out_feat) {
        return Err(QuantError::dims("bias", format!("[{out_feat}]"), b.len()));
    }
    let src = BlockRows::<T> {
        data,
        row_bytes: row,
        dots: Dots::current(),
        kind: PhantomData,
    };
    forward_rows(&src, [out_feat, in_feat], &|_| 1.0, bias, x, rows, y)
}

/// Bytes per row, after checking the shape and that `len` bytes are exactly
/// `out_feat` such rows.
fn blocks_len<T: GgmlType>(len: usize, out_feat: usize, in_feat: usize) -> Result<usize> {
    let row = row_bytes::<T>(out_feat, in_feat)?;
    if Some(len) != row.checked_mul(out_feat) {
        return Err(QuantError::dims(
            format!("{} bytes of a [{out_feat}, {in_feat}] weight", T::NAME),
            row * out_feat,
            len,
        ));
    }
    Ok(row)
}

/// Bytes per row of `in_feat` weights, after checking the shape.
fn row_bytes<T: GgmlType>(out_feat: usize, in_feat: usize) -> Result<usize> {
    if out_feat == 0 || in_feat == 0 || !in_feat.is_multiple_of(T::ELEMS) {
        return Err(QuantError::arg(format!(
            "{} weight shape [{out_feat}, {in_feat}]: expected positive dims with in a \
             multiple of {}",
            T::NAME,
            T::ELEMS
        )));
    }
    Ok(in_feat / T::ELEMS * T::BYTES)
}

/// The rows of a [`GgufWeight`] for the shared forward engine: the fused
/// row dot (`crate::ggml::dot_rows`, several rows per pass at AVX2) at
/// batch 1-3, the block decode of the
/// level in force (`crate::ggml::decode_block`) for the tiles of larger
/// batches.
struct BlockRows<'a, T> {
    data: &'a [u8],
    row_bytes: usize,
    /// The level the tile decode runs at (picked once per call).
    dots: Dots,
    kind: PhantomData<T>,
}

impl<T: GgmlType> RowSource for BlockRows<'_, T> {
    fn decode(&self, r: usize, k0: usize, out: &mut [f32]) {
        let row = &self.data[r * self.row_bytes..(r + 1) * self.row_bytes];
        let mut buf = [0f32; MAX_BLOCK_ELEMS];
        let (mut k, end) = (k0, k0 + out.len());
        while k < end {
            let blk = k / T::ELEMS;
            let block = &row[blk * T::BYTES..(blk + 1) * T::BYTES];
            let from = k - blk * T::ELEMS;
            let n = (T::ELEMS - from).min(end - k);
            if n == T::ELEMS {
                decode_block::<T>(self.dots, block, &mut out[k - k0..k - k0 + n]);
            } else {
                decode_block::<T>(self.dots, block, &mut buf[..T::ELEMS]);
                out[k - k0..k - k0 + n].copy_from_slice(&buf[from..from + n]);
            }
            k += n;
        }
    }

    fn dot(&self, dots: Dots, r: usize, x: &[f32]) -> f32 {
        dot_row::<T>(
            dots,
            &self.data[r * self.row_bytes..(r + 1) * self.row_bytes],
            x,
        )
    }

    /// Several rows per pass over `x` at AVX2 (`crate::ggml::dot_rows`).
    fn dot_rows(&self, dots: Dots, r0: usize, x: &[f32], out: &mut [f32]) {
        dot_rows::<T>(dots, self.data, self.row_bytes, r0, x, out);
    }
}

impl<T: QuantizeRow> WeightFormat for GgufBlocks<T> {
    const INFO: FormatInfo = FormatInfo {
        name: T::NAME,
        aliases: &[],
        dtype_name: T::NAME,
        // 64 + gguf's type value: clear of the other formats' tags.
        serde_tag: 64 + T::GGML_TYPE as u8,
        serde_name: T::NAME,
        layer_name: T::NAME,
        safetensors_format: None,
        order: RowOrder::OutputMajor,
        scales: ScaleStorage::None,
        int8_activations: true,
        gpu: None,
    };
    type Params = ();
    type Weight = GgufWeight<T>;
    type BlobParts = (Vec<usize>, Vec<u8>);

    fn block((): (), _in_feat: usize) -> Result<Block> {
        let halves = 2 * T::HALF_SCALES.len();
        Ok(Block {
            elems: T::ELEMS,
            code_bytes: T::BYTES - halves,
            scale_bytes: halves,
        })
    }

    fn params(_: &GgufWeight<T>) {}

    fn shape(w: &GgufWeight<T>) -> [usize; 2] {
        [w.out_feat, w.in_feat]
    }

    /// ggml's quantizer without an importance matrix
    /// (`crate::ggml::quantize::quantize_matrix`): the bytes llama.cpp's
    /// `ggml_quantize_chunk` writes for the same float rows, so a weight
    /// quantized here (`apply_isq`, `QuantLinear(w, "q4_k")`) equals one
    /// from `GgufWeight.quantize` or `quantrs quantize --format q4_k`.
    fn quantize(w: &[f32], out_feat: usize, in_feat: usize, (): ()) -> Result<GgufWeight<T>> {
        row_bytes::<T>(out_feat, in_feat)?;
        let data = quantize_matrix::<T>(w, out_feat, in_feat, None)?;
        GgufWeight::new(data, out_feat, in_feat)
    }

    fn dequantize(w: &GgufWeight<T>) -> Vec<f32> {
        w.decode_rows(0..w.out_feat)
    }

    fn matmul(
        w: &GgufWeight<T>,
        x: &[f32],
        rows: usize,
        bias: Option<&[f32]>,
        y: &mut [f32],
    ) -> Result<()> {
        matmul_blocks::<T>(&w.data, Self::shape(w), x, rows, bias, y)
    }

    /// `x` quantized once per call to int8 blocks of `T::ELEMS`
    /// (`crate::ggml::Xq`), integer block dots (`crate::ggml::dot_row_a8`);
    /// rayon over output rows, every batch row against a weight row while
    /// it is in cache.
    fn matmul_int8_activations(
        w: &GgufWeight<T>,
        x: &[f32],
        rows: usize,
        y: &mut [f32],
    ) -> Result<()> {
        let (n, k) = (w.out_feat, w.in_feat);
        if rows.checked_mul(k) != Some(x.len()) || rows.checked_mul(n) != Some(y.len()) {
            return Err(QuantError::dims(
                "x / y",
                format!("[{rows}, {k}] / [{rows}, {n}]"),
                format!("{} / {} elements", x.len(), y.len()),
            ));
        }
        let xq = Xq::quantize::<T>(x, rows, k)?;
        let dots = A8Dots::current();
        let row = k / T::ELEMS * T::BYTES;
        // `[out, rows]`, so that each task writes one contiguous run.
        let mut yt = vec![0f32; n * rows];
        // Tasks of `WEIGHT_ROWS` weight rows: the kernels' widest pass.
        let group = A8Dots::WEIGHT_ROWS;
        let task = |(yr, wr): (&mut [f32], &[u8])| dot_row_a8::<T>(dots, wr, &xq, yr);
        if rayon::current_num_threads() == 1 {
            // On the caller's thread: a split hands the work to the pool's
            // sleeping worker, whose wake-up cost tens of microseconds on a
            // loaded machine, the time of a whole small matvec.
            yt.chunks_mut(rows * group)
                .zip(w.data.chunks(row * group))
                .for_each(task);
        } else {
            let min_tasks = ((1 << 15) / row + 1).div_ceil(group);
            yt.par_chunks_mut(rows * group)
                .zip(w.data.par_chunks(row * group))
                .with_min_len(min_tasks)
                .for_each(task);
        }
        for (r, yr) in yt.chunks_exact(rows).enumerate() {
            for (b, &v) in yr.iter().enumerate() {
                y[b * n + r] = v;
            }
        }
        Ok(())
    }

    fn write_blob(w: &GgufWeight<T>, out: &mut Writer) {
        let row = w.data.len() / w.out_feat;
        out.tensor(DType::U8, &[w.out_feat, row], &w.data);
    }

    fn read_blob(r: &mut Reader<'_>) -> Result<Self::BlobParts> {
        let (shape, data) = r.tensor("weight", DType::U8)?;
        if shape.len() != 2 || !shape[1].is_multiple_of(T::BYTES) {
            return Err(QuantError::ser(format!(
                "weight: expected [out, k * {}] bytes of {} blocks, got dims {shape:?}",
                T::BYTES,
                T::NAME
            )));
        }
        Ok((shape, data.to_vec()))
    }

    fn from_blob((shape, data): Self::BlobParts) -> Result<GgufWeight<T>> {
        GgufWeight::new(data, shape[0], shape[1] / T::BYTES * T::ELEMS)
    }
}

#[cfg(test)]
#[path = "gguf_tests.rs"]
mod tests;
