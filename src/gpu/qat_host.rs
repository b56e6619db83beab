//! The QAT kernels checked on the host, without a GPU: g++ compiles
//! kernels/qat_math.cuh and qat.cu (`host_test/qat_harness.cpp`, with
//! `-ffp-contract=off`, the twin of NVRTC's `--fmad=false`), and the step
//! sequence of `qat.rs` (the one the device runs) drives it over host
//! memory. Master, moments, view, parameters and step count must be
//! bit-identical to the CPU `QatOptimizer` over several steps, for every
//! target, rounding, scheme and master dtype; a failing step must fail with
//! the CPU's error and change nothing.
//!
//! Skipped (with the reason printed) where no `g++` is installed.

use std::sync::OnceLock;

use super::qat::{self, dry_blocks, reduce_partials, DevMaster, QatArgs, QatBufs, QatExec};
use super::qat::{QatScalars, MAX_DRY_BLOCKS};
use crate::error::Result;
use crate::fp8::Fp8Format;
use crate::qat::{
    calibrate_per_channel, CounterRng, IntDtype, Master, QatConfig, QatOptimizer, QuantScheme,
    QuantTarget, RoundingMode,
};

type DryFn = unsafe extern "C" fn(*const QatArgs, u64);
type CommitFn = unsafe extern "C" fn(*const QatArgs);
type MinMaxF32 = unsafe extern "C" fn(*const f32, u64, u64, i32, *mut f64);
type MinMaxF64 = unsafe extern "C" fn(*const f64, u64, u64, i32, *mut f64);

struct Harness {
    _lib: libloading::Library,
    dry: [DryFn; 2],
    commit: [CommitFn; 2],
    minmax32: MinMaxF32,
    minmax64: MinMaxF64,
}

/// The g++ build of the QAT kernels, or why there is none.
fn harness() -> std::result::Result<&'static Harness, String> {
    static H: OnceLock<std::result::Result<Harness, String>> = OnceLock::new();
    H.get_or_init(|| {
        let lib = super::host_build::load("qat_harness.cpp", "qat")?;
        let e = |e: libloading::Error| e.to_string();
        // SAFETY: the symbols have the declared C signatures (qat_harness.cpp).
        unsafe {
            Ok(Harness {
                dry: [
                    *lib.get::<DryFn>(b"host_qat_dry_f32").map_err(e)?,
                    *lib.get::<DryFn>(b"host_qat_dry_f64").map_err(e)?,
                ],
                commit: [
                    *lib.get::<CommitFn>(b"host_qat_commit_f32").map_err(e)?,
                    *lib.get::<CommitFn>(b"host_qat_commit_f64").map_err(e)?,
                ],
                minmax32: *lib
                    .get::<MinMaxF32>(b"host_qat_channel_minmax_f32")
                    .map_err(e)?,
                minmax64: *lib
                    .get::<MinMaxF64>(b"host_qat_channel_minmax_f64")
                    .map_err(e)?,
                _lib: lib,
            })
        }
    })
    .as_ref()
    .map_err(Clone::clone)
}

/// Runs the kernels' code on host memory (addresses are host pointers).
struct HostExec(&'static Harness);

fn which<T: DevMaster>() -> usize {
    (T::SUFFIX == "f64") as usize
}

impl QatExec for HostExec {
    unsafe fn dry<T: DevMaster>(&self, a: &QatArgs) -> Result<(f64, f64, bool)> {
        let blocks = dry_blocks(a.n as usize);
        // SAFETY: every address in `a` is a live host buffer of `a.n`
        // elements of T; `partials` holds 3 * MAX_DRY_BLOCKS f64.
        unsafe { (self.0.dry[which::<T>()])(a, blocks as u64) };
        // SAFETY: as above; the harness wrote the first 3 * blocks.
        let p = unsafe { std::slice::from_raw_parts(a.partials as *const f64, 3 * blocks) };
        Ok(reduce_partials(p))
    }
    unsafe fn commit<T: DevMaster>(&self, a: &QatArgs) -> Result<()> {
        // SAFETY: as for `dry`.
        unsafe { (self.0.commit[which::<T>()])(a) };
        Ok(())
    }
    unsafe fn read<T: DevMaster>(&self, addr: u64, n: usize) -> Result<Vec<T>> {
        // SAFETY: `addr` is a live host buffer of `n` elements of T.
        Ok(unsafe { std::slice::from_raw_parts(addr as *const T, n) }.to_vec())
    }
}

/// The host twin of the device optimizer: scalars and host buffers.
#[derive(Clone, Debug, PartialEq)]
struct HostQat<T> {
    s: QatScalars,
    m: Vec<T>,
    v: Vec<T>,
    q: Vec<T>,
}

impl<T: DevMaster> HostQat<T> {
    /// Built as the device engine builds one: from a CPU optimizer.
    fn from_cpu(o: &QatOptimizer<T>) -> HostQat<T> {
        let (m, v) = o.moments();
        HostQat {
            s: QatScalars {
                config: *o.config(),
                seed: o.seed(),
                step: o.step_count(),
                params: o.quant_params().copied(),
            },
            m: m.to_vec(),
            v: v.to_vec(),
            q: o.quantized_slice().to_vec(),
        }
    }

    fn step(&mut self, h: &'static Harness, w: &mut [T], g: &[T], seed: Option<u64>) -> Result<()> {
        let mut partials = vec![0f64; 3 * MAX_DRY_BLOCKS];
        let bufs = QatBufs {
            n: w.len(),
            m: self.m.as_mut_ptr() as u64,
            v: self.v.as_mut_ptr() as u64,
            q: self.q.as_mut_ptr() as u64,
            partials: partials.as_mut_ptr() as u64,
        };
        let (wp, gp) = (w.as_mut_ptr() as u64, g.as_ptr() as u64);
        // SAFETY: m, v, q, w and g are live host buffers of `n` elements,
        // `partials` of 3 * MAX_DRY_BLOCKS; `w` is the caller's own slice.
        unsafe { qat::step::<T, _>(&HostExec(h), &mut self.s, &bufs, wp, gp, seed) }
    }
}

fn bits<T: Master>(x: &[T]) -> Vec<u64> {
    x.iter().map(|&v| Into::<f64>::into(v).to_bits()).collect()
}

/// Asserts the host twin equals the CPU optimizer bit for bit.
fn same<T: DevMaster>(host: &HostQat<T>, cpu: &QatOptimizer<T>, what: &str) {
    let (m, v) = cpu.moments();
    assert_eq!(bits(&host.m), bits(m), "m: {what}");
    assert_eq!(bits(&host.v), bits(v), "v: {what}");
    if let Some(i) =
        (0..host.q.len()).find(|&i| bits(&host.q[i..=i]) != bits(&cpu.quantized_slice()[i..=i]))
    {
        panic!(
            "view differs at {i}: {:?} vs {:?}: {what}",
            host.q[i],
            cpu.quantized_slice()[i]
        );
    }
    assert_eq!(host.s.params.as_ref(), cpu.quant_params(), "params: {what}");
    assert_eq!(host.s.step, cpu.step_count(), "step: {what}");
}

fn data<T: Master>(n: usize, seed: u64, scale: f64) -> Vec<T> {
    let mut r = CounterRng::new(seed);
    let mut u = vec![0.0; n];
    r.fill_uniform(&mut u);
    u.iter().map(|x| T::from_f64((x - 0.5) * scale)).collect()
}

fn targets() -> [QuantTarget; 4] {
    [
        QuantTarget::Int(IntDtype::Int8),
        QuantTarget::Int(IntDtype::Int4),
        QuantTarget::Fp8(Fp8Format::E4M3),
        QuantTarget::Fp8(Fp8Format::E5M2),
    ]
}

/// Every (target, scheme, rounding) the CPU accepts.
fn configs() -> Vec<QatConfig> {
    let mut out = Vec::new();
    for target in targets() {
        for scheme in [QuantScheme::Symmetric, QuantScheme::Affine] {
            if matches!(target, QuantTarget::Fp8(_)) && scheme == QuantScheme::Affine {
                continue;
            }
            for rounding in [RoundingMode::Nearest, RoundingMode::Stochastic] {
                let mut c = QatConfig::new(target, scheme, rounding, 3e-2);
                c.weight_decay = 0.05;
                c.beta2 = 0.99;
                out.push(c);
            }
        }
    }
    out
}

/// `steps` steps of the CPU optimizer and the host twin from the same
/// state, compared after each; odd steps override the stream seed.
fn compare<T: DevMaster>(c: QatConfig, n: usize, steps: u64) {
    let Ok(h) = harness() else {
        eprintln!("skipped: {}", harness().err().unwrap_or_default());
        return;
    };
    let mut w: Vec<T> = data(n, 1, 4.0);
    let mut cpu = QatOptimizer::with_seed(&w, c, 11).unwrap();
    let mut host = HostQat::from_cpu(&cpu);
    let mut host_w = w.clone();
    for step in 0..steps {
        // Gradients of very different sizes, some exact zeros.
        let mut g: Vec<T> = data(n, 100 + step, 2.0);
        for (i, x) in g.iter_mut().enumerate() {
            let k = T::from_f64(10f64.powi((i / 97 % 5) as i32 - 2));
            *x = if i % 31 == 7 { T::ZERO } else { *x * k };
        }
        let seed = (step % 2 == 1).then_some(1000 + step);
        cpu.step_seeded(&mut w, &g, seed).unwrap();
        host.step(h, &mut host_w, &g, seed).unwrap();
        let what = format!("{} {c:?} n={n} step {step}", T::DTYPE);
        assert_eq!(bits(&host_w), bits(&w), "master: {what}");
        same(&host, &cpu, &what);
    }
}

#[test]
fn every_target_scheme_and_rounding_matches_the_cpu_f32() {
    for c in configs() {
        // One partial block, then several blocks and more than one CPU
        // chunk (stochastic indices past 2^14).
        compare::<f32>(c, 1001, 3);
        compare::<f32>(c, 40_000, 3);
    }
}

#[test]
fn every_target_scheme_and_rounding_matches_the_cpu_f64() {
    for c in configs() {
        compare::<f64>(c, 1001, 3);
        compare::<f64>(c, 40_000, 3);
    }
}

#[test]
fn many_steps_beyond_the_dry_blocks_match_the_cpu() {
    // More elements than MAX_DRY_BLOCKS * THREADS: threads stride.
    let mut c = QatConfig::with_target(QuantTarget::Int(IntDtype::Int4));
    c.rounding = RoundingMode::Stochastic;
    compare::<f32>(c, 300_001, 12);
    c.target = QuantTarget::Fp8(Fp8Format::E4M3);
    compare::<f64>(c, 300_001, 4);
}

/// A step both sides must refuse with the same error, changing nothing;
/// `poison` makes that master element infinite first.
fn refuse<T: DevMaster>(
    c: QatConfig,
    w0: &[T],
    g: &[T],
    steps_before: u64,
    poison: Option<usize>,
) -> String {
    let h = harness().unwrap();
    let mut w = w0.to_vec();
    let mut cpu = QatOptimizer::with_seed(&w, c, 5).unwrap();
    let mut host = HostQat::from_cpu(&cpu);
    let mut host_w = w.clone();
    for s in 0..steps_before {
        let g0: Vec<T> = data(w.len(), 50 + s, 1.0);
        cpu.step_seeded(&mut w, &g0, None).unwrap();
        host.step(h, &mut host_w, &g0, None).unwrap();
    }
    if let Some(i) = poison {
        w[i] = T::from_f64(f64::INFINITY);
        host_w[i] = w[i];
    }
    let (w_before, host_before) = (host_w.clone(), host.clone());
    let cpu_err = cpu.step_seeded(&mut w, g, None).unwrap_err().to_string();
    let host_err = host.step(h, &mut host_w, g, None).unwrap_err().to_string();
    assert_eq!(host_err, cpu_err);
    assert_eq!(bits(&host_w), bits(&w_before), "master changed: {cpu_err}");
    assert_eq!(host, host_before, "state changed: {cpu_err}");
    same(&host, &cpu, &cpu_err);
    cpu_err
}

fn failures<T: DevMaster>() {
    if let Err(e) = harness() {
        eprintln!("skipped: {e}");
        return;
    }
    let c = QatConfig::with_target(QuantTarget::Int(IntDtype::Int8));
    let w: Vec<T> = data(3000, 1, 2.0);
    let mut g: Vec<T> = data(3000, 2, 1.0);
    g[2345] = T::from_f64(f64::NAN);
    assert!(refuse(c, &w, &g, 2, None).contains("grad: non-finite value NaN at index 2345"));
    let g: Vec<T> = data(3000, 3, 1.0);
    assert!(refuse(c, &w, &g, 1, Some(17)).contains("master: non-finite value inf at index 17"));
    let mut huge = g.clone();
    huge[99] = T::from_f64(if T::BYTES == 4 { 1e30 } else { 1e300 });
    assert!(refuse(c, &w, &huge, 1, None).contains("overflows"));
    // Degenerate calibration: lr * weight_decay = 1 and a zero gradient
    // take every weight to 0 on the first step.
    let mut z = c;
    (z.lr, z.weight_decay) = (1.0, 1.0);
    let zeros = vec![T::ZERO; 3000];
    assert!(refuse(z, &w, &zeros, 0, None).contains("degenerate calibration"));
}

#[test]
fn failed_steps_change_nothing_and_fail_as_on_the_cpu() {
    failures::<f32>();
    failures::<f64>();
}

#[test]
fn per_channel_minmax_matches_the_cpu_calibration() {
    let Ok(h) = harness() else {
        eprintln!("skipped: {}", harness().err().unwrap_or_default());
        return;
    };
    let (rows, cols) = (37, 129);
    let x64: Vec<f64> = data(rows * cols, 9, 3.0);
    let x32: Vec<f32> = data(rows * cols, 9, 3.0);
    for axis in [0usize, 1] {
        let ch = if axis == 0 { rows } else { cols };
        for scheme in [QuantScheme::Symmetric, QuantScheme::Affine] {
            let mut out = vec![0f64; 3 * ch];
            // SAFETY: x holds rows * cols values, out 3 per channel.
            unsafe {
                (h.minmax64)(
                    x64.as_ptr(),
                    rows as u64,
                    cols as u64,
                    axis as i32,
                    out.as_mut_ptr(),
                )
            };
            let want = calibrate_per_channel(&x64, [rows, cols], axis, IntDtype::Int4, scheme, 0.0)
                .unwrap();
            let got = super::qat_channels::params_from_minmax(&out, IntDtype::Int4, scheme, axis)
                .unwrap()
                .unwrap();
            assert_eq!(got, want, "f64 axis {axis} {scheme:?}");
            // SAFETY: as above.
            unsafe {
                (h.minmax32)(
                    x32.as_ptr(),
                    rows as u64,
                    cols as u64,
                    axis as i32,
                    out.as_mut_ptr(),
                )
            };
            let want = calibrate_per_channel(&x32, [rows, cols], axis, IntDtype::Int8, scheme, 0.0)
                .unwrap();
            let got = super::qat_channels::params_from_minmax(&out, IntDtype::Int8, scheme, axis)
                .unwrap()
                .unwrap();
            assert_eq!(got, want, "f32 axis {axis} {scheme:?}");
        }
    }
}

/// Masters on and next to the FP8 grid's ties and the integer grid's
/// half-way points, stepped with lr = 0 (the update leaves them as they
/// are): the views must round exactly as the CPU's, including float64's
/// round-to-odd before the f32 codec.
fn ties<T: DevMaster>(target: QuantTarget, rounding: RoundingMode) {
    let Ok(h) = harness() else {
        eprintln!("skipped: {}", harness().err().unwrap_or_default());
        return;
    };
    let mut w = Vec::new();
    for base in [1.0625f64, 1.0, 0.0078125, 240.0, 3.5, 0.5 / 127.0 * 3.0] {
        for d in [0.0, 1e-12, -1e-12, 1e-7, -1e-7, 1e-3] {
            w.push(T::from_f64(base + d));
            w.push(T::from_f64(-(base + d)));
        }
    }
    w.push(T::from_f64(4.0)); // the int grid's absmax: scale 4 / qmax
    let mut c = QatConfig::new(target, QuantScheme::Symmetric, rounding, 0.0);
    c.weight_decay = 0.0;
    let mut cpu = QatOptimizer::with_seed(&w, c, 3).unwrap();
    let mut host = HostQat::from_cpu(&cpu);
    let mut host_w = w.clone();
    let g: Vec<T> = data(w.len(), 4, 1.0);
    for step in 0..2 {
        cpu.step_seeded(&mut w, &g, None).unwrap();
        host.step(h, &mut host_w, &g, None).unwrap();
        let what = format!("{} {target:?} {rounding:?} step {step}", T::DTYPE);
        assert_eq!(bits(&host_w), bits(&w), "master: {what}");
        same(&host, &cpu, &what);
    }
}

#[test]
fn grid_ties_round_as_on_the_cpu() {
    for target in targets() {
        for rounding in [RoundingMode::Nearest, RoundingMode::Stochastic] {
            ties::<f32>(target, rounding);
            ties::<f64>(target, rounding);
        }
    }
}
