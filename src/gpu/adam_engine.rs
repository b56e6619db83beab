//! `AdamW4bit` / `Adam4bit` with the state on a device (docs/gpu.md): the
//! same keys, validation, gradient accumulation and checkpoints as the CPU
//! engine (`optim::Adam4bitCore`, which this wraps for the configuration,
//! the step count and the checkpoint format), the codes and scales in
//! device memory, and each step run by the fused kernel (`adam.rs`).
//!
//! Transactional like the CPU: every check (shapes, finiteness, read on the
//! device) runs before anything changes; a failed check leaves weights,
//! state, step count and accumulators as they were.

use std::collections::{BTreeMap, HashMap};
use std::ffi::c_void;
use std::sync::Arc;

use cudarc::driver::result;

use super::adam::{self, AdamArgs, Exec, StateAddrs, StepPlan};
use super::context::{gpu_err, Gpu};
use super::memory::{to_host, DeviceBuffer};
use super::nvrtc::OPTIM;
use super::ops::{grid_1d, launch};
use crate::error::{QuantError, Result};
use crate::optim::{
    checkpoint, codecs_for, Adam4bitCore, OptimizerState, ParamState, Scales, StateMemoryStats,
    VScales,
};

/// Block scales of one moment on the device.
enum DevScales {
    F32(DeviceBuffer),
    Double {
        codes: DeviceBuffer,
        groups: DeviceBuffer,
    },
}

/// v's scales on the device (`rows_new` / `cols_new`: the step's scratch).
enum DevV {
    Block(DevScales),
    Rank1 {
        rows: DeviceBuffer,
        cols: DeviceBuffer,
        rows_new: DeviceBuffer,
        cols_new: DeviceBuffer,
    },
}

/// One parameter's state on the device, laid out as `optim::ParamState`.
struct DevParam {
    shape: Vec<usize>,
    m_codes: DeviceBuffer,
    v_codes: DeviceBuffer,
    m: DevScales,
    v: DevV,
}

fn up_scales(gpu: &Arc<Gpu>, s: &Scales) -> Result<DevScales> {
    Ok(match s {
        Scales::F32(v) => DevScales::F32(DeviceBuffer::from_host(gpu, v)?),
        Scales::Double { codes, groups } => DevScales::Double {
            codes: DeviceBuffer::from_host(gpu, codes)?,
            groups: DeviceBuffer::from_host(gpu, groups)?,
        },
    })
}

fn down_scales(gpu: &Gpu, s: &DevScales) -> Result<Scales> {
    Ok(match s {
        DevScales::F32(b) => Scales::F32(to_host(gpu, b.ptr(), b.bytes() / 4)?),
        DevScales::Double { codes, groups } => Scales::Double {
            codes: to_host(gpu, codes.ptr(), codes.bytes())?,
            groups: to_host(gpu, groups.ptr(), groups.bytes() / 4)?,
        },
    })
}

fn scales_bytes(s: &DevScales) -> usize {
    match s {
        DevScales::F32(b) => b.bytes(),
        DevScales::Double { codes, groups } => codes.bytes() + groups.bytes(),
    }
}

impl DevParam {
    fn upload(gpu: &Arc<Gpu>, st: &ParamState) -> Result<DevParam> {
        let v = match &st.v_scales {
            VScales::Block(s) => DevV::Block(up_scales(gpu, s)?),
            VScales::Rank1 { rows, cols } => DevV::Rank1 {
                rows: DeviceBuffer::from_host(gpu, rows)?,
                cols: DeviceBuffer::from_host(gpu, cols)?,
                rows_new: DeviceBuffer::alloc(gpu, 4 * rows.len())?,
                cols_new: DeviceBuffer::alloc(gpu, 4 * cols.len())?,
            },
        };
        Ok(DevParam {
            shape: st.shape.clone(),
            m_codes: DeviceBuffer::from_host(gpu, &st.m_codes)?,
            v_codes: DeviceBuffer::from_host(gpu, &st.v_codes)?,
            m: up_scales(gpu, &st.m_scales)?,
            v,
        })
    }

    fn download(&self, gpu: &Gpu) -> Result<ParamState> {
        let v_scales = match &self.v {
            DevV::Block(s) => VScales::Block(down_scales(gpu, s)?),
            DevV::Rank1 { rows, cols, .. } => VScales::Rank1 {
                rows: to_host(gpu, rows.ptr(), rows.bytes() / 4)?,
                cols: to_host(gpu, cols.ptr(), cols.bytes() / 4)?,
            },
        };
        Ok(ParamState {
            shape: self.shape.clone(),
            m_codes: to_host(gpu, self.m_codes.ptr(), self.m_codes.bytes())?,
            v_codes: to_host(gpu, self.v_codes.ptr(), self.v_codes.bytes())?,
            m_scales: down_scales(gpu, &self.m)?,
            v_scales,
        })
    }

    /// Bytes of the state proper (the rank-1 scratch is not state).
    fn bytes(&self) -> usize {
        let v = match &self.v {
            DevV::Block(s) => scales_bytes(s),
            DevV::Rank1 { rows, cols, .. } => rows.bytes() + cols.bytes(),
        };
        self.m_codes.bytes() + self.v_codes.bytes() + scales_bytes(&self.m) + v
    }

    fn numel(&self) -> usize {
        self.shape.iter().product()
    }

    fn addrs(&self) -> StateAddrs {
        let mut s = StateAddrs {
            m_codes: self.m_codes.ptr(),
            v_codes: self.v_codes.ptr(),
            ..Default::default()
        };
        match &self.m {
            DevScales::F32(b) => s.m_scales = b.ptr(),
            DevScales::Double { codes, groups } => {
                s.m_scale_codes = codes.ptr();
                s.m_groups = groups.ptr();
            }
        }
        match &self.v {
            DevV::Block(DevScales::F32(b)) => s.v_scales = b.ptr(),
            DevV::Block(DevScales::Double { codes, groups }) => {
                s.v_scale_codes = codes.ptr();
                s.v_groups = groups.ptr();
            }
            DevV::Rank1 {
                rows,
                cols,
                rows_new,
                cols_new,
            } => {
                s.rows = rows.ptr();
                s.cols = cols.ptr();
                s.rows_new = rows_new.ptr();
                s.cols_new = cols_new.ptr();
            }
        }
        s
    }

    fn rank1(&self) -> bool {
        matches!(self.v, DevV::Rank1 { .. })
    }
}

/// The kernels on `gpu`, queued on the legacy default stream.
struct DeviceExec<'a>(&'a Arc<Gpu>);

impl Exec for DeviceExec<'_> {
    fn zero(&self, addr: u64, bytes: usize) -> Result<()> {
        self.0.bind()?;
        // SAFETY: `addr` holds `bytes` bytes of device memory we own.
        unsafe { result::memset_d8_sync(addr, 0, bytes) }
            .map_err(|e| gpu_err("zeroing device memory", e))
    }
    fn copy(&self, dst: u64, src: u64, bytes: usize) -> Result<()> {
        self.0.bind()?;
        // SAFETY: two distinct device buffers of at least `bytes` bytes.
        unsafe { result::memcpy_dtod_sync(dst, src, bytes) }
            .map_err(|e| gpu_err("copying on the device", e))
    }
    fn rank1_stats(&self, a: &AdamArgs) -> Result<()> {
        let f = self.0.function(&OPTIM, "adam4bit_rank1_stats")?;
        let mut a = *a;
        let n = a.numel as usize;
        launch(
            self.0,
            f,
            (grid_1d(n), 1),
            256,
            &mut [&mut a as *mut _ as *mut c_void],
        )
    }
    fn rank1_clamp(&self, x: u64, n: usize, lo: f32, hi: f32) -> Result<()> {
        let f = self.0.function(&OPTIM, "adam4bit_rank1_clamp")?;
        let (mut x, mut nn, mut lo, mut hi) = (x, n as u64, lo, hi);
        launch(
            self.0,
            f,
            (n.div_ceil(256), 1),
            256,
            &mut [
                &mut x as *mut _ as *mut c_void,
                &mut nn as *mut _ as *mut c_void,
                &mut lo as *mut _ as *mut c_void,
                &mut hi as *mut _ as *mut c_void,
            ],
        )
    }
    fn group_step(&self, a: &AdamArgs, groups: usize) -> Result<()> {
        let f = self.0.function(&OPTIM, "adam4bit_step")?;
        let mut a = *a;
        launch(
            self.0,
            f,
            (groups, 1),
            adam::GROUP_BLOCKS as u32,
            &mut [&mut a as *mut _ as *mut c_void],
        )
    }
}

/// The device-side elementwise helpers of the optimizer kernels.
fn all_finite(gpu: &Arc<Gpu>, x: u64, n: usize) -> Result<bool> {
    let flag = DeviceBuffer::zeros(gpu, 4)?;
    let f = gpu.function(&OPTIM, "all_finite_f32")?;
    let (mut xp, mut nn, mut fp) = (x, n as u64, flag.ptr());
    launch(
        gpu,
        f,
        (grid_1d(n), 1),
        256,
        &mut [
            &mut xp as *mut _ as *mut c_void,
            &mut nn as *mut _ as *mut c_void,
            &mut fp as *mut _ as *mut c_void,
        ],
    )?;
    Ok(to_host::<u32>(gpu, flag.ptr(), 1)?[0] == 0)
}

fn check_finite(gpu: &Arc<Gpu>, what: &str, x: u64, n: usize) -> Result<()> {
    if !all_finite(gpu, x, n)? {
        return Err(QuantError::arg(format!(
            "{what}: expected finite values, got a NaN or infinity"
        )));
    }
    Ok(())
}

/// `out = a + b` (`accum_add_f32` in place when `out == a`) or `out = s / d`.
fn elementwise(
    gpu: &Arc<Gpu>,
    kernel: &'static str,
    dst: u64,
    src: u64,
    n: usize,
    d: f32,
) -> Result<()> {
    let f = gpu.function(&OPTIM, kernel)?;
    let (mut a, mut b, mut nn, mut dd) = (dst, src, n as u64, d);
    let mut params = vec![
        &mut a as *mut _ as *mut c_void,
        &mut b as *mut _ as *mut c_void,
    ];
    params.push(&mut nn as *mut _ as *mut c_void);
    if kernel == "accum_mean_f32" {
        // accum_mean_f32(const float* s, float* out, u64 n, float d)
        params.swap(0, 1);
        params.push(&mut dd as *mut _ as *mut c_void);
    }
    launch(gpu, f, (grid_1d(n), 1), 256, &mut params)
}

/// A gradient summed on the device by `accumulate_grad`.
struct Accumulated {
    shape: Vec<usize>,
    sum: DeviceBuffer,
}

/// A parameter of a call: its key's name (None: keyed by address), shape,
/// and device addresses of its values and gradient.
#[derive(Clone, Debug)]
pub(crate) struct DevParamRef<'a> {
    pub name: Option<&'a str>,
    pub shape: &'a [usize],
    pub w: u64,
    pub g: u64,
}

/// The optimizer with its state on one device.
pub(crate) struct DeviceAdam {
    pub gpu: Arc<Gpu>,
    /// Configuration, step count and kind; its own state stays empty (the
    /// state is `params`).
    core: Adam4bitCore,
    tables: DeviceBuffer,
    params: BTreeMap<String, DevParam>,
    accum: BTreeMap<String, Accumulated>,
    /// Unnamed parameters: (device address, length) -> registration index.
    bound: HashMap<(u64, usize), usize>,
}

impl DeviceAdam {
    /// The CPU optimizer `core` (configuration and state) moved to `gpu`.
    pub(crate) fn from_core(gpu: &Arc<Gpu>, core: &Adam4bitCore) -> Result<DeviceAdam> {
        let tables = DeviceBuffer::from_host(gpu, &adam::tables(&codecs_for(core.config())))?;
        let mut params = BTreeMap::new();
        for (k, st) in &core.state().params {
            params.insert(k.clone(), DevParam::upload(gpu, st)?);
        }
        let mut empty = core.clone();
        empty.restore(
            *core.config(),
            OptimizerState {
                step: core.state().step,
                params: BTreeMap::new(),
            },
        );
        Ok(DeviceAdam {
            gpu: gpu.clone(),
            core: empty,
            tables,
            params,
            accum: BTreeMap::new(),
            bound: HashMap::new(),
        })
    }

    /// A CPU optimizer with this configuration and a host copy of the state.
    pub(crate) fn to_core(&self) -> Result<Adam4bitCore> {
        let mut params = BTreeMap::new();
        for (k, p) in &self.params {
            params.insert(k.clone(), p.download(&self.gpu)?);
        }
        let mut core = self.core.clone();
        core.restore(
            *self.core.config(),
            OptimizerState {
                step: self.core.state().step,
                params,
            },
        );
        Ok(core)
    }

    /// Checkpoint bytes, exactly those of the CPU optimizer with this state.
    pub(crate) fn to_bytes(&self) -> Result<Vec<u8>> {
        checkpoint::to_bytes(&self.to_core()?)
    }

    /// Replace configuration and state from checkpoint bytes (validated
    /// first, on the host; unchanged on error).
    pub(crate) fn load_bytes(&mut self, bytes: &[u8]) -> Result<()> {
        let mut core = self.core.clone();
        checkpoint::from_bytes(&mut core, bytes)?;
        *self = DeviceAdam::from_core(&self.gpu, &core)?;
        Ok(())
    }

    fn key_of(&self, name: Option<&str>, addr: u64, len: usize) -> String {
        match name {
            Some(n) => format!("n:{n}"),
            None => match self.bound.get(&(addr, len)) {
                Some(i) => format!("p:{i}"),
                None => format!("p:{}", self.bound.len()),
            },
        }
    }

    fn bind(&mut self, name: Option<&str>, addr: u64, len: usize) {
        if name.is_none() && !self.bound.contains_key(&(addr, len)) {
            let i = self.bound.len();
            self.bound.insert((addr, len), i);
        }
    }

    /// CPU twin: `Adam4bitCore::check` (shape against the state, finite
    /// gradient, finite weight when L2 decay brings it into the moments).
    fn check(&self, key: &str, p: &DevParamRef<'_>) -> Result<usize> {
        let n: usize = p.shape.iter().product();
        if n == 0 {
            return Err(QuantError::arg(format!(
                "param: expected a non-empty array, got shape {:?}",
                p.shape
            )));
        }
        if let Some(st) = self.params.get(key) {
            if st.shape != p.shape {
                return Err(QuantError::dims(
                    format!("param shape (state {key:?})"),
                    format!("{:?}", st.shape),
                    format!("{:?}", p.shape),
                ));
            }
        }
        check_finite(&self.gpu, "grad", p.g, n)?;
        let o = &self.core.config().optimizer;
        if !self.core.decoupled() && o.weight_decay > 0.0 {
            check_finite(&self.gpu, "param", p.w, n)?;
        }
        Ok(n)
    }

    /// One fused step of one parameter with the gradient at `g`.
    fn apply(&mut self, key: String, shape: &[usize], w: u64, g: u64) -> Result<()> {
        let q = self.core.config().quantization;
        let fresh = match self.params.remove(&key) {
            Some(p) => p,
            None => DevParam::upload(&self.gpu, &ParamState::new(shape, &q))?,
        };
        let t = self.core.state().step.saturating_add(1);
        let plan = StepPlan::new(
            self.core.config(),
            self.core.decoupled(),
            t,
            self.tables.ptr(),
        );
        let a = plan.args(shape, fresh.rank1(), &fresh.addrs(), w, g);
        let r = adam::step(&DeviceExec(&self.gpu), &a, shape).and_then(|_| self.gpu.synchronize());
        // A failure inside the step (a driver error) may have changed the
        // state partly: the parameter's state is dropped then, not kept half new.
        if r.is_ok() {
            self.params.insert(key, fresh);
        }
        r
    }

    /// `update(param, grad)`: validated first, then one step.
    pub(crate) fn update(&mut self, p: DevParamRef<'_>) -> Result<()> {
        let n: usize = p.shape.iter().product();
        let key = self.key_of(p.name, p.w, n);
        self.check(&key, &p)?;
        self.bind(p.name, p.w, n);
        self.apply(key, p.shape, p.w, p.g)
    }

    /// `accumulate_grad(param, grad)`: the gradient added to the key's sum
    /// on the device; returns the key.
    pub(crate) fn accumulate(&mut self, p: DevParamRef<'_>) -> Result<String> {
        let n: usize = p.shape.iter().product();
        let key = self.key_of(p.name, p.w, n);
        self.check(&key, &p)?;
        if let Some(a) = self.accum.get(&key) {
            if a.shape != p.shape {
                return Err(QuantError::dims(
                    format!("param shape (accumulated {key:?})"),
                    format!("{:?}", a.shape),
                    format!("{:?}", p.shape),
                ));
            }
        }
        match self.accum.get(&key) {
            Some(a) => {
                elementwise(&self.gpu, "accum_add_f32", a.sum.ptr(), p.g, n, 0.0)?;
                self.gpu.synchronize()?;
            }
            None => {
                let sum = DeviceBuffer::alloc(&self.gpu, 4 * n)?;
                DeviceExec(&self.gpu).copy(sum.ptr(), p.g, 4 * n)?;
                self.accum.insert(
                    key.clone(),
                    Accumulated {
                        shape: p.shape.to_vec(),
                        sum,
                    },
                );
            }
        }
        self.bind(p.name, p.w, n);
        Ok(key)
    }

    /// Keys with accumulated gradients, in order.
    pub(crate) fn accumulated_keys(&self) -> Vec<String> {
        self.accum.keys().cloned().collect()
    }

    /// CPU twin: `Adam4bitCore::apply_accumulated_grads`; `params` are
    /// (key, shape, weight address), one per accumulated key.
    pub(crate) fn apply_accumulated(
        &mut self,
        steps: usize,
        params: &[(String, Vec<usize>, u64)],
    ) -> Result<()> {
        if steps == 0 {
            return Err(QuantError::arg(
                "accumulation_steps: expected a value >= 1, got 0",
            ));
        }
        if params.len() != self.accum.len() {
            return Err(QuantError::InvalidState(format!(
                "apply_accumulated_grads: {} parameters accumulated, {} given",
                self.accum.len(),
                params.len()
            )));
        }
        let d = steps as f32;
        let mut means = Vec::with_capacity(params.len());
        for (key, shape, _) in params {
            let a = self.accum.get(key).ok_or_else(|| {
                QuantError::InvalidState(format!("no accumulated gradient for {key:?}"))
            })?;
            if &a.shape != shape {
                return Err(QuantError::dims(
                    format!("param {key:?}"),
                    format!("{:?}", a.shape),
                    format!("{shape:?}"),
                ));
            }
            let n: usize = shape.iter().product();
            let mean = DeviceBuffer::alloc(&self.gpu, 4 * n)?;
            elementwise(&self.gpu, "accum_mean_f32", mean.ptr(), a.sum.ptr(), n, d)?;
            check_finite(&self.gpu, "accumulated grad", mean.ptr(), n)?;
            means.push(mean);
        }
        for ((key, shape, w), mean) in params.iter().zip(&means) {
            self.apply(key.clone(), shape, *w, mean.ptr())?;
        }
        self.accum.clear();
        Ok(())
    }

    pub(crate) fn zero_grad(&mut self) {
        self.accum.clear();
    }

    pub(crate) fn step(&mut self) {
        self.core.step();
    }

    pub(crate) fn step_count(&self) -> u64 {
        self.core.state().step
    }

    pub(crate) fn get_lr(&self) -> f32 {
        self.core.get_lr()
    }

    pub(crate) fn set_lr(&mut self, lr: f32) -> Result<()> {
        self.core.set_lr(lr)
    }

    pub(crate) fn decoupled(&self) -> bool {
        self.core.decoupled()
    }

    /// Elements and device bytes of the state.
    pub(crate) fn memory_usage(&self) -> StateMemoryStats {
        let n = self.num_parameters();
        StateMemoryStats {
            momentum_elements: n,
            variance_elements: n,
            third_moment_elements: 0,
            total_bytes: self.params.values().map(DevParam::bytes).sum(),
            num_parameters: n,
        }
    }

    pub(crate) fn num_parameters(&self) -> usize {
        self.params.values().map(DevParam::numel).sum()
    }

    pub(crate) fn reset_state(&mut self) {
        self.core.reset_state();
        self.params.clear();
        self.accum.clear();
        self.bound.clear();
    }
}
