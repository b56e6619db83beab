//! `y = W^T x` straight from the packed nibbles, never materializing the f32
//! weight. The work is cut into pieces fixed by the shape alone (column
//! chunks, or for tall matrices blocks of input rows with one partial output
//! each, added in block order) and run by [`crate::par::for_each_block`]
//! (the calling thread plus pool helpers), so every output's summation order
//! (and so its value) is the same for any thread count.

use std::cell::RefCell;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard, OnceLock};

use super::xint::XInt;
use super::QuantizedWeight;
use crate::par;
use crate::simd::SimdLevel;

/// Fewer weights than this run on the calling thread.
const PAR_MIN_WEIGHTS: usize = 1 << 18;
/// Column width the scalar kernel accumulates at once (stays in L1).
const SCALAR_TILE: usize = 256;

/// Which implementation runs the inner loop.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MatvecKernel {
    Scalar,
    #[cfg(target_arch = "x86_64")]
    Avx2,
    #[cfg(target_arch = "x86_64")]
    Avx512,
    /// AVX-512 plus VNNI: integer dot products on `x` split into
    /// bytes (see `vnni.rs`), the f32 AVX-512 kernel for the groups that
    /// form cannot carry.
    #[cfg(target_arch = "x86_64")]
    Avx512Vnni,
}

impl MatvecKernel {
    /// The best kernel allowed at `level` for weights of `group_size` (NEON
    /// uses the scalar kernel, which the compiler vectorizes for it).
    ///
    /// The VNNI kernel (integer dot products, see `vnni.rs`) takes 1.09-1.12
    /// ns per 32 weights on one Zen 4 thread from L2 (1024x1024, the whole
    /// call) against the f32 kernel's 1.29-1.30. From DRAM (4096x11008, two threads, 300 interleaved calls
    /// each, several runs) it was 5-8% faster at group 32, 9% at 64 and
    /// 14-18% at 128, where memory is most of the cost; at group 16 even
    /// (its epilogue per group and 64 columns weighs more). So it serves
    /// groups from `VNNI_MIN_GROUP` rows on whose size it can take (a
    /// multiple of 8 rows, see `xint::eligible`); others would run its f32
    /// fallback for every group anyway.
    pub fn for_weights(level: SimdLevel, group_size: usize) -> Self {
        match level {
            #[cfg(target_arch = "x86_64")]
            SimdLevel::Avx512
                if group_size >= VNNI_MIN_GROUP
                    && super::xint::eligible(group_size)
                    && crate::simd::has_avx512_vnni() =>
            {
                MatvecKernel::Avx512Vnni
            }
            #[cfg(target_arch = "x86_64")]
            SimdLevel::Avx512 => MatvecKernel::Avx512,
            #[cfg(target_arch = "x86_64")]
            SimdLevel::Avx2 => MatvecKernel::Avx2,
            _ => MatvecKernel::Scalar,
        }
    }

    /// Every kernel this machine can run at the level in force (tests and
    /// benches compare them all).
    pub fn available() -> Vec<MatvecKernel> {
        let mut kernels = vec![MatvecKernel::Scalar];
        #[cfg(target_arch = "x86_64")]
        {
            let level = crate::simd::level();
            if level >= SimdLevel::Avx2 {
                kernels.push(MatvecKernel::Avx2);
            }
            if level >= SimdLevel::Avx512 {
                kernels.push(MatvecKernel::Avx512);
            }
            if crate::simd::has_avx512_vnni() {
                kernels.push(MatvecKernel::Avx512Vnni);
            }
        }
        kernels
    }

    pub fn name(self) -> &'static str {
        match self {
            MatvecKernel::Scalar => "scalar",
            #[cfg(target_arch = "x86_64")]
            MatvecKernel::Avx2 => "avx2",
            #[cfg(target_arch = "x86_64")]
            MatvecKernel::Avx512 => "avx512",
            #[cfg(target_arch = "x86_64")]
            MatvecKernel::Avx512Vnni => "avx512-vnni",
        }
    }
}

/// The arguments every column-range kernel shares.
#[derive(Clone)]
pub struct MatvecArgs<'a> {
    pub data: &'a [u8],
    pub scales: &'a [f32],
    /// `x` zero-padded to `in_padded`.
    pub x: &'a [f32],
    /// `x` pre-scaled for the SIMD nibble trick: even rows by 2^-28 (the low
    /// nibble is converted as `q << 28`), odd rows by 1/16 (the high nibble
    /// as `q * 16`). Both scalings are exact powers of two. Filled only for
    /// the AVX2 kernel (empty otherwise).
    pub xs: &'a [f32],
    pub out_feat: usize,
    pub group_size: usize,
    /// The groups (blocks of input rows) this call sums over, in order.
    pub groups: std::ops::Range<usize>,
    /// `x` split into bytes, for the VNNI kernel only.
    pub xint: Option<&'a XInt>,
}

/// `y = W^T x` for one row `x` `[in_feat]` into `y` `[out_feat]`.
pub fn matvec(qw: &QuantizedWeight, x: &[f32], y: &mut [f32], kernel: MatvecKernel) {
    let in_padded = qw.in_padded();
    // The fields are public: a caller that broke the layout gets a panic
    // here, not the SIMD kernels' unchecked reads.
    let n = qw.out_feat;
    let g = qw.num_groups;
    assert!(
        n > 0
            && qw.data.len().is_multiple_of(n)
            && g > 0
            && in_padded.is_multiple_of(2 * g)
            && in_padded >= qw.in_feat
            && qw.scales.len() == g * n
            && x.len() == qw.in_feat
            && y.len() == n,
        "QuantizedWeight layout broken (data, scales, num_groups) or x/y of the wrong length"
    );
    let mut xp = vec![0.0f32; in_padded];
    xp[..qw.in_feat].copy_from_slice(x);
    // The AVX2 kernel reads the nibbles in place as `q << 28` and `q * 16`
    // and takes `x` pre-scaled to match; no other kernel needs it.
    let xs: Vec<f32> = if kernel_uses_xs(kernel) {
        xp.iter()
            .enumerate()
            .map(|(i, v)| {
                if i % 2 == 0 {
                    v * LO_SCALE
                } else {
                    v * HI_SCALE
                }
            })
            .collect()
    } else {
        Vec::new()
    };
    // The VNNI kernel's integer `x` (~10 us for 4096 rows) is built by the
    // first work item that needs it, not before the helpers are asked: a
    // helper wakes ~30 us after the request on this VM, so the build runs
    // while the caller would otherwise work alone anyway.
    let xint_cell: OnceLock<XInt> = OnceLock::new();
    let xint_of = || -> Option<&XInt> {
        #[cfg(target_arch = "x86_64")]
        if kernel == MatvecKernel::Avx512Vnni {
            // SAFETY: Avx512Vnni is only chosen (and `matvec_with` only
            // accepts it) where `simd::has_avx512_vnni` detected AVX-512
            // F/BW/VL at run time.
            return Some(
                xint_cell.get_or_init(|| unsafe { super::vnni::xint_avx512(&xp, qw.group_size()) }),
            );
        }
        #[cfg(not(target_arch = "x86_64"))]
        let _ = &xint_cell;
        None
    };
    let args = MatvecArgs {
        data: &qw.data,
        scales: &qw.scales,
        x: &xp,
        xs: &xs,
        out_feat: qw.out_feat,
        group_size: qw.group_size(),
        groups: 0..qw.num_groups,
        xint: None,
    };
    let weights = in_padded * n;
    if weights < PAR_MIN_WEIGHTS {
        let args = MatvecArgs {
            xint: xint_of(),
            ..args
        };
        cols(&args, 0, y, kernel);
    } else if qw.num_groups >= K_BLOCKS {
        // Split the input rows: each task streams one contiguous block of
        // the packed data (what DRAM and the prefetchers like best) into a
        // partial y; the partials are added in block order. The split
        // depends only on the shape, so results do not depend on threads.
        let per_block = qw.num_groups.div_ceil(K_BLOCKS);
        let blocks = qw.num_groups.div_ceil(per_block);
        let mut scratch = Scratch::take(blocks * n);
        let partial = scratch.get();
        // Work items: each block's columns in COL_PARTS pieces, small
        // enough that a helper joining late still gets its share.
        let width = n.div_ceil(COL_PARTS).next_multiple_of(128);
        let parts = n.div_ceil(width);
        let slots: Vec<(usize, usize, Mutex<&mut [f32]>)> = partial
            .chunks_mut(n)
            .enumerate()
            .flat_map(|(b, pb)| {
                pb.chunks_mut(width)
                    .enumerate()
                    .map(move |(c, ys)| (b, c * width, Mutex::new(ys)))
            })
            .collect();
        // The item that finishes the last block of a column piece adds that
        // piece's partials into `y` in block order (which thread does it
        // varies, the order does not): the reduction runs in parallel with
        // the other pieces instead of after all of them (it took ~18 us of a
        // 1.2 ms 4096x11008 call on the calling thread alone).
        let y_parts: Vec<Mutex<&mut [f32]>> = y.chunks_mut(width).map(Mutex::new).collect();
        let done: Vec<AtomicUsize> = (0..parts).map(|_| AtomicUsize::new(0)).collect();
        par::for_each_block(slots.len(), |i| {
            let (b, c0, ref ys) = slots[i];
            let g0 = b * per_block;
            let mut block_args = args.clone();
            block_args.groups = g0..(g0 + per_block).min(qw.num_groups);
            block_args.xint = xint_of();
            cols(&block_args, c0, &mut lock(ys), kernel);
            let c = c0 / width;
            if done[c].fetch_add(1, Ordering::AcqRel) + 1 == blocks {
                let mut yc = lock(&y_parts[c]);
                yc.copy_from_slice(&lock(&slots[c].2));
                for (_, _, pb) in slots.iter().skip(parts + c).step_by(parts) {
                    for (yv, pv) in yc.iter_mut().zip(lock(pb).iter()) {
                        *yv += pv;
                    }
                }
            }
        });
    } else {
        let width = chunk_width(n);
        let slots: Vec<Mutex<&mut [f32]>> = y.chunks_mut(width).map(Mutex::new).collect();
        par::for_each_block(slots.len(), |c| {
            let args = MatvecArgs {
                xint: xint_of(),
                ..args.clone()
            };
            cols(&args, c * width, &mut lock(&slots[c]), kernel);
        });
    }
}

/// Largest partial-output buffer (in floats, 16 MiB) a thread keeps
/// between calls; a larger one is allocated for the call.
const SCRATCH_KEEP: usize = 1 << 22;

thread_local! {
    /// The calling thread's partial outputs of its last large matvec.
    static SCRATCH: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// A buffer of floats whose contents are unspecified (every work item
/// overwrites its piece before reading it), kept per thread between calls:
/// allocating and zeroing 352 KB for a 4096x11008 matvec took 10-28 us on
/// the calling thread before any helper could start. Handed back on drop.
struct Scratch {
    buf: Vec<f32>,
    len: usize,
}

impl Scratch {
    fn take(len: usize) -> Scratch {
        let mut buf = if len <= SCRATCH_KEEP {
            SCRATCH
                .try_with(|s| s.try_borrow_mut().map(|mut v| std::mem::take(&mut *v)))
                .ok()
                .and_then(Result::ok)
                .unwrap_or_default()
        } else {
            Vec::new()
        };
        if buf.len() < len {
            buf.resize(len, 0.0);
        }
        Scratch { buf, len }
    }

    fn get(&mut self) -> &mut [f32] {
        &mut self.buf[..self.len]
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        if self.len <= SCRATCH_KEEP {
            let buf = std::mem::take(&mut self.buf);
            // (A nested call on this thread found the buffer taken and
            // used its own; whichever is handed back last is kept.)
            let _ = SCRATCH.try_with(|s| {
                if let Ok(mut v) = s.try_borrow_mut() {
                    *v = buf;
                }
            });
        }
    }
}

/// Lock a work item's slot (a panic in another item does not poison the
/// data for this one: each item writes only its own slot).
fn lock<'a, 'b, T: ?Sized>(m: &'a Mutex<&'b mut T>) -> MutexGuard<'a, &'b mut T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Whether `kernel` reads `MatvecArgs::xs`.
fn kernel_uses_xs(kernel: MatvecKernel) -> bool {
    #[cfg(target_arch = "x86_64")]
    if kernel == MatvecKernel::Avx2 {
        return true;
    }
    let _ = kernel;
    false
}

/// Smallest group size the VNNI kernel is chosen for (see `for_weights`);
/// it also needs a multiple of 8 rows (else the f32 path runs every group).
pub const VNNI_MIN_GROUP: usize = 32;

/// Input-row blocks a large matvec is split into (fixed, for determinism).
const K_BLOCKS: usize = 8;
/// Column pieces each input-row block is worked in.
const COL_PARTS: usize = 2;

/// 2^-28: the low nibble is read as `q << 28`.
pub const LO_SCALE: f32 = 1.0 / 268_435_456.0;
/// 1/16: the high nibble is read as `q * 16`.
pub const HI_SCALE: f32 = 1.0 / 16.0;

/// Output columns per rayon task: about four tasks per thread, whole cache
/// lines, at most 4096 columns (16 KiB of `y` in L1).
fn chunk_width(out_feat: usize) -> usize {
    let tasks = 4 * rayon::current_num_threads().max(1);
    let w = out_feat.div_ceil(tasks).next_multiple_of(128);
    w.clamp(128, 4096)
}

/// `y[..] = (W^T x)[o0 .. o0 + y.len()]`.
fn cols(args: &MatvecArgs, o0: usize, y: &mut [f32], kernel: MatvecKernel) {
    match kernel {
        MatvecKernel::Scalar => matvec_int4_scalar(args, o0, y),
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `for_weights` only returns Avx2 when `simd::level()` (runtime
        // detection, lowered only by the environment) reports AVX2 and FMA.
        MatvecKernel::Avx2 => unsafe { super::x86::matvec_int4_avx2(args, o0, y) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: Avx512 is only chosen when AVX-512 F/BW/VL (and AVX2+FMA)
        // were detected at run time.
        MatvecKernel::Avx512 => unsafe { super::x86::matvec_int4_avx512(args, o0, y) },
        #[cfg(target_arch = "x86_64")]
        MatvecKernel::Avx512Vnni => match args.xint {
            // SAFETY: Avx512Vnni is only chosen when `simd::has_avx512_vnni`
            // detected AVX-512 F/BW/VL/VNNI at run time, and `xint` was
            // built from this call's `x` and group size.
            Some(xint) => unsafe { super::vnni::matvec_int4_avx512_vnni(args, xint, o0, y) },
            // SAFETY: as for Avx512 (VNNI implies it).
            None => unsafe { super::x86::matvec_int4_avx512(args, o0, y) },
        },
    }
}

/// Scalar reference: the format written out plainly. For every group `g`,
/// `acc[o] = sum over the group's pairs p of x[2p] * lo(p, o) + x[2p+1] * hi(p, o)`
/// (low nibble = even row, high nibble = odd row, two's complement), then
/// `y[o] += acc[o] * scale[g, o]`.
pub fn matvec_int4_scalar(args: &MatvecArgs, o0: usize, y: &mut [f32]) {
    y.fill(0.0);
    let mut acc = [0.0f32; SCALAR_TILE];
    for (t, yt) in y.chunks_mut(SCALAR_TILE).enumerate() {
        let c0 = o0 + t * SCALAR_TILE;
        for g in args.groups.clone() {
            scalar_group(args, g, c0, &mut acc[..yt.len()], yt);
        }
    }
}

/// One group's contribution to the columns `c0 .. c0 + y.len()`.
pub fn scalar_group(args: &MatvecArgs, g: usize, c0: usize, acc: &mut [f32], y: &mut [f32]) {
    let n = y.len();
    let half = args.group_size / 2;
    acc.fill(0.0);
    for p in g * half..(g + 1) * half {
        let (x0, x1) = (args.x[2 * p], args.x[2 * p + 1]);
        let row = &args.data[p * args.out_feat + c0..p * args.out_feat + c0 + n];
        for (a, &b) in acc.iter_mut().zip(row) {
            let lo = ((b << 4) as i8 >> 4) as f32;
            let hi = (b as i8 >> 4) as f32;
            *a += x0 * lo + x1 * hi;
        }
    }
    let srow = &args.scales[g * args.out_feat + c0..g * args.out_feat + c0 + n];
    for ((yv, a), s) in y.iter_mut().zip(acc.iter()).zip(srow) {
        *yv += a * s;
    }
}
