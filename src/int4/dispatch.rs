//! Which INT4 kernel runs: the one place that turns a [`MatvecKernel`] or a
//! [`SimdLevel`] into the proof tokens of `crate::simd`, once per call,
//! and the only caller of the per-ISA files.

use super::format::{self, MatvecArgs, RowsArgs, TileArgs, NR};
use super::xint::{self, XInt};
#[cfg(target_arch = "x86_64")]
use super::{avx2, avx512, vnni};
use crate::error::Result;
use crate::simd::{self, SimdLevel};
#[cfg(target_arch = "x86_64")]
use crate::simd::{Avx2, Avx512, Avx512Vnni};

/// Smallest group size the VNNI kernel is chosen for (see
/// [`MatvecKernel::for_weights`]); it also needs a multiple of 8 rows (else
/// the f32 path would run every group).
pub(crate) const VNNI_MIN_GROUP: usize = 32;

/// Which implementation runs the matvec's inner loop.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MatvecKernel {
    /// Portable Rust (the reference).
    Scalar,
    /// AVX2 + FMA.
    #[cfg(target_arch = "x86_64")]
    Avx2,
    /// AVX-512 F/BW/VL.
    #[cfg(target_arch = "x86_64")]
    Avx512,
    /// AVX-512 plus VNNI: integer dot products on `x` split into bytes
    /// (see docs/int4.md), the f32 AVX-512 kernel for the groups that form
    /// cannot carry.
    #[cfg(target_arch = "x86_64")]
    Avx512Vnni,
}

impl MatvecKernel {
    /// The best kernel allowed at `level` for weights of `group_size` (NEON
    /// uses the scalar kernel, which the compiler vectorizes for it).
    ///
    /// The VNNI kernel serves groups from `VNNI_MIN_GROUP` rows on whose
    /// size it can take: below that its per-group epilogue outweighs the
    /// cheaper decode (docs/benchmarks.md has the figures).
    pub fn for_weights(level: SimdLevel, group_size: usize) -> Self {
        #[cfg(target_arch = "x86_64")]
        {
            if let Some(t) = Avx512::at(level) {
                if group_size >= VNNI_MIN_GROUP && xint::eligible(group_size) && t.vnni().is_some()
                {
                    return MatvecKernel::Avx512Vnni;
                }
                return MatvecKernel::Avx512;
            }
            if Avx2::at(level).is_some() {
                return MatvecKernel::Avx2;
            }
        }
        let _ = (level, group_size);
        MatvecKernel::Scalar
    }

    /// Every kernel this machine can run at the level in force (tests and
    /// benches compare them all).
    pub fn available() -> Vec<MatvecKernel> {
        let mut kernels = vec![MatvecKernel::Scalar];
        #[cfg(target_arch = "x86_64")]
        {
            if Avx2::new().is_some() {
                kernels.push(MatvecKernel::Avx2);
            }
            if Avx512::new().is_some() {
                kernels.push(MatvecKernel::Avx512);
            }
            if Avx512Vnni::new().is_some() {
                kernels.push(MatvecKernel::Avx512Vnni);
            }
        }
        kernels
    }

    /// The name `build_info()` and the benches print.
    pub fn name(self) -> &'static str {
        match self {
            MatvecKernel::Scalar => "scalar",
            #[cfg(target_arch = "x86_64")]
            MatvecKernel::Avx2 => "avx2",
            #[cfg(target_arch = "x86_64")]
            MatvecKernel::Avx512 => "avx512",
            #[cfg(target_arch = "x86_64")]
            MatvecKernel::Avx512Vnni => "avx512-vnni",
        }
    }
}

/// A matvec kernel with the token that lets it run.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Matvec {
    Scalar,
    #[cfg(target_arch = "x86_64")]
    Avx2(Avx2),
    #[cfg(target_arch = "x86_64")]
    Avx512(Avx512),
    #[cfg(target_arch = "x86_64")]
    Vnni(Avx512Vnni),
}

impl Matvec {
    /// The tokens for `kernel`, or an error naming the kernels this machine
    /// (and `QUANTRS_SIMD`) allows.
    pub(crate) fn new(kernel: MatvecKernel) -> Result<Matvec> {
        let refused = || {
            crate::error::QuantError::arg(format!(
                "kernel: expected one of {:?} on this machine, got {kernel:?}",
                MatvecKernel::available()
            ))
        };
        Ok(match kernel {
            MatvecKernel::Scalar => Matvec::Scalar,
            #[cfg(target_arch = "x86_64")]
            MatvecKernel::Avx2 => Matvec::Avx2(Avx2::new().ok_or_else(refused)?),
            #[cfg(target_arch = "x86_64")]
            MatvecKernel::Avx512 => Matvec::Avx512(Avx512::new().ok_or_else(refused)?),
            #[cfg(target_arch = "x86_64")]
            MatvecKernel::Avx512Vnni => Matvec::Vnni(Avx512Vnni::new().ok_or_else(refused)?),
        })
    }

    /// Whether the kernel reads `MatvecArgs::xs`.
    pub(crate) fn uses_xs(self) -> bool {
        #[cfg(target_arch = "x86_64")]
        if let Matvec::Avx2(_) = self {
            return true;
        }
        false
    }

    /// `x` (padded, a whole number of groups) in the VNNI kernel's integer
    /// form; `None` for the other kernels.
    pub(crate) fn xint(self, x: &[f32], group_size: usize) -> Option<XInt> {
        #[cfg(target_arch = "x86_64")]
        if let Matvec::Vnni(t) = self {
            // SAFETY: the token proves AVX-512 F/BW/VL; `x` holds whole groups.
            return Some(unsafe { vnni::xint(t.avx512(), x, group_size) });
        }
        let _ = (x, group_size);
        None
    }

    /// `y[..] = (W^T x)[o0 .. o0 + y.len()]`; `xint` is this call's
    /// [`Self::xint`] (the VNNI kernel falls back to AVX-512 without it).
    pub(crate) fn cols(self, args: &MatvecArgs, xint: Option<&XInt>, o0: usize, y: &mut [f32]) {
        let _ = xint;
        match self {
            Matvec::Scalar => format::matvec_scalar(args, o0, y),
            // SAFETY: the token proves the CPU features of the kernel;
            // `args` describes one matrix whose columns `o0 .. o0 + y.len()`
            // exist (checked by the caller).
            #[cfg(target_arch = "x86_64")]
            Matvec::Avx2(t) => unsafe { avx2::matvec(t, args, o0, y) },
            // SAFETY: as above.
            #[cfg(target_arch = "x86_64")]
            Matvec::Avx512(t) => unsafe { avx512::matvec(t, args, o0, y) },
            #[cfg(target_arch = "x86_64")]
            Matvec::Vnni(t) => match xint {
                // SAFETY: as above, and `xint` was built from this call's
                // `x` and group size.
                Some(xi) => unsafe { vnni::matvec(t, args, xi, o0, y) },
                // SAFETY: as above (VNNI implies AVX-512).
                None => unsafe { avx512::matvec(t.avx512(), args, o0, y) },
            },
        }
    }
}

impl Matvec {
    /// Whether the kernel has a multi-row form that decodes the weights
    /// once for several rows of `x` ([`Self::cols_rows`]); the others run
    /// one matvec per row.
    pub(crate) fn has_rows(self) -> bool {
        #[cfg(target_arch = "x86_64")]
        if let Matvec::Avx2(_) = self {
            return true;
        }
        false
    }

    /// `ys[r][..] = (W^T x_r)[o0 .. o0 + width]` for every row of `args`;
    /// kernels without a multi-row form (see [`Self::has_rows`]) run row by
    /// row (the VNNI kernel then on its f32 path, having no integer `x`).
    pub(crate) fn cols_rows(self, args: &RowsArgs, o0: usize, ys: &mut [&mut [f32]]) {
        match self {
            // SAFETY: the token proves the CPU features; `args` describes
            // one matrix whose columns `o0 .. o0 + width` exist and `rows`
            // rows of `x` (checked by the caller and the kernel).
            #[cfg(target_arch = "x86_64")]
            Matvec::Avx2(t) => unsafe { avx2::matvec_rows(t, args, o0, ys) },
            Matvec::Scalar => format::matvec_rows_scalar(args, o0, ys),
            #[cfg(target_arch = "x86_64")]
            _ => {
                for (r, y) in ys.iter_mut().enumerate() {
                    self.cols(&args.row(r), None, o0, y);
                }
            }
        }
    }
}

/// The GEMM pieces of one level: tile dequantizer and micro-kernels.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Gemm {
    Scalar,
    #[cfg(target_arch = "x86_64")]
    Avx2(Avx2),
    #[cfg(target_arch = "x86_64")]
    Avx512(Avx512),
}

impl Gemm {
    /// The pieces for `level`, refused (an error) above the level in force.
    pub(crate) fn new(level: SimdLevel) -> Result<Gemm> {
        simd::require(level)?;
        #[cfg(target_arch = "x86_64")]
        {
            if let Some(t) = Avx512::at(level) {
                return Ok(Gemm::Avx512(t));
            }
            if let Some(t) = Avx2::at(level) {
                return Ok(Gemm::Avx2(t));
            }
        }
        Ok(Gemm::Scalar)
    }

    /// Largest micro-kernel height.
    pub(crate) fn mr(self) -> usize {
        match self {
            Gemm::Scalar => 4,
            #[cfg(target_arch = "x86_64")]
            Gemm::Avx2(_) => 3,
            #[cfg(target_arch = "x86_64")]
            Gemm::Avx512(_) => 12,
        }
    }

    /// Dequantize one tile into panels (see `format::dequant_tile_scalar`).
    pub(crate) fn dequant(self, t: &TileArgs, packed: &mut [f32]) {
        match self {
            Gemm::Scalar => format::dequant_tile_scalar(t, packed),
            // SAFETY: the token proves the features.
            #[cfg(target_arch = "x86_64")]
            Gemm::Avx2(tok) => unsafe { avx2::dequant_tile(tok, t, packed) },
            // SAFETY: the token proves the features.
            #[cfg(target_arch = "x86_64")]
            Gemm::Avx512(tok) => unsafe { avx512::dequant_tile(tok, t, packed) },
        }
    }

    /// `out[0..m] = A[m rows] * panel` for `m <= self.mr()`, split into the
    /// instantiated heights. `a` holds `m` rows of `>= kc` floats at stride
    /// `lda`, `b` holds `kc * NR` floats.
    pub(crate) fn micro(
        self,
        a: &[f32],
        lda: usize,
        b: &[f32],
        kc: usize,
        m: usize,
        out: &mut [[f32; NR]],
    ) {
        assert!(m <= out.len() && b.len() >= kc * NR && a.len() >= (m - 1) * lda + kc);
        let mut done = 0;
        while done < m {
            let rest = m - done;
            let a_rows = &a[done * lda..];
            let o = &mut out[done..];
            done += match self {
                #[cfg(target_arch = "x86_64")]
                // SAFETY: the token proves the features; `a_rows` holds
                // `rest` rows of >= kc floats at stride lda (asserted above)
                // and each call takes at most `rest` of them.
                Gemm::Avx512(t) => unsafe {
                    match rest {
                        12.. => {
                            avx512::gemm_micro::<12>(t, a_rows, lda, b, kc, o);
                            12
                        }
                        8.. => {
                            avx512::gemm_micro::<8>(t, a_rows, lda, b, kc, o);
                            8
                        }
                        4.. => {
                            avx512::gemm_micro::<4>(t, a_rows, lda, b, kc, o);
                            4
                        }
                        2.. => {
                            avx512::gemm_micro::<2>(t, a_rows, lda, b, kc, o);
                            2
                        }
                        _ => {
                            avx512::gemm_micro::<1>(t, a_rows, lda, b, kc, o);
                            1
                        }
                    }
                },
                #[cfg(target_arch = "x86_64")]
                // SAFETY: as above.
                Gemm::Avx2(t) => unsafe {
                    match rest {
                        3.. => {
                            avx2::gemm_micro::<3>(t, a_rows, lda, b, kc, o);
                            3
                        }
                        2 => {
                            avx2::gemm_micro::<2>(t, a_rows, lda, b, kc, o);
                            2
                        }
                        _ => {
                            avx2::gemm_micro::<1>(t, a_rows, lda, b, kc, o);
                            1
                        }
                    }
                },
                Gemm::Scalar => {
                    let h = rest.min(4);
                    format::gemm_micro_scalar(&a_rows[..(h - 1) * lda + kc], lda, b, kc, h, o);
                    h
                }
            };
        }
    }
}
