//! Blocked GEMM `Y = X W` over packed INT4 weights (batch >= 8).
//!
//! The classic three-level blocking (Goto & van de Geijn, "Anatomy of
//! high-performance matrix multiplication", 2008), with the packing step
//! replaced by dequantization: each rayon task owns a tile of `NC` output
//! columns (and a block of batch rows), dequantizes `KC` rows of that tile
//! into a panel-major f32 buffer that stays in L2 (`KC * NC * 4` = 256 KiB),
//! and runs an `MR x NR` FMA micro-kernel over every row of the batch. Each
//! weight is dequantized once per call, not once per batch row, and the full
//! f32 weight never exists.

use rayon::prelude::*;

use super::QuantizedWeight;
use crate::simd::SimdLevel;

/// Panel width: output columns per micro-kernel call.
pub const NR: usize = 32;
/// Depth of a dequantized tile (rows of W).
const KC: usize = 256;
/// Output columns per task tile (a multiple of NR).
const NC: usize = 256;
/// Floats between panels beyond their `kc * NR`: without it panels sit a
/// multiple of 4 KiB apart, so a row's eight panel writes all land in the
/// same L1 set and evict each other.
const PANEL_PAD: usize = 16;
/// Size of a task's dequantized tile buffer.
const PACKED_LEN: usize = (NC / NR) * (KC * NR + PANEL_PAD);

/// Distance between consecutive panels of a tile `kc` rows deep.
pub fn panel_stride(kc: usize) -> usize {
    kc * NR + PANEL_PAD
}

/// Largest micro-kernel height across levels.
const MR_MAX: usize = 12;

/// What one tile dequantization needs.
pub struct TileArgs<'a> {
    pub qw: &'a QuantizedWeight,
    /// First row of W in the tile, and how many rows.
    pub k0: usize,
    pub kc: usize,
    /// First output column of the tile, and how many columns.
    pub c0: usize,
    pub nc: usize,
}

/// Write the tile `W[k0 .. k0 + kc, c0 .. c0 + nc]` into `packed` as
/// panels of `NR` columns, each `kc` rows deep
/// (`packed[j * panel_stride(kc) + r * NR + c]`),
/// zero-filling columns past `nc`. Inlined into per-ISA wrappers so the
/// compiler vectorizes it with the widest registers allowed.
#[inline(always)]
pub fn dequant_tile_generic(t: &TileArgs, packed: &mut [f32]) {
    let qw = t.qw;
    let n = qw.out_feat;
    let gs = qw.group_size();
    for j in 0..t.nc.div_ceil(NR) {
        let cj = t.c0 + j * NR;
        let ncols = NR.min(t.c0 + t.nc - cj);
        let panel = &mut packed[j * panel_stride(t.kc)..][..t.kc * NR];
        for (rr, dst) in panel.chunks_exact_mut(NR).enumerate() {
            let r = t.k0 + rr;
            let g = r / gs;
            let src = &qw.data[(r / 2) * n + cj..(r / 2) * n + cj + ncols];
            let sc = &qw.scales[g * n + cj..g * n + cj + ncols];
            if r.is_multiple_of(2) {
                for ((d, &b), &s) in dst.iter_mut().zip(src).zip(sc) {
                    *d = (((b << 4) as i8) >> 4) as f32 * s;
                }
            } else {
                for ((d, &b), &s) in dst.iter_mut().zip(src).zip(sc) {
                    *d = ((b as i8) >> 4) as f32 * s;
                }
            }
            dst[ncols..].fill(0.0);
        }
    }
}

/// The per-level pieces: tile dequantizer and micro-kernels.
#[derive(Clone, Copy)]
struct Kernels {
    level: SimdLevel,
    mr: usize,
}

impl Kernels {
    fn new(level: SimdLevel) -> Self {
        let mr = match level {
            #[cfg(target_arch = "x86_64")]
            SimdLevel::Avx512 => 12,
            #[cfg(target_arch = "x86_64")]
            SimdLevel::Avx2 => 3,
            _ => 4,
        };
        Kernels { level, mr }
    }

    fn dequant(&self, t: &TileArgs, packed: &mut [f32]) {
        match self.level {
            #[cfg(target_arch = "x86_64")]
            // SAFETY: the Avx512 level is only reported after runtime
            // detection of AVX-512 F/BW/VL, AVX2 and FMA.
            SimdLevel::Avx512 => unsafe { super::x86::dequant_tile_avx512(t, packed) },
            #[cfg(target_arch = "x86_64")]
            // SAFETY: the Avx2 level implies detected AVX2 and FMA.
            SimdLevel::Avx2 => unsafe { super::x86::dequant_tile_avx2(t, packed) },
            _ => dequant_tile_generic(t, packed),
        }
    }

    /// `out[0..m] = A[m rows] * panel` for `m <= self.mr`, split into the
    /// instantiated heights.
    fn micro(&self, a: &[f32], lda: usize, b: &[f32], kc: usize, m: usize, out: &mut [[f32; NR]]) {
        let mut done = 0;
        while done < m {
            let rest = m - done;
            let a_rows = &a[done * lda..];
            let o = &mut out[done..];
            done += match self.level {
                #[cfg(target_arch = "x86_64")]
                SimdLevel::Avx512 => {
                    // SAFETY: AVX-512 detected (see `dequant`); the caller
                    // passes `a` with `m` rows of >= kc floats at stride
                    // lda, `b` with kc * NR floats and `out` with m rows.
                    unsafe {
                        match rest {
                            12.. => {
                                super::x86::gemm_micro_avx512::<12>(a_rows, lda, b, kc, o);
                                12
                            }
                            8.. => {
                                super::x86::gemm_micro_avx512::<8>(a_rows, lda, b, kc, o);
                                8
                            }
                            4.. => {
                                super::x86::gemm_micro_avx512::<4>(a_rows, lda, b, kc, o);
                                4
                            }
                            2.. => {
                                super::x86::gemm_micro_avx512::<2>(a_rows, lda, b, kc, o);
                                2
                            }
                            _ => {
                                super::x86::gemm_micro_avx512::<1>(a_rows, lda, b, kc, o);
                                1
                            }
                        }
                    }
                }
                #[cfg(target_arch = "x86_64")]
                SimdLevel::Avx2 => {
                    // SAFETY: AVX2+FMA detected; bounds as above.
                    unsafe {
                        match rest {
                            3.. => {
                                super::x86::gemm_micro_avx2::<3>(a_rows, lda, b, kc, o);
                                3
                            }
                            2 => {
                                super::x86::gemm_micro_avx2::<2>(a_rows, lda, b, kc, o);
                                2
                            }
                            _ => {
                                super::x86::gemm_micro_avx2::<1>(a_rows, lda, b, kc, o);
                                1
                            }
                        }
                    }
                }
                _ => {
                    let h = rest.min(4);
                    gemm_micro_scalar(&a_rows[..(h - 1) * lda + kc], lda, b, kc, h, o);
                    h
                }
            };
        }
    }
}

/// Scalar reference micro-kernel: `out[m][c] = sum_k a[m * lda + k] * b[k * NR + c]`.
pub fn gemm_micro_scalar(
    a: &[f32],
    lda: usize,
    b: &[f32],
    kc: usize,
    m: usize,
    out: &mut [[f32; NR]],
) {
    for (mi, o) in out.iter_mut().take(m).enumerate() {
        let mut acc = [0.0f32; NR];
        let row = &a[mi * lda..mi * lda + kc];
        for (k, &av) in row.iter().enumerate() {
            let bk = &b[k * NR..(k + 1) * NR];
            for (c, bv) in acc.iter_mut().zip(bk) {
                *c += av * bv;
            }
        }
        *o = acc;
    }
}

/// A raw pointer that may cross threads; tasks write disjoint blocks of `y`.
#[derive(Clone, Copy)]
struct SendPtr(*mut f32);
// SAFETY: every task writes a block of `y` (its own output columns and batch
// rows) that no other task touches, and `matmul` outlives all tasks.
unsafe impl Send for SendPtr {}
unsafe impl Sync for SendPtr {}

impl SendPtr {
    /// A method (not field access) so closures capture the whole wrapper.
    fn get(self) -> *mut f32 {
        self.0
    }
}

/// `y [batch, out_feat] = x [batch, in_feat] @ W`, sizes already checked.
pub fn matmul(qw: &QuantizedWeight, x: &[f32], batch: usize, y: &mut [f32], level: SimdLevel) {
    let (k, n) = (qw.in_feat, qw.out_feat);
    debug_assert_eq!(x.len(), batch * k);
    debug_assert_eq!(y.len(), batch * n);
    let kernels = Kernels::new(level);
    let tiles_n = n.div_ceil(NC);
    // Enough tasks to keep every thread busy: split the batch when there are
    // few column tiles (each task then dequantizes its tile again, which is
    // cheap next to the FMAs it feeds).
    let want = 2 * rayon::current_num_threads().max(1);
    let b_blocks = if tiles_n >= want {
        1
    } else {
        want.div_ceil(tiles_n)
            .min(batch.div_ceil(kernels.mr))
            .max(1)
    };
    let bb = batch.div_ceil(b_blocks).next_multiple_of(kernels.mr);
    let b_blocks = batch.div_ceil(bb);
    let yp = SendPtr(y.as_mut_ptr());
    let task = |packed: &mut Vec<f32>, t: usize| {
        let (tn, tb) = (t % tiles_n, t / tiles_n);
        let (c0, b0) = (tn * NC, tb * bb);
        let (nc, b1) = (NC.min(n - c0), (b0 + bb).min(batch));
        let mut out = [[0.0f32; NR]; MR_MAX];
        for k0 in (0..k).step_by(KC) {
            let kc = KC.min(k - k0);
            let tile = TileArgs { qw, k0, kc, c0, nc };
            kernels.dequant(&tile, packed);
            for j in 0..nc.div_ceil(NR) {
                let panel = &packed[j * panel_stride(kc)..][..kc * NR];
                let cj = c0 + j * NR;
                let ncols = NR.min(c0 + nc - cj);
                let mut b = b0;
                while b < b1 {
                    let m = kernels.mr.min(b1 - b);
                    let a = &x[b * k + k0..(b + m - 1) * k + k0 + kc];
                    kernels.micro(a, k, panel, kc, m, &mut out);
                    for (r, o) in out.iter().take(m).enumerate() {
                        // SAFETY: row b + r < batch and columns cj .. cj +
                        // ncols <= n lie in this task's block of y, which no
                        // other task writes (see SendPtr).
                        let yrow = unsafe {
                            std::slice::from_raw_parts_mut(yp.get().add((b + r) * n + cj), ncols)
                        };
                        if k0 == 0 {
                            yrow.copy_from_slice(&o[..ncols]);
                        } else {
                            for (yv, ov) in yrow.iter_mut().zip(o) {
                                *yv += ov;
                            }
                        }
                    }
                    b += m;
                }
            }
        }
    };
    let tasks = tiles_n * b_blocks;
    if tasks == 1 || (batch * k * n) < (1 << 20) {
        let mut packed = vec![0.0f32; PACKED_LEN];
        (0..tasks).for_each(|t| task(&mut packed, t));
    } else {
        (0..tasks)
            .into_par_iter()
            .for_each_init(|| vec![0.0f32; PACKED_LEN], task);
    }
}
