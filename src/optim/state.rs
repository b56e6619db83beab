//! Per-parameter quantized state and the parallel step over its groups.
//! (Over 400 lines: the state types and the one step that walks them stay
//! together.)

use super::dither::{dq_encode_dithered, Dither};
use std::collections::BTreeMap;

use rayon::prelude::*;

use super::config::AdvancedQuantizationConfig;
use super::dispatch::Kernels;
use super::format::{inv, nibble, Codecs, MCodec, Pass1, Pass2, StepConsts, VScale, GROUP_BLOCKS};
use crate::scales::ZERO_CODE;

/// Block scales of one moment.
#[derive(Clone, Debug, PartialEq)]
pub enum Scales {
    /// One f32 per block.
    F32(Vec<f32>),
    /// One 8-bit code per block, `(max, step)` f32 per group of 256 blocks.
    Double {
        /// One code per block (255: an all-zero block).
        codes: Vec<u8>,
        /// `(max, log2 step)` per group of 256 blocks.
        groups: Vec<f32>,
    },
}

impl Scales {
    pub(crate) fn zeros(blocks: usize, double: bool) -> Scales {
        if double {
            Scales::Double {
                codes: vec![ZERO_CODE; blocks],
                groups: vec![0.0; 2 * blocks.div_ceil(GROUP_BLOCKS)],
            }
        } else {
            Scales::F32(vec![0.0; blocks])
        }
    }

    /// Bytes of the stored scales.
    pub fn bytes(&self) -> usize {
        match self {
            Scales::F32(s) => 4 * s.len(),
            Scales::Double { codes, groups } => codes.len() + 4 * groups.len(),
        }
    }

    fn group_chunks(&mut self) -> Vec<ScalesChunk<'_>> {
        match self {
            Scales::F32(s) => s.chunks_mut(GROUP_BLOCKS).map(ScalesChunk::F32).collect(),
            Scales::Double { codes, groups } => codes
                .chunks_mut(GROUP_BLOCKS)
                .zip(groups.chunks_mut(2))
                .map(|(c, g)| ScalesChunk::Double(c, g))
                .collect(),
        }
    }
}

enum ScalesChunk<'a> {
    F32(&'a mut [f32]),
    Double(&'a mut [u8], &'a mut [f32]),
}

impl ScalesChunk<'_> {
    fn decode(&self, kernels: &Kernels, out: &mut [f32]) {
        match self {
            ScalesChunk::F32(s) => out.copy_from_slice(s),
            ScalesChunk::Double(c, g) => kernels.scales().decode(c, g[0], g[1], out),
        }
    }

    /// Store the clamped scales `s` (decoded values written back to `s`);
    /// double-quantized codes are rounded up, or without bias with `dither`.
    fn encode(&mut self, kernels: &Kernels, s: &mut [f32], dither: Option<Dither>) {
        match self {
            ScalesChunk::F32(out) => out.copy_from_slice(s),
            ScalesChunk::Double(c, g) => {
                let (max, step) = match dither {
                    Some(d) => dq_encode_dithered(kernels, s, c, d),
                    None => kernels.scales().encode(s, c),
                };
                g[0] = max;
                g[1] = step;
            }
        }
    }
}

/// How v is scaled.
#[derive(Clone, Debug, PartialEq)]
pub enum VScales {
    /// Per-block scales, as for m.
    Block(Scales),
    /// lpmm rank-1 normalization of a 2-D parameter: the scale of element
    /// `(i, j)` is `min(rows[i], cols[j])`, the row and column maxima of v
    /// (in the map's domain) after the last step.
    Rank1 {
        /// Per-row maxima.
        rows: Vec<f32>,
        /// Per-column maxima.
        cols: Vec<f32>,
    },
}

/// The quantized state of one parameter.
#[derive(Clone, Debug, PartialEq)]
pub struct ParamState {
    /// The parameter's shape.
    pub shape: Vec<usize>,
    /// m codes: two 4-bit codes per byte (element `2i` in the low nibble), or one int8 code per element.
    pub m_codes: Vec<u8>,
    /// v codes, two 4-bit codes per byte.
    pub v_codes: Vec<u8>,
    /// Block scales of m.
    pub m_scales: Scales,
    /// Scales of v.
    pub v_scales: VScales,
}

/// Scale clamp bounds `[lo, hi]` in the stored domain.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Clamp {
    pub lo: f32,
    pub hi: f32,
}

impl Clamp {
    #[inline]
    fn apply(self, s: f32) -> f32 {
        if s > 0.0 {
            s.clamp(self.lo, self.hi)
        } else {
            0.0
        }
    }
}

impl ParamState {
    /// Zero state (m = v = 0 exactly) for a parameter of `shape`.
    pub fn new(shape: &[usize], q: &AdvancedQuantizationConfig) -> ParamState {
        let n: usize = shape.iter().product();
        let blocks = n.div_ceil(q.block_size);
        let m_len = if q.method.m_bits() == 8 {
            n
        } else {
            n.div_ceil(2)
        };
        let v_scales = if q.rank1_normalization && shape.len() == 2 {
            VScales::Rank1 {
                rows: vec![0.0; shape[0]],
                cols: vec![0.0; shape[1]],
            }
        } else {
            VScales::Block(Scales::zeros(blocks, q.double_quantization))
        };
        ParamState {
            shape: shape.to_vec(),
            m_codes: vec![0; m_len],
            v_codes: vec![0; n.div_ceil(2)],
            m_scales: Scales::zeros(blocks, q.double_quantization),
            v_scales,
        }
    }

    /// Number of elements.
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }

    /// Bytes of every live state buffer.
    pub fn bytes(&self) -> usize {
        let v = match &self.v_scales {
            VScales::Block(s) => s.bytes(),
            VScales::Rank1 { rows, cols } => 4 * (rows.len() + cols.len()),
        };
        self.m_codes.len() + self.v_codes.len() + self.m_scales.bytes() + v
    }
}

/// Everything the step of one parameter needs besides its buffers.
pub(crate) struct StepCtx<'a> {
    pub kernels: Kernels,
    /// The step being taken (1-based): seeds v's scale rounding.
    pub t: u64,
    pub k: StepConsts,
    pub codecs: &'a Codecs,
    pub block_size: usize,
    pub m_clamp: Clamp,
    pub u_clamp: Clamp,
}

/// One group's f32 working set. Kept per thread and reused across steps
/// (allocating it per rayon job showed up as page-fault time); every range
/// a job reads is written by that job first.
#[derive(Default)]
struct Scratch {
    sm: Vec<f32>,
    su: Vec<f32>,
    m_scale: Vec<f32>,
    v_scale: Vec<f32>,
    m_absmax: Vec<f32>,
    u_max: Vec<f32>,
}

impl Scratch {
    fn ensure(&mut self, group_elems: usize) {
        if self.sm.len() < group_elems {
            self.sm.resize(group_elems, 0.0);
            self.su.resize(group_elems, 0.0);
        }
        if self.m_scale.len() < GROUP_BLOCKS {
            for v in [
                &mut self.m_scale,
                &mut self.v_scale,
                &mut self.m_absmax,
                &mut self.u_max,
            ] {
                v.resize(GROUP_BLOCKS, 0.0);
            }
        }
    }
}

thread_local! {
    static SCRATCH: std::cell::RefCell<Scratch> = std::cell::RefCell::new(Scratch::default());
}

/// New rank-1 statistics: row and column maxima of the new v (map domain),
/// computed with the same element math as the step, clamped.
fn rank1_stats(
    ctx: &StepCtx<'_>,
    st: &ParamState,
    rows_old: &[f32],
    cols_old: &[f32],
    w: &[f32],
    g: &[f32],
) -> (Vec<f32>, Vec<f32>) {
    let (r, c) = (rows_old.len(), cols_old.len());
    let rows_per_task = (16384 / c.max(1)).max(1);
    let mut rows_new = vec![0f32; r];
    let mut cols_new = rows_new
        .par_chunks_mut(rows_per_task)
        .enumerate()
        .fold(
            || vec![0f32; c],
            |mut acc, (ci, chunk)| {
                for (ri, out) in chunk.iter_mut().enumerate() {
                    let i = ci * rows_per_task + ri;
                    let mut rm = 0f32;
                    for j in 0..c {
                        let e = i * c + j;
                        let code = nibble(&st.v_codes, e);
                        let mut v_hat = ctx.codecs.v.decode(code) * rows_old[i].min(cols_old[j]);
                        if ctx.codecs.sqrt_domain {
                            v_hat *= v_hat;
                        }
                        let (_, _, v, r) = ctx.k.element(w[e], g[e], 0.0, v_hat);
                        let u = ctx.codecs.to_domain(v, r);
                        rm = rm.max(u);
                        acc[j] = acc[j].max(u);
                    }
                    *out = rm;
                }
                acc
            },
        )
        .reduce(
            || vec![0f32; c],
            |mut a, b| {
                a.iter_mut().zip(&b).for_each(|(x, y)| *x = x.max(*y));
                a
            },
        );
    for x in rows_new.iter_mut().chain(cols_new.iter_mut()) {
        *x = ctx.u_clamp.apply(*x);
    }
    (rows_new, cols_new)
}

/// One fused step of one parameter: `w` updated in place, state re-encoded.
/// `w` and `g` have `st.numel()` finite elements (checked by the caller).
pub(crate) fn step_param(ctx: &StepCtx<'_>, st: &mut ParamState, w: &mut [f32], g: &[f32]) {
    let bs = ctx.block_size;
    let ge = GROUP_BLOCKS * bs;
    let numel = w.len();
    let m_bytes_per_group = if matches!(ctx.codecs.m, MCodec::Eight(_)) {
        ge
    } else {
        ge / 2
    };
    let rank1 = match &st.v_scales {
        VScales::Rank1 { rows, cols } => Some(rank1_stats(ctx, st, rows, cols, w, g)),
        VScales::Block(_) => None,
    };
    let (old_rows, old_cols) = match &st.v_scales {
        VScales::Rank1 { rows, cols } => (rows.clone(), cols.clone()),
        VScales::Block(_) => (Vec::new(), Vec::new()),
    };
    let m_chunks = st.m_scales.group_chunks();
    let v_chunks: Vec<Option<ScalesChunk<'_>>> = match &mut st.v_scales {
        VScales::Block(s) => s.group_chunks().into_iter().map(Some).collect(),
        VScales::Rank1 { .. } => (0..w.len().div_ceil(ge)).map(|_| None).collect(),
    };
    let jobs: Vec<_> = w
        .chunks_mut(ge)
        .zip(g.chunks(ge))
        .zip(st.m_codes.chunks_mut(m_bytes_per_group))
        .zip(st.v_codes.chunks_mut(ge / 2))
        .zip(m_chunks)
        .zip(v_chunks)
        .enumerate()
        .collect();
    let new_r1 = rank1.as_ref();
    jobs.into_par_iter()
        .for_each(|(gi, (((((w, g), mc), vc), mut msc), mut vsc))| {
            SCRATCH.with(|cell| {
                let mut guard = cell.borrow_mut();
                let s = &mut *guard;
                s.ensure(ge);
                let n = w.len();
                let nb = n.div_ceil(bs);
                let base = gi * ge;
                msc.decode(&ctx.kernels, &mut s.m_scale[..nb]);
                let v_scale = match &vsc {
                    Some(chunk) => {
                        chunk.decode(&ctx.kernels, &mut s.v_scale[..nb]);
                        VScale::Block(&s.v_scale[..nb])
                    }
                    None => VScale::Rank1 {
                        rows: &old_rows,
                        cols: &old_cols,
                        base,
                    },
                };
                ctx.kernels.pass1(
                    &ctx.k,
                    ctx.codecs,
                    bs,
                    Pass1 {
                        w,
                        g,
                        m_codes: mc,
                        v_codes: vc,
                        m_scale: &s.m_scale[..nb],
                        v_scale,
                        sm: &mut s.sm[..n],
                        su: &mut s.su[..n],
                        m_absmax: &mut s.m_absmax[..nb],
                        u_max: &mut s.u_max[..nb],
                    },
                );
                for x in &mut s.m_absmax[..nb] {
                    *x = ctx.m_clamp.apply(*x);
                }
                msc.encode(&ctx.kernels, &mut s.m_absmax[..nb], None);
                for x in &mut s.m_absmax[..nb] {
                    *x = inv(*x);
                }
                let v_inv = match (&mut vsc, new_r1) {
                    (Some(chunk), _) => {
                        for x in &mut s.u_max[..nb] {
                            *x = ctx.u_clamp.apply(*x);
                        }
                        let d = Dither::new(ctx.t, numel as u64, gi as u64);
                        chunk.encode(&ctx.kernels, &mut s.u_max[..nb], Some(d));
                        for x in &mut s.u_max[..nb] {
                            *x = inv(*x);
                        }
                        VScale::Block(&s.u_max[..nb])
                    }
                    (None, Some((rows, cols))) => VScale::Rank1 { rows, cols, base },
                    (None, None) => unreachable!("rank-1 state without statistics"),
                };
                ctx.kernels.pass2(
                    ctx.codecs,
                    bs,
                    Pass2 {
                        sm: &s.sm[..n],
                        su: &s.su[..n],
                        m_inv: &s.m_absmax[..nb],
                        v_inv,
                        m_codes: mc,
                        v_codes: vc,
                    },
                );
            })
        });
    if let (Some((rows, cols)), VScales::Rank1 { rows: r, cols: c }) = (rank1, &mut st.v_scales) {
        *r = rows;
        *c = cols;
    }
}

/// The whole optimizer state: the step counter and every parameter's
/// quantized moments, keyed `"n:<name>"` or `"p:<index>"` (ordered, so
/// checkpoints are deterministic).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct OptimizerState {
    /// Steps taken (the bias corrections use `step + 1`).
    pub step: u64,
    /// Every parameter's state, keyed `"n:<name>"` or `"p:<index>"`.
    pub params: BTreeMap<String, ParamState>,
}

impl OptimizerState {
    /// Bytes of every parameter's live buffers.
    pub fn bytes(&self) -> usize {
        self.params.values().map(ParamState::bytes).sum()
    }

    /// Elements over every parameter.
    pub fn elements(&self) -> usize {
        self.params.values().map(ParamState::numel).sum()
    }
}
