//! Q4_K and Q5_K from float (`quantize_row_q4_K_ref` / `_impl`,
//! `quantize_row_q5_K_ref` / `_impl` of ggml): per super-block of 256, each
//! sub-block of 32 gets a float step and minimum from the scale-and-minimum
//! search, those 8 + 8 values get 6-bit codes against the half `d` /
//! `dmin`, and the weights are re-quantized against the stored
//! multipliers.
//!
//! - Without importance (reference): sub-block weights `sqrt(mean x^2) +
//!   |x|`; `d = max step / 63`, `dmin = max min / 63`, nearest 6-bit codes.
//! - With importance: weights `importance * sqrt(sigma2 + x^2)`, `sigma2 =
//!   2 * mean x^2` over the super-block; a longer sweep; `d` / `dmin` and
//!   their 6-bit codes from `make_qp_quants` weighted by each sub-block's
//!   total weight. Where that yields no finite `d` / `dmin` (ggml divides
//!   0 by 0 when no non-constant sub-block has any importance), the
//!   super-block is quantized as without importance.

use super::super::k_scales::{multipliers, pack_scale_min};
use super::super::put_f16;
use super::legacy::WEIGHTED;
use super::search::{nearest_int, positive_scale, scale_min, Sweep};

/// Which of the two super-block types.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum KMin {
    /// 4-bit codes, 144 bytes.
    Q4K,
    /// 5-bit codes, 176 bytes.
    Q5K,
}

impl KMin {
    fn nmax(self) -> i32 {
        match self {
            KMin::Q4K => 15,
            KMin::Q5K => 31,
        }
    }

    fn bytes(self) -> usize {
        match self {
            KMin::Q4K => 144,
            KMin::Q5K => 176,
        }
    }

    /// The reference quantizer's sweep.
    fn sweep(self) -> Sweep {
        match self {
            KMin::Q4K => Sweep {
                rmin: -1.0,
                rdelta: 0.1,
                nstep: 20,
            },
            KMin::Q5K => Sweep {
                rmin: -0.5,
                rdelta: 0.1,
                nstep: 15,
            },
        }
    }
}

/// Quantize row `x` (whole super-blocks) into `out`.
pub(super) fn row(x: &[f32], importance: Option<&[f32]>, out: &mut [u8], kind: KMin) {
    for (i, (xs, b)) in x
        .chunks_exact(256)
        .zip(out.chunks_exact_mut(kind.bytes()))
        .enumerate()
    {
        let mut q = [0u8; 256];
        let weighted = importance
            .is_some_and(|imp| weighted_scales(xs, &imp[256 * i..256 * i + 256], kind, b, &mut q));
        if !weighted {
            reference_scales(xs, kind, b, &mut q);
        }
        requantize(xs, kind, b, &mut q);
        pack(kind, &q, b);
    }
}

/// The reference choice of `d`, `dmin` and the 6-bit codes (bytes 0..16
/// of `b`); the search's codes in `q`.
fn reference_scales(x: &[f32], kind: KMin, b: &mut [u8], q: &mut [u8; 256]) {
    let (mut scales, mut mins) = ([0f32; 8], [0f32; 8]);
    let (mut max_scale, mut max_min) = (0f32, 0f32);
    for (j, (xj, qj)) in x.chunks_exact(32).zip(q.chunks_exact_mut(32)).enumerate() {
        let mut sum_x2 = 0f32;
        for &v in xj {
            sum_x2 += v * v;
        }
        let av_x = (sum_x2 / 32.0).sqrt();
        let weights: [f32; 32] = std::array::from_fn(|l| av_x + xj[l].abs());
        (scales[j], mins[j]) = scale_min(xj, &weights, kind.nmax(), kind.sweep(), qj);
        if scales[j] > max_scale {
            max_scale = scales[j];
        }
        if mins[j] > max_min {
            max_min = mins[j];
        }
    }
    let inv = |m: f32| if m > 0.0 { 63.0 / m } else { 0.0 };
    let (inv_scale, inv_min) = (inv(max_scale), inv(max_min));
    let six = |v: f32, inv: f32| (nearest_int(inv * v) as u8).min(63);
    let ls: [u8; 8] = std::array::from_fn(|j| six(scales[j], inv_scale));
    let lm: [u8; 8] = std::array::from_fn(|j| six(mins[j], inv_min));
    pack_scale_min(&ls, &lm, &mut b[4..16]);
    put_f16(b, 0, max_scale / 63.0);
    put_f16(b, 2, max_min / 63.0);
}

/// The importance choice (see the module docs); false (and `b` unchanged)
/// where `d` or `dmin` is not finite.
fn weighted_scales(x: &[f32], imp: &[f32], kind: KMin, b: &mut [u8], q: &mut [u8; 256]) -> bool {
    let mut sum_x2 = 0f32;
    for &v in x {
        sum_x2 += v * v;
    }
    let sigma2 = 2.0 * sum_x2 / 256.0;
    let (mut scales, mut mins, mut sw) = ([0f32; 8], [0f32; 8], [0f32; 8]);
    for (j, (xj, qj)) in x.chunks_exact(32).zip(q.chunks_exact_mut(32)).enumerate() {
        let qw = &imp[32 * j..32 * j + 32];
        let weights: [f32; 32] = std::array::from_fn(|l| qw[l] * (sigma2 + xj[l] * xj[l]).sqrt());
        for &w in &weights {
            sw[j] += w;
        }
        (scales[j], mins[j]) = scale_min(xj, &weights, kind.nmax(), WEIGHTED, qj);
    }
    let (mut ls, mut lm) = ([0u8; 8], [0u8; 8]);
    let d = positive_scale(&scales, 63, &sw, &mut ls);
    let dmin = positive_scale(&mins, 63, &sw, &mut lm);
    if !(d.is_finite() && dmin.is_finite()) {
        return false;
    }
    if kind == KMin::Q5K {
        // ggml clamps Q5_K's codes here (not Q4_K's: both are <= 63).
        ls = ls.map(|v| v.min(63));
        lm = lm.map(|v| v.min(63));
    }
    pack_scale_min(&ls, &lm, &mut b[4..16]);
    put_f16(b, 0, d);
    put_f16(b, 2, dmin);
    true
}

/// Re-quantize each weight against its sub-block's stored multipliers:
/// `q = clamp(round((x + dmin m) / (d sc)), 0, nmax)`; a sub-block whose
/// `d sc` is 0 keeps the search's codes (as ggml).
fn requantize(x: &[f32], kind: KMin, b: &[u8], q: &mut [u8; 256]) {
    for ((xj, qj), (d, dm)) in x
        .chunks_exact(32)
        .zip(q.chunks_exact_mut(32))
        .zip(multipliers(b))
    {
        if d == 0.0 {
            continue;
        }
        for (c, &v) in qj.iter_mut().zip(xj) {
            *c = nearest_int((v + dm) / d).clamp(0, kind.nmax()) as u8;
        }
    }
}

/// The codes into the block: per 64 weights, 32 bytes of low nibbles
/// (first 32 low, next 32 high); Q5_K's fifth bits at bits `2c` / `2c + 1`
/// of `qh[l]`.
fn pack(kind: KMin, q: &[u8; 256], b: &mut [u8]) {
    let qs_at = match kind {
        KMin::Q4K => 16,
        KMin::Q5K => {
            b[16..48].fill(0);
            48
        }
    };
    for c in 0..4 {
        for l in 0..32 {
            let (lo, hi) = (q[64 * c + l], q[64 * c + 32 + l]);
            b[qs_at + 32 * c + l] = (lo & 0x0F) | ((hi & 0x0F) << 4);
            if kind == KMin::Q5K {
                b[16 + l] |= ((lo >> 4) << (2 * c)) | ((hi >> 4) << (2 * c + 1));
            }
        }
    }
}
