//! The per-group searches of ggml's quantizers (`ggml-quants.c`:
//! `nearest_int`, `make_qx_quants`, `make_qkx2_quants` /
//! `make_qkx3_quants`, `make_qp_quants`), as formulas evaluated in ggml's
//! float32 order: every sum runs left to right over the group, every
//! product associates left to right as the C source writes it, and codes
//! are stored through `u8` where ggml stores them in a `uint8_t`, so the
//! chosen codes (and so the bytes) are ggml's.

/// ggml's `GROUP_MAX_EPS`: a group whose largest |x| is below it is zero.
pub(super) const GROUP_MAX_EPS: f32 = 1e-15;

/// ggml's `nearest_int`: round to nearest, ties to even, by adding
/// `1.5 * 2^23` and reading the low mantissa bits (valid for |v| < 2^22;
/// outside that it returns the same bits as ggml, which is what matters).
#[inline(always)]
pub(super) fn nearest_int(v: f32) -> i32 {
    let f = v + 12_582_912.0;
    (f.to_bits() & 0x007F_FFFF) as i32 - 0x0040_0000
}

/// The grids of the symmetric search, one lane each: lane `g` steps by
/// `-(nmax + 0.1 (g - 9)) / max`, so lane 9 is the first grid `-nmax /
/// max` and lanes 0..=18 the 18 neighbours ggml tries; lane 19 repeats
/// lane 18 so that the lanes fill whole vector registers (5 of 4 floats).
const GRIDS: usize = 20;
/// The lane of the first grid (`k = 0`).
const FIRST: usize = 9;

/// ggml's `MAX(-nmax, MIN(nmax - 1, nearest_int(t)))` as a float, for
/// `|t| < 2^22`: adding and subtracting `1.5 * 2^23` rounds `t` to the
/// nearest whole number, ties to even (the sum's unit in the last place is
/// 1, and the subtraction is exact), the value `nearest_int` reads from
/// the bits; the clamps are `minps` / `maxps`, so the lanes vectorize.
#[inline(always)]
fn grid_code(t: f32, lo: f32, hi: f32) -> f32 {
    let r = (t + 12_582_912.0) - 12_582_912.0;
    let r = if r > lo { r } else { lo };
    if r < hi {
        r
    } else {
        hi
    }
}

/// The symmetric grid search (`make_qx_quants` with `rmse_type = 1`):
/// codes `l + nmax` for `l` in `-nmax..nmax` written to `codes`, and the
/// returned scale `d` (so `x ~ d * l`). The weight of input `i` is `qw[i]`,
/// or `x_i^2` without `qw`. Starts at `d = max / -nmax` (the signed absmax
/// on code 0), takes the least-squares scale of those codes, then tries 18
/// neighbouring grids `-(nmax + 0.1 k) / max` and keeps the one of largest
/// `sum(w x l)^2 / sum(w l^2)` (the least weighted squared error).
///
/// ggml evaluates the grids one after another, each as two serial sums
/// over the group (bound by the latency of the adds). The grids do not
/// depend on each other, so here all 19 advance together, one lane each
/// ([`GRIDS`]): every lane's sums still run left to right over the group
/// with ggml's products (`(w x) l`, `(w l) l`), so each grid's `sumlx` /
/// `suml2` are ggml's bit for bit; the choice then walks the grids in
/// ggml's order with its comparisons, and the codes are those of the grid
/// it keeps (ggml rewrites them at every improvement: the last one stays).
/// `x` is at most 32 long, `|x| > 0` somewhere: `|t| = |iscale x| <= nmax
/// + 0.9` and a little rounding, well inside [`grid_code`]'s range.
pub(super) fn symmetric(x: &[f32], nmax: i32, qw: Option<&[f32]>, codes: &mut [u8]) -> f32 {
    let (mut max, mut amax) = (0f32, 0f32);
    for &v in x {
        if v.abs() > amax {
            (amax, max) = (v.abs(), v);
        }
    }
    if amax < GROUP_MAX_EPS {
        codes.fill(0);
        return 0.0;
    }
    let nm = nmax as f32;
    let (lo, hi) = (-nm, nm - 1.0);
    // ggml: `-nmax / max` for the first grid, `-(nmax + 0.1f * is) / max`
    // for the others; `nmax + 0.1 * 0` is `nmax` exactly.
    let iscale: [f32; GRIDS] = std::array::from_fn(|g| {
        let k = g.min(2 * FIRST) as i32 - FIRST as i32;
        -(nm + 0.1 * k as f32) / max
    });
    let (mut sumlx, mut suml2) = ([0f32; GRIDS], [0f32; GRIDS]);
    for (i, &v) in x.iter().enumerate() {
        let w = qw.map_or(v * v, |q| q[i]);
        let wx = w * v;
        for g in 0..GRIDS {
            let l = grid_code(iscale[g] * v, lo, hi);
            sumlx[g] += wx * l;
            suml2[g] += w * l * l;
        }
    }
    let mut keep = FIRST;
    let mut scale = if suml2[FIRST] != 0.0 {
        sumlx[FIRST] / suml2[FIRST]
    } else {
        0.0
    };
    let mut best = scale * sumlx[FIRST];
    for g in (0..=2 * FIRST).filter(|&g| g != FIRST) {
        if suml2[g] > 0.0 && sumlx[g] * sumlx[g] > best * suml2[g] {
            keep = g;
            scale = sumlx[g] / suml2[g];
            best = scale * sumlx[g];
        }
    }
    for (c, &v) in codes.iter_mut().zip(x) {
        // A whole number in `0..2 nmax`.
        *c = (grid_code(iscale[keep] * v, lo, hi) + nm) as u8;
    }
    scale
}

/// How the scale-and-minimum search steps through grids: `nstep + 1`
/// grids of `nmax + rmin + rdelta * k` steps over the group's range.
#[derive(Clone, Copy, Debug)]
pub(super) struct Sweep {
    pub rmin: f32,
    pub rdelta: f32,
    pub nstep: i32,
}

/// The scale-and-minimum search (`make_qkx2_quants`, and
/// `make_qkx3_quants` with weights, which is the same computation): codes
/// `0..=nmax` written to `codes` and `(scale, min)` with `x ~ scale * l -
/// min`, `min >= 0`. The range is `[min(x, 0), max(x)]`; the first grid
/// spans it in `nmax` steps, then each grid of `sweep` is fitted by
/// weighted least squares (the minimum held at 0 where the fit puts it
/// above) and kept where its weighted squared error is smaller.
pub(super) fn scale_min(
    x: &[f32],
    weights: &[f32],
    nmax: i32,
    sweep: Sweep,
    codes: &mut [u8],
) -> (f32, f32) {
    let (mut min, mut max) = (x[0], x[0]);
    let mut sum_w = weights[0];
    let mut sum_x = sum_w * x[0];
    for (&v, &w) in x.iter().zip(weights).skip(1) {
        if v < min {
            min = v;
        }
        if v > max {
            max = v;
        }
        sum_w += w;
        sum_x += w * v;
    }
    if min > 0.0 {
        min = 0.0;
    }
    if max == min {
        codes.fill(0);
        return (0.0, -min);
    }
    let nm = nmax as f32;
    let code = |iscale: f32, v: f32, min: f32| nearest_int(iscale * (v - min)).clamp(0, nmax) as u8;
    let error = |scale: f32, min: f32, codes: &[u8]| {
        let mut e = 0f32;
        for ((&v, &w), &l) in x.iter().zip(weights).zip(codes) {
            let diff = scale * f32::from(l) + min - v;
            e += w * (diff * diff);
        }
        e
    };
    let iscale = nm / (max - min);
    let mut scale = 1.0 / iscale;
    for (c, &v) in codes.iter_mut().zip(x) {
        *c = code(iscale, v, min);
    }
    let mut best = error(scale, min, codes);
    let mut aux = [0u8; 32];
    let aux = &mut aux[..x.len()];
    // Each grid spans `[min, max]` with the minimum of the best fit so far
    // (ggml updates `min` in place).
    for is in 0..=sweep.nstep {
        let iscale = (sweep.rmin + sweep.rdelta * is as f32 + nm) / (max - min);
        let (mut sum_l, mut sum_l2, mut sum_xl) = (0f32, 0f32, 0f32);
        for ((a, &v), &w) in aux.iter_mut().zip(x).zip(weights) {
            *a = code(iscale, v, min);
            let l = f32::from(*a);
            sum_l += w * l;
            sum_l2 += w * l * l;
            sum_xl += w * l * v;
        }
        let det = sum_w * sum_l2 - sum_l * sum_l;
        if det > 0.0 {
            let mut this_scale = (sum_w * sum_xl - sum_x * sum_l) / det;
            let mut this_min = (sum_l2 * sum_x - sum_l * sum_xl) / det;
            if this_min > 0.0 {
                this_min = 0.0;
                this_scale = sum_xl / sum_l2;
            }
            let e = error(this_scale, this_min, aux);
            if e < best {
                codes.copy_from_slice(aux);
                (best, scale, min) = (e, this_scale, this_min);
            }
        }
    }
    (scale, -min)
}

/// The search for a super-block's scale of its 8 non-negative sub-block
/// values `x` (scales or minimums; `make_qp_quants`): 6-bit codes (`<=
/// nmax`) to `codes`, returns the step. Tries 9 grids `(nmax + 0.1 k) /
/// max`, then moves single codes while the weighted least-squares fit
/// (`sum(w x l)^2 / sum(w l^2)`) improves, at most 5 passes.
pub(super) fn positive_scale(x: &[f32], nmax: i32, qw: &[f32], codes: &mut [u8]) -> f32 {
    let mut max = 0f32;
    for &v in x {
        max = if max > v { max } else { v };
    }
    if max == 0.0 {
        codes.fill(0);
        return 0.0;
    }
    let nm = nmax as f32;
    let mut iscale = nm / max;
    for (c, &v) in codes.iter_mut().zip(x) {
        *c = nearest_int(iscale * v) as u8;
    }
    let scale = 1.0 / iscale;
    let mut best = 0f32;
    for ((&v, &w), &l) in x.iter().zip(qw).zip(codes.iter()) {
        let diff = v - scale * f32::from(l);
        best += w * diff * diff;
    }
    for is in (-4..=4).filter(|&k| k != 0) {
        let iscale_is = (0.1 * is as f32 + nm) / max;
        let scale_is = 1.0 / iscale_is;
        let mut mse = 0f32;
        for (&v, &w) in x.iter().zip(qw) {
            let l = nearest_int(iscale_is * v).min(nmax);
            let diff = v - scale_is * l as f32;
            mse += w * diff * diff;
        }
        if mse < best {
            (best, iscale) = (mse, iscale_is);
        }
    }
    let (mut sumlx, mut suml2) = (0f32, 0f32);
    for ((c, &v), &w) in codes.iter_mut().zip(x).zip(qw) {
        let l = nearest_int(iscale * v).min(nmax);
        *c = l as u8;
        let l = l as f32;
        sumlx += w * v * l;
        suml2 += w * l * l;
    }
    for _ in 0..5 {
        let mut changed = false;
        for ((c, &v), &w) in codes.iter_mut().zip(x).zip(qw) {
            let old = f32::from(*c);
            let mut slx = sumlx - w * v * old;
            let mut sl2 = suml2 - w * old * old;
            if slx > 0.0 && sl2 > 0.0 {
                let new_l = nearest_int(v * sl2 / slx).min(nmax);
                if new_l != i32::from(*c) {
                    let nl = new_l as f32;
                    slx += w * v * nl;
                    sl2 += w * nl * nl;
                    if slx * slx * suml2 > sumlx * sumlx * sl2 {
                        *c = new_l as u8;
                        (sumlx, suml2) = (slx, sl2);
                        changed = true;
                    }
                }
            }
        }
        if !changed {
            break;
        }
    }
    sumlx / suml2
}
