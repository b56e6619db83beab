//! Q6_K from float (`quantize_row_q6_K_ref` / `_impl` of ggml): per
//! super-block of 256, each sub-block of 16 gets a signed scale from the
//! symmetric grid search (`nmax` 32; weighted by `x^2`, or by the
//! importance as it is given), the largest-magnitude scale maps to the
//! 8-bit code -128 (`d = max scale / -128`), and the weights are
//! re-quantized against `d * scale_j` to 6-bit codes.

use super::super::{f16_at, put_f16};
use super::search::{nearest_int, symmetric, GROUP_MAX_EPS};

/// Quantize row `x` (whole super-blocks) into `out` (210 bytes each).
pub(super) fn row(x: &[f32], importance: Option<&[f32]>, out: &mut [u8]) {
    for (i, (xs, b)) in x
        .chunks_exact(256)
        .zip(out.chunks_exact_mut(210))
        .enumerate()
    {
        let mut q = [0u8; 256];
        let mut scales = [0f32; 16];
        let (mut max_scale, mut max_abs) = (0f32, 0f32);
        for (ib, (xj, qj)) in xs.chunks_exact(16).zip(q.chunks_exact_mut(16)).enumerate() {
            let qw = importance.map(|imp| &imp[256 * i + 16 * ib..256 * i + 16 * ib + 16]);
            scales[ib] = symmetric(xj, 32, qw, qj);
            if scales[ib].abs() > max_abs {
                (max_abs, max_scale) = (scales[ib].abs(), scales[ib]);
            }
        }
        if max_abs < GROUP_MAX_EPS {
            b.fill(0);
            continue;
        }
        let iscale = -128.0 / max_scale;
        put_f16(b, 208, 1.0 / iscale);
        for (s, &v) in b[192..208].iter_mut().zip(&scales) {
            *s = (nearest_int(iscale * v).min(127) as i8) as u8;
        }
        let d = f16_at(b, 208);
        for (j, (xj, qj)) in xs.chunks_exact(16).zip(q.chunks_exact_mut(16)).enumerate() {
            let dj = d * f32::from(b[192 + j] as i8);
            if dj == 0.0 {
                continue;
            }
            for (c, &v) in qj.iter_mut().zip(xj) {
                *c = (nearest_int(v / dj).clamp(-32, 31) + 32) as u8;
            }
        }
        pack(&q, b);
    }
}

/// Per 128 weights `n`: `ql[64n + l]` holds codes `l` (low nibble) and
/// `l + 64` (high), `ql[64n + 32 + l]` codes `l + 32` and `l + 96`;
/// `qh[32n + l]` their top two bits at bits 0, 2, 4, 6.
fn pack(q: &[u8; 256], b: &mut [u8]) {
    for n in 0..2 {
        for l in 0..32 {
            let c = |k: usize| q[128 * n + 32 * k + l];
            b[64 * n + l] = (c(0) & 0x0F) | ((c(2) & 0x0F) << 4);
            b[64 * n + 32 + l] = (c(1) & 0x0F) | ((c(3) & 0x0F) << 4);
            b[128 + 32 * n + l] =
                (c(0) >> 4) | ((c(1) >> 4) << 2) | ((c(2) >> 4) << 4) | ((c(3) >> 4) << 6);
        }
    }
}
