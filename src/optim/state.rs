//! Per-parameter quantized state and the parallel step over its groups.
//! (Over 400 lines: the state types and the one step that walks them stay
//! together.)

use super::dither::{dq_encode_dithered, Dither};
use std::collections::BTreeMap;

use rayon::prelude::*;

use super::config::AdvancedQuantizationConfig;
use super::dispatch::Kernels;
use super::format::{inv, nibble, Codecs, MCodec, Pass1, Pass2, StepConsts, VScale, GROUP_BLOCKS};
use crate::scales::{direct, ZERO_CODE};

/// Block scales of one moment.
#[derive(Clone, Debug, PartialEq)]
pub enum Scales {
    /// One f32 per block.
    F32(Vec<f32>),
    /// One 8-bit code per block, `(max, step)` f32 per group of 256 blocks
    /// (in the row layout: `max` per group, the step fixed,
    /// `crate::scales::direct`).
    Double {
        /// One code per block (255: an all-zero block).
        codes: Vec<u8>,
        /// `(max, log2 step)` per group of 256 blocks, or `max` per group of
        /// the row layout.
        groups: Vec<f32>,
    },
}

impl Scales {
    /// Zero scales of `blocks` blocks in `groups` double-quantization groups
    /// of `width` floats each (2 for the flat layout, 1 for the row layout).
    pub(crate) fn zeros(blocks: usize, groups: usize, width: usize, double: bool) -> Scales {
        if double {
            Scales::Double {
                codes: vec![ZERO_CODE; blocks],
                groups: vec![0.0; width * groups],
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

    /// The scales of each group, `blocks[i]` blocks for group `i`.
    fn group_chunks(&mut self, blocks: &[usize], width: usize) -> Vec<ScalesChunk<'_>> {
        match self {
            Scales::F32(s) => split_lens(s, blocks).map(ScalesChunk::F32).collect(),
            Scales::Double { codes, groups } => split_lens(codes, blocks)
                .zip(groups.chunks_mut(width))
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
    /// `direct`: the table-free codec of the row layout (`scales::direct`).
    fn decode(&self, kernels: &Kernels, out: &mut [f32], direct: bool) {
        match self {
            ScalesChunk::F32(s) => out.copy_from_slice(s),
            ScalesChunk::Double(c, g) if direct => direct::decode(c, g[0], out),
            ScalesChunk::Double(c, g) => kernels.scales().decode(c, g[0], g[1], out),
        }
    }

    /// Store the clamped scales `s` (decoded values written back to `s`);
    /// double-quantized codes are rounded up, or without bias with `dither`.
    fn encode(&mut self, kernels: &Kernels, s: &mut [f32], dither: Option<Dither>, direct: bool) {
        match self {
            ScalesChunk::F32(out) => out.copy_from_slice(s),
            ScalesChunk::Double(c, g) => {
                if direct {
                    g[0] = kernels.scales().encode_row(s, c, dither);
                    return;
                }
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
    /// The row layout of a sharded parameter ([`RowLayout`]), or `None`:
    /// groups of 256 blocks over the flattened tensor.
    pub rows: Option<RowLayout>,
}

/// The row layout of one rank's rows of a parameter sharded on dim 0
/// (FSDP2; docs/torch.md "The sharded layout"): the state is
/// `[local rows, row length]`, the row length a multiple of the block
/// size, and a double-quantization group of up to 256 blocks never
/// crosses a row, so no stored number depends on more than one row and the
/// result of a step does not depend on where the shards are cut. v's
/// scale rounding is keyed by the global row (`first_row` + local row) and
/// the global element count, the same on every world size.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RowLayout {
    /// The global index of the first local row.
    pub first_row: u64,
    /// Rows of the whole parameter.
    pub global_rows: u64,
}

/// Floats per double-quantization group: `(max, step)` in the flat layout,
/// `max` in the row layout.
fn group_width(rows: Option<RowLayout>) -> usize {
    if rows.is_some() {
        1
    } else {
        2
    }
}

/// Consecutive sub-slices of `s` of the lengths `lens` (which add up to at
/// most `s.len()`).
fn split_lens<'a, T>(mut s: &'a mut [T], lens: &[usize]) -> impl Iterator<Item = &'a mut [T]> {
    lens.iter()
        .map(move |&n| {
            let (head, tail) = std::mem::take(&mut s).split_at_mut(n);
            s = tail;
            head
        })
        .collect::<Vec<_>>()
        .into_iter()
}

/// The work items of one parameter: the element count of each group, the
/// global index of its first block (v's scale rounding), and the element
/// count the rounding is keyed by.
struct Groups {
    elems: Vec<usize>,
    first_block: Vec<u64>,
    key_numel: u64,
}

impl Groups {
    fn of(shape: &[usize], rows: Option<RowLayout>, bs: usize) -> Groups {
        let n: usize = shape.iter().product();
        let ge = GROUP_BLOCKS * bs;
        match rows {
            None => {
                let elems: Vec<usize> = (0..n).step_by(ge).map(|s| ge.min(n - s)).collect();
                let first_block = (0..elems.len() as u64)
                    .map(|g| g * GROUP_BLOCKS as u64)
                    .collect();
                Groups {
                    elems,
                    first_block,
                    key_numel: n as u64,
                }
            }
            Some(layout) => {
                let (local_rows, row) = (shape[0], n / shape[0].max(1));
                let row_blocks = row.div_ceil(bs) as u64;
                let per_row: Vec<usize> = (0..row).step_by(ge).map(|s| ge.min(row - s)).collect();
                let mut elems = Vec::with_capacity(local_rows * per_row.len());
                let mut first_block = Vec::with_capacity(elems.capacity());
                for r in 0..local_rows as u64 {
                    for (j, &e) in per_row.iter().enumerate() {
                        elems.push(e);
                        let global_row = layout.first_row + r;
                        first_block.push(global_row * row_blocks + (j * GROUP_BLOCKS) as u64);
                    }
                }
                Groups {
                    elems,
                    first_block,
                    key_numel: layout.global_rows.saturating_mul(row as u64),
                }
            }
        }
    }

    fn blocks(&self, bs: usize) -> Vec<usize> {
        self.elems.iter().map(|e| e.div_ceil(bs)).collect()
    }
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
    /// Zero state (m = v = 0 exactly) for a parameter of `shape`, in the flat
    /// layout.
    pub fn new(shape: &[usize], q: &AdvancedQuantizationConfig) -> ParamState {
        ParamState::with_rows(shape, q, None)
    }

    /// Zero state for a parameter of `shape` in the row layout `rows` (a
    /// 2-D `shape` whose row length is a multiple of the block size, and no
    /// rank-1 normalization: checked by the engine), or flat for `None`.
    pub fn with_rows(
        shape: &[usize],
        q: &AdvancedQuantizationConfig,
        rows: Option<RowLayout>,
    ) -> ParamState {
        let n: usize = shape.iter().product();
        let blocks = n.div_ceil(q.block_size);
        let groups = Groups::of(shape, rows, q.block_size).elems.len();
        let width = group_width(rows);
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
            VScales::Block(Scales::zeros(blocks, groups, width, q.double_quantization))
        };
        ParamState {
            shape: shape.to_vec(),
            m_codes: vec![0; m_len],
            v_codes: vec![0; n.div_ceil(2)],
            m_scales: Scales::zeros(blocks, groups, width, q.double_quantization),
            v_scales,
            rows,
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
    /// Two working sets: the interleaved step (`run_interleaved`) encodes
    /// one group from one while it updates the next into the other.
    static SCRATCH: std::cell::RefCell<[Scratch; 2]> = std::cell::RefCell::new(Default::default());
}

/// Consecutive groups per rayon job of the interleaved step: long enough
/// that most groups overlap their pass 1 with the previous group's pass 2,
/// short enough to spread a parameter over the threads.
const RUN_GROUPS: usize = 8;

/// One group's work item: its weight, gradient, codes, scale chunks, first
/// element and first block (the dither's key).
type Job<'a> = (
    (
        (
            (((&'a mut [f32], &'a [f32]), &'a mut [u8]), &'a mut [u8]),
            ScalesChunk<'a>,
        ),
        Option<ScalesChunk<'a>>,
    ),
    (&'a usize, &'a u64),
);

/// Clamp the block maxima of m in `s.m_absmax[..nb]`, store them as the
/// group's m scales and leave their inverses (pass 2's factors) in place.
fn encode_m_scales(
    ctx: &StepCtx<'_>,
    s: &mut Scratch,
    nb: usize,
    msc: &mut ScalesChunk<'_>,
    direct: bool,
) {
    for x in &mut s.m_absmax[..nb] {
        *x = ctx.m_clamp.apply(*x);
    }
    msc.encode(&ctx.kernels, &mut s.m_absmax[..nb], None, direct);
    for x in &mut s.m_absmax[..nb] {
        *x = inv(*x);
    }
}

/// The same for v's block scales in `s.u_max[..nb]`, rounded without bias
/// (`dither.rs`).
fn encode_v_scales(
    ctx: &StepCtx<'_>,
    s: &mut Scratch,
    nb: usize,
    vsc: &mut ScalesChunk<'_>,
    d: Dither,
    direct: bool,
) {
    for x in &mut s.u_max[..nb] {
        *x = ctx.u_clamp.apply(*x);
    }
    vsc.encode(&ctx.kernels, &mut s.u_max[..nb], Some(d), direct);
    for x in &mut s.u_max[..nb] {
        *x = inv(*x);
    }
}

/// Pass 2 of the group of `n` elements whose pass 1 left its values and
/// block maxima in `old`, writing its codes to `m_codes` / `v_codes`.
fn pass2_of<'a>(
    old: &'a Scratch,
    n: usize,
    bs: usize,
    m_codes: &'a mut [u8],
    v_codes: &'a mut [u8],
) -> Pass2<'a> {
    let nb = n.div_ceil(bs);
    Pass2 {
        sm: &old.sm[..n],
        su: &old.su[..n],
        m_inv: &old.m_absmax[..nb],
        v_inv: VScale::Block(&old.u_max[..nb]),
        m_codes,
        v_codes,
        ahead: [std::ptr::null(); 2],
    }
}

/// The interleaved step of consecutive groups with block scales (AVX2,
/// `Kernels::interleaves`): group `j`'s pass 1 runs inside group `j - 1`'s
/// pass 2, one scratch set each. Every group's operations are those of
/// the plain step, so the bits are too.
fn run_interleaved(ctx: &StepCtx<'_>, jobs: Vec<Job<'_>>, key_numel: u64, direct: bool) {
    let bs = ctx.block_size;
    SCRATCH.with(|cell| {
        let mut guard = cell.borrow_mut();
        for half in guard.iter_mut() {
            half.ensure(GROUP_BLOCKS * bs);
        }
        let (a, b) = guard.split_at_mut(1);
        let mut halves = [&mut a[0], &mut b[0]];
        // The previous group's element count and codes, waiting for pass 2.
        let mut prev: Option<(usize, &mut [u8], &mut [u8])> = None;
        let mut last_half = 0;
        for (j, job) in jobs.into_iter().enumerate() {
            last_half = j % 2;
            let ((((((w, g), mc), vc), mut msc), vsc), (_, &first_block)) = job;
            let mut vsc = vsc.expect("interleaved step: block scales only");
            let [h0, h1] = &mut halves;
            let (cur, old) = if j % 2 == 0 {
                (&mut **h0, &mut **h1)
            } else {
                (&mut **h1, &mut **h0)
            };
            let n = w.len();
            let nb = n.div_ceil(bs);
            msc.decode(&ctx.kernels, &mut cur.m_scale[..nb], direct);
            vsc.decode(&ctx.kernels, &mut cur.v_scale[..nb], direct);
            let p1 = Pass1 {
                w,
                g,
                m_codes: mc,
                v_codes: vc,
                m_scale: &cur.m_scale[..nb],
                v_scale: VScale::Block(&cur.v_scale[..nb]),
                sm: &mut cur.sm[..n],
                su: &mut cur.su[..n],
                m_absmax: &mut cur.m_absmax[..nb],
                u_max: &mut cur.u_max[..nb],
            };
            match prev.take() {
                Some((pn, pmc, pvc)) => {
                    let p2 = pass2_of(old, pn, bs, pmc, pvc);
                    ctx.kernels.pass2_then_1(&ctx.k, ctx.codecs, bs, p2, p1);
                }
                None => ctx.kernels.pass1(&ctx.k, ctx.codecs, bs, p1),
            }
            encode_m_scales(ctx, cur, nb, &mut msc, direct);
            let d = Dither::new(ctx.t, key_numel, first_block);
            encode_v_scales(ctx, cur, nb, &mut vsc, d, direct);
            prev = Some((n, mc, vc));
        }
        if let Some((pn, pmc, pvc)) = prev {
            let p2 = pass2_of(&*halves[last_half], pn, bs, pmc, pvc);
            ctx.kernels.pass2(ctx.codecs, bs, p2);
        }
    });
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
    let plan = Groups::of(&st.shape, st.rows, bs);
    let blocks = plan.blocks(bs);
    let eight = matches!(ctx.codecs.m, MCodec::Eight(_));
    let m_bytes: Vec<usize> = plan
        .elems
        .iter()
        .map(|&e| if eight { e } else { e.div_ceil(2) })
        .collect();
    let v_bytes: Vec<usize> = plan.elems.iter().map(|e| e.div_ceil(2)).collect();
    let starts: Vec<usize> = plan
        .elems
        .iter()
        .scan(0, |acc, &e| {
            let s = *acc;
            *acc += e;
            Some(s)
        })
        .collect();
    let rank1 = match &st.v_scales {
        VScales::Rank1 { rows, cols } => Some(rank1_stats(ctx, st, rows, cols, w, g)),
        VScales::Block(_) => None,
    };
    let (old_rows, old_cols) = match &st.v_scales {
        VScales::Rank1 { rows, cols } => (rows.clone(), cols.clone()),
        VScales::Block(_) => (Vec::new(), Vec::new()),
    };
    let rows_layout = st.rows;
    let m_chunks = st.m_scales.group_chunks(&blocks, group_width(st.rows));
    let v_chunks: Vec<Option<ScalesChunk<'_>>> = match &mut st.v_scales {
        VScales::Block(s) => s
            .group_chunks(&blocks, group_width(rows_layout))
            .into_iter()
            .map(Some)
            .collect(),
        VScales::Rank1 { .. } => blocks.iter().map(|_| None).collect(),
    };
    let g_chunks = plan.elems.iter().scan(g, |rest, &e| {
        let (head, tail) = rest.split_at(e);
        *rest = tail;
        Some(head)
    });
    let jobs: Vec<Job<'_>> = split_lens(w, &plan.elems)
        .zip(g_chunks)
        .zip(split_lens(&mut st.m_codes, &m_bytes))
        .zip(split_lens(&mut st.v_codes, &v_bytes))
        .zip(m_chunks)
        .zip(v_chunks)
        .zip(starts.iter().zip(&plan.first_block))
        .collect();
    let key_numel = plan.key_numel;
    // The row layout's groups are a row's few blocks: no 256-entry tables.
    let direct = rows_layout.is_some();
    let new_r1 = rank1.as_ref();
    if rank1.is_none() && ctx.kernels.interleaves() {
        let mut runs: Vec<Vec<Job<'_>>> = Vec::with_capacity(jobs.len().div_ceil(RUN_GROUPS));
        for job in jobs {
            match runs.last_mut() {
                Some(run) if run.len() < RUN_GROUPS => run.push(job),
                _ => runs.push(vec![job]),
            }
        }
        runs.into_par_iter()
            .for_each(|run| run_interleaved(ctx, run, key_numel, direct));
        return;
    }
    jobs.into_par_iter().for_each(
        |((((((w, g), mc), vc), mut msc), mut vsc), (&base, &first_block))| {
            SCRATCH.with(|cell| {
                let mut guard = cell.borrow_mut();
                let s = &mut guard[0];
                s.ensure(ge);
                let n = w.len();
                let nb = n.div_ceil(bs);
                let ahead = [w.as_ptr().wrapping_add(n), g.as_ptr().wrapping_add(n)];
                msc.decode(&ctx.kernels, &mut s.m_scale[..nb], direct);
                let v_scale = match &vsc {
                    Some(chunk) => {
                        chunk.decode(&ctx.kernels, &mut s.v_scale[..nb], direct);
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
                encode_m_scales(ctx, s, nb, &mut msc, direct);
                let v_inv = match (&mut vsc, new_r1) {
                    (Some(chunk), _) => {
                        let d = Dither::new(ctx.t, key_numel, first_block);
                        encode_v_scales(ctx, s, nb, chunk, d, direct);
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
                        ahead,
                    },
                );
            })
        },
    );
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
