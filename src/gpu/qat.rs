//! The QAT step of one tensor on a device (kernels/qat.cu): the kernel's
//! argument block (the C layout of `QatArgs`), the host-side scalar state,
//! and the step's sequence, written against [`QatExec`] so that the host
//! test (`qat_host.rs`) runs the same sequence on a g++ build of the same
//! kernel code.
//!
//! The sequence is the CPU's (`QatOptimizer::step_with`): a dry pass that
//! writes nothing but per-block (min, max, non-finite) triples, reduced and
//! calibrated here on the host by the CPU's own functions; on failure an
//! error (diagnosed from host copies, with the CPU's message) and nothing
//! changed; else the commit pass.

use super::memory::DeviceElem;
use crate::error::{QuantError, Result};
use crate::fp8::Fp8Format;
use crate::qat::format::Coef;
use crate::qat::optimizer::{calibrate_for, diagnose, next_step};
use crate::qat::rng::stream_key;
use crate::qat::{Master, QatConfig, QuantParams, QuantTarget, RoundingMode};

/// Threads per block of the QAT kernels.
pub(crate) const THREADS: usize = 256;

/// Most blocks of the dry pass (each writes one triple the host reduces).
pub(crate) const MAX_DRY_BLOCKS: usize = 1024;

/// `QatGrid` of the kernel (CPU twin: `fake::IntGrid`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub(crate) struct QatGrid {
    scale: f64,
    zp: f64,
    lo: f64,
    hi: f64,
}

/// `QatArgs` of the kernel (the same fields in the same order; addresses
/// as u64). Passed by value to every QAT kernel.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct QatArgs {
    pub n: u64,
    pub w: u64,
    pub g: u64,
    pub m: u64,
    pub v: u64,
    pub q: u64,
    pub partials: u64,
    pub key: u64,
    coef64: [f64; 9],
    coef32: [f32; 9],
    grid: QatGrid,
    fp8_max: f64,
    target: i32,
    stochastic: i32,
}

/// A master precision the QAT kernels take (float32 or float64).
pub trait DevMaster: Master + DeviceElem {
    /// `"f32"` or `"f64"`: the suffix of the kernels' names.
    const SUFFIX: &'static str;
}

impl DevMaster for f32 {
    const SUFFIX: &'static str = "f32";
}

impl DevMaster for f64 {
    const SUFFIX: &'static str = "f64";
}

/// The AdamW constants into the argument block's array of the master's
/// precision (through f64, exact both ways for f32).
fn put_coef<T: Master>(c: &Coef<T>, a: &mut QatArgs) {
    let v: [f64; 9] = [
        c.lr, c.lrwd, c.b1, c.b2, c.omb1, c.omb2, c.bc1, c.bc2, c.eps,
    ]
    .map(Into::into);
    if T::BYTES == 4 {
        a.coef32 = v.map(|x| x as f32);
    } else {
        a.coef64 = v;
    }
}

impl QatArgs {
    /// The view's target and rounding: `params` for an integer target
    /// (None for FP8), `key` the stream key of stochastic rounding.
    /// An integer target without parameters is an error (calibration always
    /// gives them, so this guards the sequence, not the input).
    pub(crate) fn set_view(
        &mut self,
        config: &QatConfig,
        params: Option<&QuantParams>,
        key: u64,
    ) -> Result<()> {
        match (config.target, params) {
            (QuantTarget::Int(_), Some(p)) => {
                self.target = 0;
                self.grid = QatGrid {
                    scale: p.scale,
                    zp: p.zero_point as f64,
                    lo: p.qmin as f64,
                    hi: p.qmax as f64,
                };
            }
            (QuantTarget::Fp8(f), _) => {
                self.target = match f {
                    Fp8Format::E4M3 => 1,
                    Fp8Format::E5M2 => 2,
                };
                self.fp8_max = f.max_value() as f64;
            }
            (QuantTarget::Int(_), None) => {
                return Err(QuantError::InvalidState(
                    "an integer target's view needs quantization parameters".into(),
                ))
            }
        }
        self.stochastic = (config.rounding == RoundingMode::Stochastic) as i32;
        self.key = key;
        Ok(())
    }
}

/// Where the kernels run: the device (`qat_launch.rs`) or, in the host
/// test, the g++ build of the same code. Addresses are the executor's
/// memory (device addresses, or host pointers in the host test).
///
/// # Safety
/// The addresses in `a` (`w`, `g`, `m`, `v`, `q`: `a.n` elements of `T`;
/// `partials`: `3 * MAX_DRY_BLOCKS` f64) and `addr` (`n` elements of `T`)
/// must be live memory of the executor, valid until the queued work has
/// run, the written ones overlapping nothing else.
pub(crate) trait QatExec {
    /// `qat_dry_*` over `a.n` elements; the (min, max, non-finite) of the
    /// updated weights, reduced over the blocks' triples.
    ///
    /// # Safety
    /// See the trait.
    unsafe fn dry<T: DevMaster>(&self, a: &QatArgs) -> Result<(f64, f64, bool)>;
    /// `qat_commit_*` over `a.n` elements (queued).
    ///
    /// # Safety
    /// See the trait.
    unsafe fn commit<T: DevMaster>(&self, a: &QatArgs) -> Result<()>;
    /// A host copy of `n` elements at `addr` (the error path only).
    ///
    /// # Safety
    /// See the trait.
    unsafe fn read<T: DevMaster>(&self, addr: u64, n: usize) -> Result<Vec<T>>;
}

/// Fold the dry pass's block triples as the CPU folds its lanes.
pub(crate) fn reduce_partials(p: &[f64]) -> (f64, f64, bool) {
    p.chunks_exact(3)
        .fold((f64::INFINITY, f64::NEG_INFINITY, false), |a, t| {
            (a.0.min(t[0]), a.1.max(t[1]), a.2 || t[2] != 0.0)
        })
}

/// Blocks of the dry pass over `n` elements.
pub(crate) fn dry_blocks(n: usize) -> usize {
    n.div_ceil(THREADS).clamp(1, MAX_DRY_BLOCKS)
}

/// The optimizer's state besides its device buffers: the CPU
/// `QatOptimizer`'s scalar fields.
#[derive(Clone, Debug, PartialEq)]
pub struct QatScalars {
    /// The configuration.
    pub config: QatConfig,
    /// The stream seed of stochastic rounding.
    pub seed: u64,
    /// Steps taken.
    pub step: u64,
    /// The integer target's quantization parameters of the current view.
    pub params: Option<QuantParams>,
}

/// Device addresses of one optimizer's buffers (moments, view, scratch).
#[derive(Clone, Copy, Debug)]
pub(crate) struct QatBufs {
    pub n: usize,
    pub m: u64,
    pub v: u64,
    pub q: u64,
    /// `3 * MAX_DRY_BLOCKS` f64.
    pub partials: u64,
}

impl QatBufs {
    fn args(&self, w: u64, g: u64) -> QatArgs {
        QatArgs {
            n: self.n as u64,
            w,
            g,
            m: self.m,
            v: self.v,
            q: self.q,
            partials: self.partials,
            ..Default::default()
        }
    }
}

/// One step (CPU twin: `QatOptimizer::step_seeded`): master at `w` updated
/// in place with the gradient at `g`; `seed` overrides the stream seed for
/// this step. On error nothing has changed (`s` included).
///
/// # Safety
/// `bufs` are the optimizer's buffers of `bufs.n` elements of `T` (and its
/// dry-pass scratch), `w` and `g` `bufs.n` elements of `T`, all memory of
/// `exec` valid until the queued work has run; `w` overlaps none of the others.
pub(crate) unsafe fn step<T: DevMaster, E: QatExec>(
    exec: &E,
    s: &mut QatScalars,
    bufs: &QatBufs,
    w: u64,
    g: u64,
    seed: Option<u64>,
) -> Result<()> {
    let (t, coef) = next_step::<T>(&s.config, s.step)?;
    let mut a = bufs.args(w, g);
    put_coef(&coef, &mut a);
    // SAFETY: `a` holds the function's buffers (its contract).
    let (min, max, bad) = unsafe { exec.dry::<T>(&a)? };
    if bad {
        // SAFETY: `w` and `g` hold `bufs.n` elements of T.
        let (master, grad) = unsafe { (exec.read::<T>(w, bufs.n)?, exec.read::<T>(g, bufs.n)?) };
        return Err(diagnose(&master, &grad));
    }
    let (params, _) = calibrate_for(&s.config, min, max)?;
    // Nothing can fail from here on but the device itself.
    let key = stream_key(seed.unwrap_or(s.seed), t);
    a.set_view(&s.config, params.as_ref(), key)?;
    // SAFETY: as for the dry pass.
    unsafe { exec.commit::<T>(&a)? };
    s.params = params;
    s.step = t;
    Ok(())
}
