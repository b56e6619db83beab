//! [`QuantizedWeightRef`]: packed INT4 weights borrowed from memory someone
//! else owns (a torch buffer seen through NumPy, a memory-mapped file), run
//! by the same kernels as [`QuantizedWeight`](super::QuantizedWeight). The
//! layout is checked when the view is made (sizes only, in O(1): a scale's
//! value never makes a kernel read out of bounds), so a layer that keeps its
//! packed bytes in a tensor holds them once and pays no per-call copy.

use std::mem::MaybeUninit;

use super::dispatch::{Gemm, Matvec};
use super::{
    bf16, check_parts, checked_len, gemm, matvec, rows, Kernels, MatvecKernel, GEMM_MIN_BATCH,
    ROWS_MAX_BATCH,
};
use crate::error::{QuantError, Result};
use crate::simd;

/// A borrowed `[in_feat, out_feat]` INT4 weight: `data` `[num_pairs * out_feat]`
/// packed nibbles and `scales` `[num_groups * out_feat]`, in the layout of
/// the module docs.
#[derive(Clone, Copy, Debug)]
pub struct QuantizedWeightRef<'a> {
    pub(super) data: &'a [u8],
    pub(super) scales: &'a [f32],
    pub(super) in_feat: usize,
    pub(super) out_feat: usize,
    pub(super) num_groups: usize,
}

impl<'a> QuantizedWeightRef<'a> {
    /// A view of `data` and `scales` after checking that their lengths give
    /// exactly the layout of `in_feat` inputs in `num_groups` groups for
    /// `out_feat` outputs (the checks of `QuantizedWeight::from_parts`, less
    /// the scan of the scales' values: a non-finite scale gives non-finite
    /// outputs, never an out-of-bounds read).
    pub fn new(
        data: &'a [u8],
        scales: &'a [f32],
        in_feat: usize,
        out_feat: usize,
        num_groups: usize,
    ) -> Result<Self> {
        check_parts(data.len(), scales.len(), in_feat, out_feat, num_groups)?;
        Ok(QuantizedWeightRef {
            data,
            scales,
            in_feat,
            out_feat,
            num_groups,
        })
    }

    /// The original (unpadded) input dimension.
    pub fn in_feat(&self) -> usize {
        self.in_feat
    }

    /// The output dimension.
    pub fn out_feat(&self) -> usize {
        self.out_feat
    }

    /// The effective group size (rows per scale).
    pub fn group_size(&self) -> usize {
        self.in_padded() / self.num_groups
    }

    /// Input dimension after padding to whole groups.
    pub fn in_padded(&self) -> usize {
        2 * self.data.len() / self.out_feat
    }

    /// `Y = X W`: `x` `[batch, in_feat]`, `y` `[batch, out_feat]`, through the
    /// kernels `QuantizedWeight::try_matmul` documents; a slice of the wrong
    /// length is an error and `y` is untouched.
    pub fn try_matmul(&self, x: &[f32], batch: usize, y: &mut [f32]) -> Result<()> {
        let kernels = self.checked_kernels(x, batch, y.len())?;
        self.run(x, batch, y, kernels)
    }

    /// [`Self::try_matmul`] into an output that need not be initialized (a
    /// new array's allocation, `matmul_array`): `Ok` only once every
    /// element of `y` is written. The blocked FMA GEMM writes it directly
    /// (its first depth block overwrites, `gemm::panel_gemm_uninit`); the
    /// other paths (few rows, AMX tiles, inputs the range check scales)
    /// run on `y` zeroed first.
    pub(super) fn try_matmul_uninit(
        &self,
        x: &[f32],
        batch: usize,
        y: &mut [MaybeUninit<f32>],
    ) -> Result<()> {
        let kernels = self.checked_kernels(x, batch, y.len())?;
        if let Kernels::Gemm(g) = kernels {
            if batch > 0 && crate::range::shifts(x, self.in_feat).is_none() {
                gemm::matmul_uninit(self, x, batch, y, g);
                return Ok(());
            }
        }
        y.fill(MaybeUninit::new(0.0));
        // SAFETY: every element was initialized just above, and
        // `MaybeUninit<f32>` has the layout of `f32`.
        let y = unsafe { &mut *(y as *mut [MaybeUninit<f32>] as *mut [f32]) };
        self.run(x, batch, y, kernels)
    }

    /// The kernels of a `batch`-row call, after checking the lengths of
    /// `x` and of `y` (`ny` elements).
    fn checked_kernels(&self, x: &[f32], batch: usize, ny_got: usize) -> Result<Kernels> {
        let nx = checked_len(batch, self.in_feat, "x")?;
        if x.len() != nx {
            return Err(QuantError::dims(
                "x",
                format!("{nx} elements ([{batch}, {}])", self.in_feat),
                x.len(),
            ));
        }
        let ny = checked_len(batch, self.out_feat, "y")?;
        if ny_got != ny {
            return Err(QuantError::dims(
                "y",
                format!("{ny} elements ([{batch}, {}])", self.out_feat),
                ny_got,
            ));
        }
        let level = simd::level();
        let mv = Matvec::new(MatvecKernel::for_weights(level, self.group_size()))?;
        let kernels = if (2..=ROWS_MAX_BATCH).contains(&batch) && mv.has_rows() {
            Kernels::Rows(mv)
        } else if batch >= GEMM_MIN_BATCH {
            Self::gemm_kernels(level, self.group_size(), batch)?
        } else {
            Kernels::Matvec(mv)
        };
        Ok(kernels)
    }

    /// The GEMM of a `batch`-row call at `level`: the bf16 tile GEMM from
    /// `bf16::MIN_BATCH` rows where AMX-BF16 runs and the group size allows
    /// (docs/int4.md, "How matmul works"), else the blocked FMA GEMM.
    fn gemm_kernels(level: simd::SimdLevel, group_size: usize, batch: usize) -> Result<Kernels> {
        #[cfg(target_arch = "x86_64")]
        if batch >= bf16::MIN_BATCH && level == simd::SimdLevel::Avx512 {
            if let Some(t) = bf16::tiles_for(group_size) {
                return Ok(Kernels::Tiles(t));
            }
        }
        let _ = (group_size, batch);
        Ok(Kernels::Gemm(Gemm::new(level)?))
    }

    /// Run checked `x` `[batch, in_feat]` and `y` `[batch, out_feat]`.
    pub(super) fn run(
        &self,
        x: &[f32],
        batch: usize,
        y: &mut [f32],
        kernels: Kernels,
    ) -> Result<()> {
        if batch == 0 {
            return Ok(());
        }
        if let Some(shifts) = crate::range::shifts(x, self.in_feat) {
            let xs = crate::range::scaled(x, self.in_feat, &shifts);
            self.run_kernels(&xs, batch, y, kernels);
            crate::range::unscale(y, self.out_feat, &shifts);
        } else {
            self.run_kernels(x, batch, y, kernels);
        }
        Ok(())
    }

    fn run_kernels(&self, x: &[f32], batch: usize, y: &mut [f32], kernels: Kernels) {
        match kernels {
            Kernels::Gemm(g) => gemm::matmul(self, x, batch, y, g),
            #[cfg(target_arch = "x86_64")]
            Kernels::Tiles(t) => {
                match bf16::Planes::split_f32(x, batch, self.in_feat, self.in_padded()) {
                    Some(p) => bf16::matmul_tiles(t, self, &p, bf16::Out::F32(y)),
                    // Not finite: the FMA GEMM gives IEEE's inf / NaN.
                    None => gemm::matmul(
                        self,
                        x,
                        batch,
                        y,
                        Gemm::new(simd::level()).unwrap_or(Gemm::Scalar),
                    ),
                }
            }
            Kernels::Rows(k) => rows::matmul_rows(self, x, batch, y, k),
            Kernels::Matvec(k) => {
                for (xr, yr) in x
                    .chunks_exact(self.in_feat)
                    .zip(y.chunks_exact_mut(self.out_feat))
                {
                    matvec::matvec(self, xr, yr, k);
                }
            }
        }
    }
}
