//! AVX-512 VNNI INT4 matvec (Zen 4, Ice Lake and later).
//!
//! Why: the f32 kernel spends a widening load, a shift and two permutes on
//! every 32 weights before its two FMAs, and those shuffles, not memory, set
//! its speed. Here `x` is split into four signed bytes per element (see
//! [`super::xint`]) and the weights stay bytes: per four input rows and 64
//! columns, two byte permutes pair rows `2t` and `2t + 1` column by column,
//! four `vpmultishiftqb` spread each column's four nibbles into the bytes of
//! one dword, a ternary-logic op masks them and adds 8 (codes `q + 8` in
//! 0..15), and four `vpdpbusd` per limb sum `code * limb` over the four rows
//! in exact i32 arithmetic. Per group the four limb sums are combined in f32
//! and scaled once. About 1.5x the f32 kernel's weights per cycle; the
//! groups the integer form cannot carry exactly enough fall back to it.

use std::arch::x86_64::*;

use super::matvec::{scalar_group, MatvecArgs};
use super::x86::{strip_avx512, Ahead};
use super::xint::{GroupForm, XInt, LIMBS};

/// Columns one strip covers: 4 vectors of 16 dwords, 4 limbs each = 16 i32
/// accumulators.
const STRIP_COLS: usize = 64;

/// AVX-512 VNNI matvec over the columns `o0 .. o0 + y.len()`.
///
/// # Safety
/// The CPU must support AVX-512 F/BW/VL/VNNI/VBMI, AVX2 and FMA; `xint` must
/// be built from `args.x` with `args.group_size`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi,avx2,fma")]
pub unsafe fn matvec_int4_avx512_vnni(args: &MatvecArgs, xint: &XInt, o0: usize, y: &mut [f32]) {
    y.fill(0.0);
    let width = y.len();
    let mut acc_tail = [0.0f32; 16];
    let consts = Consts::new();
    let wrap = Ahead::wrap(args, width);
    for g in args.groups.clone() {
        let mut o = 0;
        match xint.forms[g] {
            GroupForm::Zero => continue,
            GroupForm::Int { pow2, init } => {
                while o + STRIP_COLS <= width {
                    let ahead = wrap.at(o, width);
                    let ys: &mut [f32; STRIP_COLS] =
                        (&mut y[o..o + STRIP_COLS]).try_into().expect("strip");
                    // SAFETY: the caller guarantees the CPU features; the
                    // strip's columns are inside the matrix (o0 + o + 64 <= out_feat).
                    unsafe { strip_vnni(args, xint, &consts, g, o0 + o, pow2, init, ahead, ys) };
                    o += STRIP_COLS;
                }
            }
            GroupForm::Float => {
                while o + 128 <= width {
                    // SAFETY: AVX-512 F/BW/VL + FMA are implied by the caller's contract.
                    unsafe {
                        strip_avx512::<8>(args, g, o0 + o, &mut y[o..o + 128], wrap.at(o, width))
                    };
                    o += 128;
                }
            }
        }
        while o + 16 <= width {
            // SAFETY: as above.
            unsafe { strip_avx512::<1>(args, g, o0 + o, &mut y[o..o + 16], Ahead::default()) };
            o += 16;
        }
        if o < width {
            let n = width - o;
            scalar_group(args, g, o0 + o, &mut acc_tail[..n], &mut y[o..]);
        }
    }
}

/// The loop-invariant vectors of a strip.
struct Consts {
    /// Byte permutes pairing rows `2t` (bytes 0..63) and `2t+1` (64..127):
    /// qword `j` of `pair_lo` holds, as 16-bit words, the byte pairs of
    /// columns `2j, 2j+1, 16+2j, 16+2j+1`; `pair_hi` the same 32 columns on.
    pair_lo: __m512i,
    pair_hi: __m512i,
    /// `vpmultishiftqb` controls: the nibbles of words 0-1 (bit offsets
    /// 0, 4, ..., 28) and of words 2-3 (32, ..., 60) of each qword, one per byte.
    nib_lo: __m512i,
    nib_hi: __m512i,
    low_nibble: __m512i,
    eight: __m512i,
}

impl Consts {
    #[target_feature(enable = "avx512f,avx512bw")]
    fn new() -> Consts {
        let mut lo = [0u8; 64];
        let mut hi = [0u8; 64];
        for j in 0..8 {
            for (w, c) in [2 * j, 2 * j + 1, 16 + 2 * j, 16 + 2 * j + 1]
                .into_iter()
                .enumerate()
            {
                lo[8 * j + 2 * w] = c as u8;
                lo[8 * j + 2 * w + 1] = (64 + c) as u8;
                hi[8 * j + 2 * w] = (32 + c) as u8;
                hi[8 * j + 2 * w + 1] = (96 + c) as u8;
            }
        }
        // SAFETY: each array is 64 bytes; unaligned loads.
        let (pair_lo, pair_hi) = unsafe {
            (
                _mm512_loadu_si512(lo.as_ptr() as *const _),
                _mm512_loadu_si512(hi.as_ptr() as *const _),
            )
        };
        Consts {
            pair_lo,
            pair_hi,
            nib_lo: _mm512_set1_epi64(0x1C18_1410_0C08_0400),
            nib_hi: _mm512_set1_epi64(0x3C38_3430_2C28_2420),
            low_nibble: _mm512_set1_epi8(0x0F),
            eight: _mm512_set1_epi8(0x08),
        }
    }
}

/// One integer-form group's contribution to the 64 columns from `c0`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi,avx2,fma")]
#[allow(clippy::too_many_arguments)]
unsafe fn strip_vnni(
    args: &MatvecArgs,
    xint: &XInt,
    k: &Consts,
    g: usize,
    c0: usize,
    pow2: f32,
    init: [i32; LIMBS],
    ahead: Ahead,
    y: &mut [f32; STRIP_COLS],
) {
    let n = args.out_feat;
    let quads = args.group_size / 4;
    let t0 = g * quads;
    assert!(c0 + STRIP_COLS <= n && 2 * (t0 + quads) * n <= args.data.len());
    let srow = &args.scales[g * n + c0..g * n + c0 + STRIP_COLS];
    // Written out (not `array::from_fn`): a closure call here is not inlined
    // into this target-feature function and cost ~9% of the kernel.
    assert!(LIMBS == 4 && 4 * (t0 + quads) <= xint.in_padded);
    let limbs: [*const i8; LIMBS] = [
        xint.limb(0, 4 * t0).as_ptr(),
        xint.limb(1, 4 * t0).as_ptr(),
        xint.limb(2, 4 * t0).as_ptr(),
        xint.limb(3, 4 * t0).as_ptr(),
    ];
    // acc[v][l]: columns 16v.. of the strip, limb l.
    let start = [
        _mm512_set1_epi32(init[0]),
        _mm512_set1_epi32(init[1]),
        _mm512_set1_epi32(init[2]),
        _mm512_set1_epi32(init[3]),
    ];
    let mut acc = [start; 4];
    ahead.prefetch_scales(args, g, c0, 4);
    let base = args.data.as_ptr().wrapping_add(c0);
    for t in 0..quads {
        // SAFETY: rows 2(t0+t) and 2(t0+t)+1 are < num_pairs and the strip's
        // 64 bytes are inside each row (asserted above); the limb reads are
        // inside limb l's row range (4 (t0 + quads) <= in_padded, asserted above). Prefetches never fault.
        unsafe {
            let r0p = base.add(2 * (t0 + t) * n);
            let r1p = r0p.add(n);
            ahead.prefetch_row(r0p, 1);
            ahead.prefetch_row(r1p, 1);
            let r0 = _mm512_loadu_si512(r0p as *const _);
            let r1 = _mm512_loadu_si512(r1p as *const _);
            let u0 = _mm512_permutex2var_epi8(r0, k.pair_lo, r1);
            let u1 = _mm512_permutex2var_epi8(r0, k.pair_hi, r1);
            // (nibble & 0x0F) ^ 0x08 (ternary-logic table 0x6A = (A & B) ^ C)
            // is q + 8 for a two's complement nibble.
            let codes = [
                _mm512_ternarylogic_epi32::<0x6A>(
                    _mm512_multishift_epi64_epi8(k.nib_lo, u0),
                    k.low_nibble,
                    k.eight,
                ),
                _mm512_ternarylogic_epi32::<0x6A>(
                    _mm512_multishift_epi64_epi8(k.nib_hi, u0),
                    k.low_nibble,
                    k.eight,
                ),
                _mm512_ternarylogic_epi32::<0x6A>(
                    _mm512_multishift_epi64_epi8(k.nib_lo, u1),
                    k.low_nibble,
                    k.eight,
                ),
                _mm512_ternarylogic_epi32::<0x6A>(
                    _mm512_multishift_epi64_epi8(k.nib_hi, u1),
                    k.low_nibble,
                    k.eight,
                ),
            ];
            for l in 0..LIMBS {
                let xl = _mm512_set1_epi32((limbs[l].add(4 * t) as *const i32).read_unaligned());
                for v in 0..4 {
                    acc[v][l] = _mm512_dpbusd_epi32(acc[v][l], codes[v], xl);
                }
            }
        }
    }
    // acc[v][l] = sum of q * limb_l exactly (the -8 * sum of limbs start
    // cancels the +8 of the codes). hi = l3 * 2^8 + l2 and lo = l1 * 2^8 + l0
    // stay exact in i32; the group sum is hi * 2^16 + lo in f32 (each
    // conversion and the FMA round: at most ~2^-23 of sum |q x_int|).
    let scale = _mm512_set1_ps(pow2);
    let two16 = _mm512_set1_ps(65536.0);
    for (v, a) in acc.iter().enumerate() {
        let hi = _mm512_add_epi32(_mm512_slli_epi32::<8>(a[3]), a[2]);
        let lo = _mm512_add_epi32(_mm512_slli_epi32::<8>(a[1]), a[0]);
        let sum = _mm512_fmadd_ps(_mm512_cvtepi32_ps(hi), two16, _mm512_cvtepi32_ps(lo));
        // SAFETY: srow and y hold the strip's 64 floats; v < 4.
        unsafe {
            let s = _mm512_loadu_ps(srow.as_ptr().add(16 * v));
            let yp = y.as_mut_ptr().add(16 * v);
            let part = _mm512_mul_ps(sum, scale);
            _mm512_storeu_ps(yp, _mm512_fmadd_ps(part, s, _mm512_loadu_ps(yp)));
        }
    }
}
