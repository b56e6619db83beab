//! The optimizer kernels' math checked on the host, without a GPU: g++
//! compiles kernels/optim_math.cuh and optim.cu (with `host_test/shim.h` mapping the CUDA
//! qualifiers and intrinsics, and `-ffp-contract=off`, the twin of NVRTC's
//! `--fmad=false`) into a shared library that runs each phase of the group
//! kernel for every thread in turn. The launch sequence (`adam::step`) and
//! the argument block are the ones the device uses. The results must be
//! bit-identical to the CPU optimizer for every method, variance map,
//! scale format, rank-1 setting, AdamW and Adam, over several steps.
//!
//! Skipped (with the reason printed) where no `g++` is installed.

use std::sync::OnceLock;

use super::adam::{self, AdamArgs, Exec, StateAddrs, StepPlan};
use crate::error::Result;
use crate::optim::{
    codecs_for, Adam4bit, Adam4bitConfig, Adam4bitOptimizerConfig, AdamW4bit,
    AdvancedQuantizationConfig, ParamMut, ParamState, QuantizationMethod, Scales,
    StatefulOptimizer, VScales, VarianceMap,
};

type StepFn = unsafe extern "C" fn(*const AdamArgs, u64);
type StatsFn = unsafe extern "C" fn(*const AdamArgs);
type ClampFn = unsafe extern "C" fn(*mut f32, u64, f32, f32);
type Log2Fn = unsafe extern "C" fn(f32) -> f32;

struct Harness {
    _lib: libloading::Library,
    step: StepFn,
    stats: StatsFn,
    clamp: ClampFn,
    log2: Log2Fn,
}

/// The g++ build of the kernels, or why there is none.
fn harness() -> std::result::Result<&'static Harness, String> {
    static H: OnceLock<std::result::Result<Harness, String>> = OnceLock::new();
    H.get_or_init(|| {
        let lib = super::host_build::load("harness.cpp", "optim")?;
        // SAFETY: the symbols below have the declared C signatures
        // (harness.cpp).
        unsafe {
            let step = *lib
                .get::<StepFn>(b"host_adam4bit_step")
                .map_err(|e| e.to_string())?;
            let stats = *lib
                .get::<StatsFn>(b"host_adam4bit_rank1_stats")
                .map_err(|e| e.to_string())?;
            let clamp = *lib
                .get::<ClampFn>(b"host_adam4bit_rank1_clamp")
                .map_err(|e| e.to_string())?;
            let log2 = *lib
                .get::<Log2Fn>(b"host_log2_det")
                .map_err(|e| e.to_string())?;
            Ok(Harness {
                _lib: lib,
                step,
                stats,
                clamp,
                log2,
            })
        }
    })
    .as_ref()
    .map_err(Clone::clone)
}

/// Runs the kernels' code on host memory (addresses are host pointers).
struct HostExec(&'static Harness);

impl Exec for HostExec {
    unsafe fn zero(&self, addr: u64, bytes: usize) -> Result<()> {
        // SAFETY: `addr` points at `bytes` bytes of a live host buffer.
        unsafe { std::ptr::write_bytes(addr as *mut u8, 0, bytes) };
        Ok(())
    }
    unsafe fn copy(&self, dst: u64, src: u64, bytes: usize) -> Result<()> {
        // SAFETY: two distinct live host buffers of at least `bytes` bytes.
        unsafe { std::ptr::copy_nonoverlapping(src as *const u8, dst as *mut u8, bytes) };
        Ok(())
    }
    unsafe fn rank1_stats(&self, a: &AdamArgs) -> Result<()> {
        // SAFETY: every address in `a` is a host buffer of the size the
        // kernel reads.
        unsafe { (self.0.stats)(a) };
        Ok(())
    }
    unsafe fn rank1_clamp(&self, x: u64, n: usize, lo: f32, hi: f32) -> Result<()> {
        // SAFETY: `x` holds `n` floats.
        unsafe { (self.0.clamp)(x as *mut f32, n as u64, lo, hi) };
        Ok(())
    }
    unsafe fn group_step(&self, a: &AdamArgs, groups: usize) -> Result<()> {
        // SAFETY: as for rank1_stats.
        unsafe { (self.0.step)(a, groups as u64) };
        Ok(())
    }
}

fn addr<T>(v: &mut [T]) -> u64 {
    if v.is_empty() {
        0
    } else {
        v.as_mut_ptr() as u64
    }
}

/// One host-kernel step of a copy of `st` (the CPU state before the step).
fn host_step(
    h: &'static Harness,
    cfg: &Adam4bitConfig,
    decoupled: bool,
    t: u64,
    st: &ParamState,
    w: &mut [f32],
    g: &mut [f32],
) -> ParamState {
    let mut st = st.clone();
    let mut tables = adam::tables(&codecs_for(cfg));
    let plan = StepPlan::new(cfg, decoupled, t, addr(&mut tables));
    let mut s = StateAddrs {
        m_codes: addr(&mut st.m_codes),
        v_codes: addr(&mut st.v_codes),
        ..Default::default()
    };
    match &mut st.m_scales {
        Scales::F32(v) => s.m_scales = addr(v),
        Scales::Double { codes, groups } => {
            s.m_scale_codes = addr(codes);
            s.m_groups = addr(groups);
        }
    }
    let (r, c) = match &st.v_scales {
        VScales::Rank1 { rows, cols } => (rows.len(), cols.len()),
        VScales::Block(_) => (0, 0),
    };
    let (mut rows_new, mut cols_new) = (vec![0f32; r], vec![0f32; c]);
    let rank1 = matches!(st.v_scales, VScales::Rank1 { .. });
    match &mut st.v_scales {
        VScales::Block(Scales::F32(v)) => s.v_scales = addr(v),
        VScales::Block(Scales::Double { codes, groups }) => {
            s.v_scale_codes = addr(codes);
            s.v_groups = addr(groups);
        }
        VScales::Rank1 { rows, cols } => {
            s.rows = addr(rows);
            s.cols = addr(cols);
            s.rows_new = addr(&mut rows_new);
            s.cols_new = addr(&mut cols_new);
        }
    }
    let a = plan.args(&st.shape.clone(), rank1, &s, addr(w), addr(g));
    // SAFETY: every address in `a` is a live host buffer above, sized as
    // the CPU state of `st.shape` (the layout the kernels read).
    unsafe { adam::step(&HostExec(h), &a, &st.shape.clone()) }.expect("host step");
    st
}

fn xorshift(seed: u64, n: usize, scale: f32) -> Vec<f32> {
    crate::testutil::xorshift_f32(seed, n, scale)
}

/// Runs `steps` CPU steps; before each, the host kernels take the same
/// step from the same state, and everything must agree bit for bit.
fn compare(q: AdvancedQuantizationConfig, decoupled: bool, shape: &[usize], steps: u64) {
    let Ok(h) = harness() else {
        eprintln!("skipped: {}", harness().err().unwrap_or_default());
        return;
    };
    let o = Adam4bitOptimizerConfig {
        learning_rate: 1e-2,
        beta1: 0.9,
        beta2: 0.99,
        epsilon: 1e-8,
        weight_decay: 0.1,
    };
    let cfg = Adam4bitConfig {
        optimizer: o,
        quantization: q,
    };
    let n: usize = shape.iter().product();
    let mut w = xorshift(7, n, 1.0);
    let mut cpu_w;
    let mut adamw = AdamW4bit::with_quantization_config(o, q);
    let mut adam = Adam4bit::with_quantization_config(o, q);
    for step in 0..steps {
        // Gradients of very different sizes per block, some exact zeros.
        let mut g = xorshift(100 + step, n, 1.0);
        for (i, x) in g.iter_mut().enumerate() {
            let b = (i / 64) % 7;
            *x *= 10f32.powi(b as i32 - 4);
            if i % 37 == 5 {
                *x = 0.0;
            }
        }
        let before = if decoupled {
            adamw.state().clone()
        } else {
            adam.state().clone()
        };
        cpu_w = w.clone();
        let p = ParamMut {
            name: Some("p"),
            shape,
            data: &mut cpu_w,
        };
        if decoupled {
            adamw.update_param(p, &g).unwrap();
            crate::optim::Optimizer::step(&mut adamw);
        } else {
            adam.update_param(p, &g).unwrap();
            crate::optim::Optimizer::step(&mut adam);
        }
        let after = if decoupled {
            adamw.state()
        } else {
            adam.state()
        };
        let st0 = before
            .params
            .get("n:p")
            .cloned()
            .unwrap_or_else(|| ParamState::new(shape, &q));
        let mut host_w = w.clone();
        let st1 = host_step(
            h,
            &cfg,
            decoupled,
            before.step + 1,
            &st0,
            &mut host_w,
            &mut g,
        );
        let want = &after.params["n:p"];
        let what = format!("{q:?} decoupled={decoupled} shape={shape:?} step {step}");
        assert!(
            host_w
                .iter()
                .zip(&cpu_w)
                .all(|(a, b)| a.to_bits() == b.to_bits()),
            "weights differ: {what}"
        );
        if let Some(i) = st1
            .m_codes
            .iter()
            .zip(&want.m_codes)
            .position(|(a, b)| a != b)
        {
            panic!(
                "m codes differ from byte {i} ({} vs {}), m scales equal: {}: {what}",
                st1.m_codes[i],
                want.m_codes[i],
                st1.m_scales == want.m_scales
            );
        }
        assert_eq!(st1.v_codes, want.v_codes, "v codes: {what}");
        assert_eq!(st1.m_scales, want.m_scales, "m scales: {what}");
        assert_eq!(st1.v_scales, want.v_scales, "v scales: {what}");
        w = cpu_w;
    }
}

fn quant(
    method: QuantizationMethod,
    map: VarianceMap,
    block_size: usize,
    double_quantization: bool,
    rank1: bool,
) -> AdvancedQuantizationConfig {
    AdvancedQuantizationConfig {
        method,
        variance_map: map,
        block_size,
        double_quantization,
        rank1_normalization: rank1,
        ..Default::default()
    }
}

#[test]
fn every_method_and_map_matches_the_cpu_bit_for_bit() {
    for method in QuantizationMethod::ALL {
        for map in VarianceMap::ALL {
            for decoupled in [true, false] {
                // Three groups with a short, odd tail.
                compare(quant(method, map, 32, true, false), decoupled, &[16_387], 4);
            }
        }
    }
}

#[test]
fn f32_scales_odd_blocks_and_rank1_match_the_cpu() {
    for method in QuantizationMethod::ALL {
        compare(
            quant(method, VarianceMap::SqrtLog, 64, false, false),
            true,
            &[1001],
            4,
        );
        compare(
            quant(method, VarianceMap::Linear, 2, true, false),
            true,
            &[9, 101],
            3,
        );
        for map in [VarianceMap::SqrtLog, VarianceMap::Log] {
            compare(quant(method, map, 128, true, true), true, &[37, 129], 4);
            compare(quant(method, map, 128, false, true), false, &[300, 3], 3);
        }
    }
}

#[test]
fn many_steps_with_the_defaults() {
    compare(AdvancedQuantizationConfig::default(), true, &[40_000], 30);
}

#[test]
fn log2_matches_the_cpu_function() {
    let Ok(h) = harness() else {
        eprintln!("skipped: {}", harness().err().unwrap_or_default());
        return;
    };
    // Every 4099th positive float up to 1, and the edges.
    let mut bits: Vec<u32> = (1..=0x3f80_0000u32).step_by(4099).collect();
    bits.extend([1, 2, 0x007f_ffff, 0x0080_0000, 0x3f7f_ffff, 0x3f80_0000]);
    for b in bits {
        let r = f32::from_bits(b);
        // SAFETY: a pure function of one float.
        let dev = unsafe { (h.log2)(r) };
        assert_eq!(dev.to_bits(), crate::scales::log2_det(r).to_bits(), "{r:e}");
    }
}
