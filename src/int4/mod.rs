// Over 400 lines: the public type and every entry point's checks, written out.
//! Packed INT4 weights with per-group f32 scales (docs/int4.md).
//!
//! Format, for a weight `w` of shape `[in_feat, out_feat]` (row-major):
//! - effective group `gs = min(group_size, in_feat rounded up to even)`; rows
//!   are zero-padded to `in_padded`, a multiple of `gs`;
//!   `num_groups = in_padded / gs`, `num_pairs = in_padded / 2`;
//! - `scales[g * out_feat + o] = max(absmax(w[rows of g, o]) / 7, 1e-8)`;
//! - `q = clamp(round_half_even(w / scale), -8, 7)` (a true f32 division), so
//!   dequantization `q * scale` equals NumPy's `_fake_quantize_int4` bit for bit;
//! - `data[pair * out_feat + o]` holds row `2*pair` in the low nibble and row
//!   `2*pair + 1` in the high nibble, both as 4-bit two's complement.
//!
//! The files import one way: this one (the type, validation) -> `quantize`
//! (building) and the drivers `matvec` (batch 1, and small batches row by
//! row, dequantizing on the fly), `rows` (batches of 2 to `ROWS_MAX_BATCH`
//! through a multi-row kernel that decodes the weights once for all rows)
//! and `gemm` (a blocked GEMM that dequantizes cache-sized tiles once for
//! all rows of the batch) -> `dispatch` (the
//! kernel and its CPU proof token, chosen once per call) -> the per-ISA
//! kernels `avx2`, `avx512`, `vnni` (with `strips`, their shared walk) ->
//! `format` (argument structs, the scalar twins) and `xint`. The opt-in
//! int8-activation path is the module `a8` (see its docs for its files).

mod a8;
mod array_api;
#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx512;
mod bf16;
mod dispatch;
mod format;
mod gemm;
mod gemm_split;
mod matvec;
mod quantize;
mod rows;
mod scale_search;
#[cfg(test)]
mod scale_search_tests;
mod serde;
#[cfg(target_arch = "x86_64")]
mod strips;
mod transposed;
#[cfg(target_arch = "x86_64")]
mod vnni;
mod weight_ref;
mod xint;

use crate::error::{QuantError, Result};
use crate::simd::{self, SimdLevel};
use dispatch::{Gemm, Matvec};

pub use a8::Activations;
/// The blocked GEMM's micro-kernels and panel layout, shared with the
/// linear layers' batched forward (`crate::linear::kernels`).
pub(crate) use dispatch::Gemm as GemmKernels;
pub use dispatch::MatvecKernel;
pub(crate) use format::{panel_stride, NR as PANEL_WIDTH};
pub(crate) use gemm::{panel_gemm, PanelGemm, TileSpan};
pub use scale_search::ScaleMethod;
pub use weight_ref::QuantizedWeightRef;

/// Default group size along the input dimension.
pub const DEFAULT_GROUP_SIZE: usize = 32;
/// Smallest scale a group can have, so all-zero groups stay finite.
pub const MIN_SCALE: f32 = 1e-8;
/// Batch size from which `matmul` uses the blocked GEMM instead of matvecs
/// (where no multi-row matvec serves the batch, see [`ROWS_MAX_BATCH`]).
pub const GEMM_MIN_BATCH: usize = 8;
/// Largest batch `matmul` runs through the multi-row matvec (AVX2), which
/// decodes the packed weights once for all rows; above it, the blocked GEMM.
pub const ROWS_MAX_BATCH: usize = 16;

/// Packed INT4 weight tensor with per-group f32 scales.
///
/// The fields are private so that every value satisfies the layout the
/// kernels read without bounds checks: build one with [`Self::quantize`]
/// (and its variants) or [`Self::from_parts`], which validates every size.
#[derive(Clone, Debug, PartialEq)]
pub struct QuantizedWeight {
    /// Packed nibbles, `[num_pairs * out_feat]`, see the module docs.
    data: Vec<u8>,
    /// Scales, `[num_groups * out_feat]`.
    scales: Vec<f32>,
    /// Original (unpadded) input dimension.
    in_feat: usize,
    /// Output dimension.
    out_feat: usize,
    /// Number of groups along the input dimension.
    num_groups: usize,
}

/// The derived sizes of the format for one `(in_feat, group_size)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Layout {
    /// The effective group size (rows per scale).
    pub group_size: usize,
    /// Input rows after zero-padding to whole groups.
    pub in_padded: usize,
    /// Groups along the input dimension.
    pub num_groups: usize,
}

impl Layout {
    /// Validate `in_feat` and `group_size` and derive the effective group.
    pub fn new(in_feat: usize, group_size: usize) -> Result<Layout> {
        if in_feat == 0 {
            return Err(QuantError::dims("in_feat", ">= 1", 0));
        }
        if group_size < 2 || !group_size.is_multiple_of(2) {
            return Err(QuantError::arg(format!(
                "group_size: expected an even number >= 2, got {group_size}"
            )));
        }
        // in_feat comes from callers and files: near usize::MAX the padded
        // length would wrap (and a wrapped group of 0 divides by zero).
        let in_padded_max = in_feat
            .checked_add(in_feat % 2)
            .ok_or_else(|| QuantError::arg(format!("in_feat: {in_feat} is too large")))?;
        let gs = group_size.min(in_padded_max);
        let num_groups = in_feat.div_ceil(gs);
        let in_padded = num_groups
            .checked_mul(gs)
            .ok_or_else(|| QuantError::arg(format!("in_feat: {in_feat} is too large")))?;
        Ok(Layout {
            group_size: gs,
            in_padded,
            num_groups,
        })
    }

    /// Packed bytes per output column (two rows per byte).
    pub fn num_pairs(&self) -> usize {
        self.in_padded / 2
    }
}

/// Transparent huge pages for a new weight's buffers: a batch-1 matvec
/// streams them from DRAM on every call (see [`crate::hugepages`]).
fn advise_huge_pages(data: &[u8], scales: &[f32]) {
    crate::hugepages::advise(data);
    crate::hugepages::advise(scales);
}

fn checked_len(a: usize, b: usize, what: &str) -> Result<usize> {
    a.checked_mul(b)
        .ok_or_else(|| QuantError::arg(format!("{what}: {a} x {b} overflows")))
}

/// The sizes [`QuantizedWeight::from_parts`] and [`QuantizedWeightRef::new`]
/// accept: `data_len` bytes and `scales_len` scales must give exactly the
/// layout of `in_feat` inputs in `num_groups` equal even groups for
/// `out_feat` outputs (the group size is not stored: it follows from them).
fn check_parts(
    data_len: usize,
    scales_len: usize,
    in_feat: usize,
    out_feat: usize,
    num_groups: usize,
) -> Result<()> {
    if in_feat == 0 {
        return Err(QuantError::dims("in_feat", ">= 1", 0));
    }
    if out_feat == 0 {
        return Err(QuantError::dims("out_feat", ">= 1", 0));
    }
    if num_groups == 0 {
        return Err(QuantError::arg("num_groups: expected >= 1, got 0"));
    }
    let bad_layout = || {
        QuantError::dims(
            "data",
            format!(
                "num_pairs * out_feat bytes for a layout of in_feat {in_feat} in {num_groups} equal even groups"
            ),
            data_len,
        )
    };
    if !data_len.is_multiple_of(out_feat) {
        return Err(bad_layout());
    }
    let in_padded = 2 * (data_len / out_feat);
    if !in_padded.is_multiple_of(num_groups) {
        return Err(bad_layout());
    }
    let group_size = in_padded / num_groups;
    match Layout::new(in_feat, group_size) {
        Ok(l) if l.in_padded == in_padded && l.num_groups == num_groups => {}
        _ => return Err(bad_layout()),
    }
    let n_scales = checked_len(num_groups, out_feat, "scales")?;
    if scales_len != n_scales {
        return Err(QuantError::dims("scales", n_scales, scales_len));
    }
    Ok(())
}

impl QuantizedWeight {
    /// Quantize `w` `[in_feat, out_feat]` with the default group size (32),
    /// in the original crate's infallible form.
    ///
    /// # Panics
    /// Where [`Self::try_quantize`] returns an error (a `w` whose length is
    /// not `in_feat * out_feat`, a zero dimension, a non-finite weight), with
    /// that error's message.
    pub fn quantize(w: &[f32], in_feat: usize, out_feat: usize) -> Self {
        Self::try_quantize(w, in_feat, out_feat).unwrap_or_else(|e| panic!("{e}"))
    }

    /// Quantize `w` `[in_feat, out_feat]` with the default group size (32);
    /// invalid input is an error and nothing is allocated.
    pub fn try_quantize(w: &[f32], in_feat: usize, out_feat: usize) -> Result<Self> {
        Self::quantize_grouped(w, in_feat, out_feat, DEFAULT_GROUP_SIZE)
    }

    /// Quantize `w` `[in_feat, out_feat]` with absmax scales per group.
    pub fn quantize_grouped(
        w: &[f32],
        in_feat: usize,
        out_feat: usize,
        group_size: usize,
    ) -> Result<Self> {
        let layout = Self::check_input(w, in_feat, out_feat, group_size)?;
        let scales = quantize::absmax_scales(w, in_feat, out_feat, &layout);
        Ok(Self::pack(w, in_feat, out_feat, &layout, scales))
    }

    /// Quantize `w` `[in_feat, out_feat]` with the scales chosen by `method`
    /// (`ScaleMethod::Rtn` is [`Self::quantize_grouped`]); `importance`
    /// (length `in_feat`, finite and >= 0: the mean `x^2` of each input over
    /// calibration data) weights the error that `ScaleMethod::Search` minimizes.
    pub fn quantize_method(
        w: &[f32],
        in_feat: usize,
        out_feat: usize,
        group_size: usize,
        method: ScaleMethod,
        importance: Option<&[f32]>,
    ) -> Result<Self> {
        let layout = Self::check_input(w, in_feat, out_feat, group_size)?;
        if let Some(imp) = importance {
            if imp.len() != in_feat {
                return Err(QuantError::dims("importance", in_feat, imp.len()));
            }
            if let Some(i) = imp.iter().position(|v| !(v.is_finite() && *v >= 0.0)) {
                return Err(QuantError::arg(format!(
                    "importance[{i}]: expected finite and >= 0, got {}",
                    imp[i]
                )));
            }
        }
        let scales = scale_search::scales(w, in_feat, out_feat, &layout, method, importance);
        Ok(Self::pack(w, in_feat, out_feat, &layout, scales))
    }

    /// Quantize `w` with caller-chosen scales `[num_groups * out_feat]` (for
    /// example importance-weighted ones). Each scale must be finite and > 0.
    pub fn quantize_with_scales(
        w: &[f32],
        in_feat: usize,
        out_feat: usize,
        group_size: usize,
        scales: Vec<f32>,
    ) -> Result<Self> {
        let layout = Self::check_input(w, in_feat, out_feat, group_size)?;
        let n = checked_len(layout.num_groups, out_feat, "scales")?;
        if scales.len() != n {
            return Err(QuantError::dims("scales", n, scales.len()));
        }
        if let Some(i) = scales.iter().position(|s| !(s.is_finite() && *s > 0.0)) {
            return Err(QuantError::arg(format!(
                "scales[{i}]: expected finite and > 0, got {}",
                scales[i]
            )));
        }
        Ok(Self::pack(w, in_feat, out_feat, &layout, scales))
    }

    fn check_input(
        w: &[f32],
        in_feat: usize,
        out_feat: usize,
        group_size: usize,
    ) -> Result<Layout> {
        let layout = Layout::new(in_feat, group_size)?;
        if out_feat == 0 {
            return Err(QuantError::dims("out_feat", ">= 1", 0));
        }
        let n = checked_len(in_feat, out_feat, "w")?;
        if w.len() != n {
            return Err(QuantError::dims(
                "w",
                format!("{n} elements ([{in_feat}, {out_feat}])"),
                w.len(),
            ));
        }
        if let Some(i) = quantize::first_non_finite(w) {
            return Err(QuantError::arg(format!(
                "w: non-finite value {} at index [{}, {}] (flat {i})",
                w[i],
                i / out_feat,
                i % out_feat
            )));
        }
        Ok(layout)
    }

    fn pack(w: &[f32], in_feat: usize, out_feat: usize, layout: &Layout, scales: Vec<f32>) -> Self {
        let data = quantize::pack(w, in_feat, out_feat, layout, &scales);
        advise_huge_pages(&data, &scales);
        QuantizedWeight {
            data,
            scales,
            in_feat,
            out_feat,
            num_groups: layout.num_groups,
        }
    }

    /// Rebuild from raw buffers, validating every size and value: the group
    /// size is derived from `num_groups` and must give exactly that layout,
    /// and every scale must be finite (negative and zero ones are valid).
    pub fn from_parts(
        data: Vec<u8>,
        scales: Vec<f32>,
        in_feat: usize,
        out_feat: usize,
        num_groups: usize,
    ) -> Result<Self> {
        check_parts(data.len(), scales.len(), in_feat, out_feat, num_groups)?;
        // Any finite scale: imported formats store negative ones (GGUF Q4_0 keeps
        // the largest-magnitude element's sign in the scale) and zero ones
        // (all-zero blocks); the kernels only multiply by it.
        if let Some(i) = scales.iter().position(|s| !s.is_finite()) {
            return Err(QuantError::arg(format!(
                "scales[{i}]: expected a finite value, got {}",
                scales[i]
            )));
        }
        advise_huge_pages(&data, &scales);
        Ok(QuantizedWeight {
            data,
            scales,
            in_feat,
            out_feat,
            num_groups,
        })
    }

    /// These weights as the borrowed view the kernels run on.
    pub fn view(&self) -> QuantizedWeightRef<'_> {
        QuantizedWeightRef {
            data: &self.data,
            scales: &self.scales,
            in_feat: self.in_feat,
            out_feat: self.out_feat,
            num_groups: self.num_groups,
        }
    }

    /// The packed nibbles, `[num_pairs * out_feat]` (see the module docs).
    pub fn data(&self) -> &[u8] {
        &self.data
    }

    /// The scales, `[num_groups * out_feat]`.
    pub fn scales(&self) -> &[f32] {
        &self.scales
    }

    /// The original (unpadded) input dimension.
    pub fn in_feat(&self) -> usize {
        self.in_feat
    }

    /// The output dimension.
    pub fn out_feat(&self) -> usize {
        self.out_feat
    }

    /// The number of groups along the input dimension.
    pub fn num_groups(&self) -> usize {
        self.num_groups
    }

    /// The packed nibbles and the scales, taken apart (the inverse of
    /// [`Self::from_parts`]).
    pub fn into_parts(self) -> (Vec<u8>, Vec<f32>) {
        (self.data, self.scales)
    }

    /// The effective group size (rows per scale).
    pub fn group_size(&self) -> usize {
        self.in_padded() / self.num_groups
    }

    /// Input dimension after padding to whole groups.
    pub fn in_padded(&self) -> usize {
        2 * self.data.len() / self.out_feat
    }

    /// Packed bytes per output column (two rows per byte).
    pub fn num_pairs(&self) -> usize {
        self.data.len() / self.out_feat
    }

    /// Bytes held: packed data plus scales.
    pub fn nbytes(&self) -> usize {
        self.data.len() + 4 * self.scales.len()
    }

    /// Dequantize into `out` `[in_feat, out_feat]`, in the original crate's
    /// infallible form.
    ///
    /// # Panics
    /// Where [`Self::try_dequantize_to`] returns an error (`out` of the wrong
    /// length).
    pub fn dequantize_to(&self, out: &mut [f32]) {
        self.try_dequantize_to(out)
            .unwrap_or_else(|e| panic!("{e}"))
    }

    /// Dequantize into `out` `[in_feat, out_feat]`; a wrong length is an
    /// error and `out` is untouched.
    pub fn try_dequantize_to(&self, out: &mut [f32]) -> Result<()> {
        let n = self.in_feat * self.out_feat;
        if out.len() != n {
            return Err(QuantError::dims(
                "out",
                format!("{n} elements ([{}, {}])", self.in_feat, self.out_feat),
                out.len(),
            ));
        }
        quantize::dequantize_into(self, out);
        Ok(())
    }

    /// Dequantize to a new `[in_feat, out_feat]` buffer.
    pub fn dequantize(&self) -> Vec<f32> {
        let mut out = vec![0.0f32; self.in_feat * self.out_feat];
        quantize::dequantize_into(self, &mut out);
        out
    }

    /// `y = W^T x`: `x` `[in_feat]`, `y` `[out_feat]`. Never materializes the
    /// f32 weight. The original crate's infallible form.
    ///
    /// # Panics
    /// Where [`Self::try_matvec`] returns an error (a slice of the wrong
    /// length).
    pub fn matvec(&self, x: &[f32], y: &mut [f32]) {
        self.try_matvec(x, y).unwrap_or_else(|e| panic!("{e}"))
    }

    /// `y = W^T x`; a slice of the wrong length is an error and `y` is
    /// untouched.
    pub fn try_matvec(&self, x: &[f32], y: &mut [f32]) -> Result<()> {
        self.try_matmul(x, 1, y)
    }

    /// `Y = X W`: `x` `[batch, in_feat]`, `y` `[batch, out_feat]`, in the
    /// original crate's infallible form.
    ///
    /// # Panics
    /// Where [`Self::try_matmul`] returns an error (a slice of the wrong
    /// length).
    pub fn matmul(&self, x: &[f32], batch: usize, y: &mut [f32]) {
        self.try_matmul(x, batch, y)
            .unwrap_or_else(|e| panic!("{e}"))
    }

    /// `Y = X W`: `x` `[batch, in_feat]`, `y` `[batch, out_feat]`. With the
    /// AVX2 kernel, batches of 2 to [`ROWS_MAX_BATCH`] rows run a multi-row
    /// matvec that decodes the weights once for all rows; otherwise from
    /// [`GEMM_MIN_BATCH`] rows on this is a blocked GEMM over dequantized
    /// tiles, and below it one on-the-fly matvec per row.
    pub fn try_matmul(&self, x: &[f32], batch: usize, y: &mut [f32]) -> Result<()> {
        self.view().try_matmul(x, batch, y)
    }

    /// [`Self::matmul`] at an explicit SIMD level (for tests and benches);
    /// `use_gemm` forces the blocked GEMM even for small batches, and
    /// without it every batch runs the matvec kernels (the multi-row one
    /// where the level has it, from 2 rows on). A level
    /// above the one in force (see [`crate::simd::level`]) is an error.
    pub fn matmul_with(
        &self,
        x: &[f32],
        batch: usize,
        y: &mut [f32],
        level: SimdLevel,
        use_gemm: bool,
    ) -> Result<()> {
        if x.len() != batch * self.in_feat || y.len() != batch * self.out_feat {
            return Err(QuantError::dims(
                "x/y",
                format!("[{batch}, {}] / [{batch}, {}]", self.in_feat, self.out_feat),
                format!("{} / {} elements", x.len(), y.len()),
            ));
        }
        // The kernels of a level need its CPU features: refuse a level this
        // machine (or `QUANTRS_SIMD`) does not allow, rather than run them.
        simd::require(level)?;
        if use_gemm {
            self.view()
                .run(x, batch, y, Kernels::Gemm(Gemm::new(level)?))
        } else {
            let mv = Matvec::new(MatvecKernel::for_weights(level, self.group_size()))?;
            let kernels = if batch >= 2 && mv.has_rows() {
                Kernels::Rows(mv)
            } else {
                Kernels::Matvec(mv)
            };
            self.view().run(x, batch, y, kernels)
        }
    }

    /// [`Self::matvec`] with an explicit kernel (for tests and benches); a
    /// kernel this machine cannot run is an error.
    pub fn matvec_with(&self, x: &[f32], y: &mut [f32], kernel: MatvecKernel) -> Result<()> {
        if x.len() != self.in_feat || y.len() != self.out_feat {
            return Err(QuantError::dims(
                "x/y",
                format!("[{}] / [{}]", self.in_feat, self.out_feat),
                format!("{} / {} elements", x.len(), y.len()),
            ));
        }
        self.view()
            .run(x, 1, y, Kernels::Matvec(Matvec::new(kernel)?))
    }

    /// Signed code of row `r`, column `o` (for tests and slow paths).
    pub fn code(&self, r: usize, o: usize) -> i8 {
        let b = self.data[(r / 2) * self.out_feat + o];
        let nib = if r.is_multiple_of(2) {
            b & 0x0F
        } else {
            b >> 4
        };
        ((nib << 4) as i8) >> 4
    }
}

/// The kernels of one call, chosen once.
#[derive(Clone, Copy)]
enum Kernels {
    Gemm(Gemm),
    /// The bf16 tile GEMM on AMX (`bf16`), `x` split into exact bf16 parts.
    #[cfg(target_arch = "x86_64")]
    Tiles(crate::simd::Amx),
    /// The multi-row matvec (a kernel with [`Matvec::has_rows`]).
    Rows(Matvec),
    Matvec(Matvec),
}

#[cfg(test)]
mod tests;
