//! The fused 4-bit Adam / AdamW step of one parameter on a device
//! (kernels/optim.cu): the kernel's argument block (the C layout of
//! `AdamArgs`), the code-book tables, and the launch sequence, written
//! against [`Exec`] so that the host test (`host_math.rs`) runs the same
//! sequence on a g++ build of the same kernel code.

use crate::error::Result;
use crate::optim::{step_consts, Adam4bitConfig, Codecs, MCodec, StepConsts};

/// Floats in the code-book table buffer: m values and midpoints (256 each,
/// the 4-bit books use the first 16), v values and midpoints (16 each).
pub(crate) const TABLE_LEN: usize = 544;

/// Blocks per group of the double quantization (one CUDA block each).
pub(crate) const GROUP_BLOCKS: usize = 256;

/// `AdamConsts` of the kernel: `StepConsts` field for field.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct AdamConsts {
    b1: f32,
    b2: f32,
    omb1: f32,
    omb2: f32,
    inv_sqrt_bc2: f32,
    eps: f32,
    step_size: f32,
    lr_wd: f32,
    l2: f32,
}

impl From<&StepConsts> for AdamConsts {
    fn from(k: &StepConsts) -> Self {
        AdamConsts {
            b1: k.b1,
            b2: k.b2,
            omb1: k.omb1,
            omb2: k.omb2,
            inv_sqrt_bc2: k.inv_sqrt_bc2,
            eps: k.eps,
            step_size: k.step_size,
            lr_wd: k.lr_wd,
            l2: k.l2,
        }
    }
}

/// `AdamArgs` of the kernel (the same fields in the same order; addresses
/// as u64, the state's twelve as the [`StateAddrs`] block). Passed by value
/// to every optimizer kernel.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct AdamArgs {
    pub numel: u64,
    pub t: u64,
    pub cols: u64,
    pub w: u64,
    pub g: u64,
    pub s: StateAddrs,
    pub tables: u64,
    pub k: AdamConsts,
    pub m_lo: f32,
    pub m_hi: f32,
    pub u_lo: f32,
    pub u_hi: f32,
    pub block_size: i32,
    pub m_bits: i32,
    pub sqrt_domain: i32,
    pub double_quant: i32,
    pub rank1: i32,
}

/// The code books of `c` in the kernel's table layout.
pub(crate) fn tables(c: &Codecs) -> Vec<f32> {
    let mut t = vec![0f32; TABLE_LEN];
    match &c.m {
        MCodec::Four(cb) => {
            t[..16].copy_from_slice(&cb.values);
            t[256..272].copy_from_slice(&cb.mids);
        }
        MCodec::Eight(cb) => {
            t[..256].copy_from_slice(&cb.values);
            t[256..512].copy_from_slice(&cb.mids);
        }
    }
    t[512..528].copy_from_slice(&c.v.values);
    t[528..544].copy_from_slice(&c.v.mids);
    t
}

/// Where one parameter's state lives (addresses; 0 for the buffers its
/// layout does not use), in the kernel's `AdamArgs` order.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct StateAddrs {
    pub m_codes: u64,
    pub v_codes: u64,
    pub m_scales: u64,
    pub m_scale_codes: u64,
    pub m_groups: u64,
    pub v_scales: u64,
    pub v_scale_codes: u64,
    pub v_groups: u64,
    /// Rank-1 v: the statistics, and scratch of the same sizes.
    pub rows: u64,
    pub cols: u64,
    pub rows_new: u64,
    pub cols_new: u64,
}

/// Everything of the optimizer a step needs besides the parameter.
#[derive(Clone, Copy, Debug)]
pub(crate) struct StepPlan {
    pub k: StepConsts,
    pub t: u64,
    pub tables: u64,
    pub block_size: usize,
    pub m_bits: i32,
    pub sqrt_domain: bool,
    pub double_quant: bool,
    pub m_clamp: (f32, f32),
    pub u_clamp: (f32, f32),
}

impl StepPlan {
    /// The plan of step `t` (1-based) of an optimizer with `config`
    /// (CPU twin: `Adam4bitCore::ctx`).
    pub(crate) fn new(config: &Adam4bitConfig, decoupled: bool, t: u64, tables: u64) -> StepPlan {
        let o = &config.optimizer;
        let q = &config.quantization;
        let sqrt_domain = q.variance_map.sqrt_domain();
        let (lo, hi) = (q.min_scale, q.max_scale);
        StepPlan {
            k: step_consts(o, decoupled, t),
            t,
            tables,
            block_size: q.block_size,
            m_bits: q.method.m_bits() as i32,
            sqrt_domain,
            double_quant: q.double_quantization,
            m_clamp: (lo, hi),
            u_clamp: if sqrt_domain {
                (lo, hi)
            } else {
                (lo * lo, hi * hi)
            },
        }
    }

    /// The kernel arguments for a parameter of `shape` (rank-1 when `rank1`).
    pub(crate) fn args(
        &self,
        shape: &[usize],
        rank1: bool,
        s: &StateAddrs,
        w: u64,
        g: u64,
    ) -> AdamArgs {
        let numel: usize = shape.iter().product();
        AdamArgs {
            numel: numel as u64,
            t: self.t,
            cols: if rank1 { shape[1] as u64 } else { 1 },
            w,
            g,
            s: *s,
            tables: self.tables,
            k: AdamConsts::from(&self.k),
            m_lo: self.m_clamp.0,
            m_hi: self.m_clamp.1,
            u_lo: self.u_clamp.0,
            u_hi: self.u_clamp.1,
            block_size: self.block_size as i32,
            m_bits: self.m_bits,
            sqrt_domain: self.sqrt_domain as i32,
            double_quant: self.double_quant as i32,
            rank1: rank1 as i32,
        }
    }
}

/// Where the kernels run: the device (`adam_launch.rs`) or, in the host
/// test, the g++ build of the same code. Addresses are the executor's
/// memory (device addresses, or host pointers in the host test).
///
/// # Safety
/// Every method's addresses (and those inside `a`) must be live memory of
/// the executor, of the sizes the named kernel accesses for `a.numel`
/// elements, the state layout `a` describes and the given counts, valid
/// until the queued work has run; `dst` and `src` of `copy` do not overlap.
pub(crate) trait Exec {
    /// Zero `bytes` bytes at `addr`.
    ///
    /// # Safety
    /// See the trait.
    unsafe fn zero(&self, addr: u64, bytes: usize) -> Result<()>;
    /// Copy `bytes` bytes from `src` to `dst`.
    ///
    /// # Safety
    /// See the trait.
    unsafe fn copy(&self, dst: u64, src: u64, bytes: usize) -> Result<()>;
    /// `adam4bit_rank1_stats` over every element.
    ///
    /// # Safety
    /// See the trait.
    unsafe fn rank1_stats(&self, a: &AdamArgs) -> Result<()>;
    /// `adam4bit_rank1_clamp` of `n` values at `x`.
    ///
    /// # Safety
    /// See the trait.
    unsafe fn rank1_clamp(&self, x: u64, n: usize, lo: f32, hi: f32) -> Result<()>;
    /// `adam4bit_step` over `groups` groups.
    ///
    /// # Safety
    /// See the trait.
    unsafe fn group_step(&self, a: &AdamArgs, groups: usize) -> Result<()>;
}

/// One step of one parameter (CPU twin: `optim::state::step_param`): for
/// rank-1 v the new row and column statistics first, then every group,
/// then the new statistics replace the old.
///
/// # Safety
/// `a` comes from [`StepPlan::args`] for `shape` with the addresses of a
/// live parameter state of that shape and layout (`DevParam::addrs`, or
/// the host test's buffers), a weight and a gradient of `a.numel` f32 and
/// the code-book tables, all memory of `exec`, the weight not overlapping
/// the others.
pub(crate) unsafe fn step(exec: &dyn Exec, a: &AdamArgs, shape: &[usize]) -> Result<()> {
    let numel = a.numel as usize;
    let groups = numel.div_ceil(GROUP_BLOCKS * a.block_size as usize);
    let s = &a.s;
    // SAFETY: every call below runs under this function's contract; the
    // rank-1 statistics hold shape[0] and shape[1] f32, the scratch the same.
    unsafe {
        if a.rank1 != 0 {
            let (r, c) = (shape[0], shape[1]);
            exec.zero(s.rows_new, 4 * r)?;
            exec.zero(s.cols_new, 4 * c)?;
            exec.rank1_stats(a)?;
            exec.rank1_clamp(s.rows_new, r, a.u_lo, a.u_hi)?;
            exec.rank1_clamp(s.cols_new, c, a.u_lo, a.u_hi)?;
        }
        exec.group_step(a, groups)?;
        if a.rank1 != 0 {
            exec.copy(s.rows, s.rows_new, 4 * shape[0])?;
            exec.copy(s.cols, s.cols_new, 4 * shape[1])?;
        }
    }
    Ok(())
}
