//! The AVX2 + F16C float32-activation row dot of the k-quants (Q4_K, Q5_K,
//! Q6_K: 256-weight super-blocks), one output row after another (the
//! batch-1 forward of `GgufWeight`, through `fused::dot_rows`).
//!
//! Why this shape (measured on Zen 3, docs/benchmarks.md "Zen 3, AVX2: the
//! k-quants at batch 1"): the generic multi-row kernel (`rows_avx2.rs`)
//! first built every sub-block's map in scalar code (software half
//! conversions, the 6-bit unpack, one multiply per sub-block) into a heap
//! buffer, then widened each 32 codes with seven shuffles / extracts and
//! four sign extensions. Here
//! - `x` is copied once per call into the lane order that one in-lane byte
//!   shuffle produces ([`Prepared`]: lanes 0-3 inputs `4k..4k + 4`, lanes
//!   4-7 inputs `16 + 4k..16 + 4k + 4` of every 32), so a code byte becomes
//!   an f32 lane with one `vpshufb` and one conversion (Q5_K, Q6_K), and
//!   the sum of `x` over each sub-block is formed once per call for every
//!   row;
//! - Q4_K reads `x` as it is: its nibbles are widened from memory as the
//!   32-weight kernel does (`vpmovzxbd` of 8 bytes, an `and` for the low
//!   nibbles of sub-block `2i`, a shift for the high ones of `2i + 1`),
//!   which on Zen 3 took 4-10 % less time than the shuffles of the same
//!   codes (a throwaway harness, one thread, alternating);
//! - the maps of a super-block are built inside the pass with vector code:
//!   `d` / `dmin` by F16C, the 6-bit scales and minimums unpacked with
//!   integer-register shifts (ggml's `utmp` steps, `k_scales.rs`) and
//!   converted and multiplied eight at a time; the minimums' term is one
//!   FMA per super-block and row (`c . sum(x)` over its 8 sub-blocks);
//! - the codes are extracted straight from the block's bytes: Q4_K's 32
//!   bytes of a sub-block pair give both sub-blocks (low and high nibbles),
//!   Q5_K adds the pair's bits of `qh`, Q6_K joins `ql` nibbles and `qh`
//!   bit pairs and subtracts 32 on bytes, 32 codes per instruction;
//! - Q6_K's signed codes are placed in the top byte of each lane (so the
//!   shuffle sign-extends for free: the lane holds `q * 2^24`), and its maps
//!   carry the exact factor `2^-24`; its two 16-weight sub-blocks of 32
//!   codes are lanes 0-3 and 4-7, so one FMA with a two-valued map vector
//!   applies both scales;
//! - one row per pass: rows would share only the loads of `x`, which the
//!   FMAs take from L1 anyway, and two or four rows per pass spill
//!   registers (on Zen 3 one row per pass ran 1.1-1.5x faster than two or
//!   four; prefetching the rows gained nothing).
//!
//! Rounding (the bound of `fused.rs`, re-derived for this order): per lane
//! and 32 codes, `sum(q x)` in one f32 chain of 4 products, one FMA with
//! `a_j` into one of two totals (at most `in / 64` FMAs per lane); the two
//! totals, the minimums' total and the 8 lanes joined in 5 operations; each
//! sub-block's `sum(x)` in at most 31 adds, one FMA with `c_j` per
//! super-block and lane. Every product `a q_i x_i` and `c_j x_i` so passes
//! fewer than `in + 2` roundings, and each value is within `(in + 2) *
//! eps_f32 * sum_i (|a q_i| + |c|) |x_i|` of the float64 dot of the
//! dequantized row. The scalings by `2^24` and `2^-24` are exact: the maps
//! stay normal (`|a| >= 2^-24` before the factor) and the sums stay finite
//! because an `x` with some `|x_i| >= 2^64` (or a non-finite one) runs the
//! scalar twin instead (`crate::range` keeps the linear layers' rows below
//! that).

use std::arch::x86_64::*;
use std::cell::RefCell;

use super::{GgmlType, Q4K, Q5K, Q6K};
use crate::simd::{Avx2F16c, F32Lanes};

/// `|x_i|` bits at or above this (`2^64`, or not finite) run the scalar twin.
const X_LIMIT_BITS: i32 = 0x5F80_0000;

/// `out[i] = row (r0 + i) . x` for the rows of `data`, `row_bytes` bytes
/// (whole super-blocks of `T`, one of Q4_K, Q5_K, Q6_K) each, `x` their
/// `row_bytes / BYTES * 256` inputs; false, with `out` untouched, for an
/// `x` this kernel declines (some `|x_i| >= 2^64` or not finite: the caller,
/// `fused::dot_rows`, then runs the scalar twin).
#[must_use]
pub(crate) fn dot_rows<T: GgmlType>(
    t: Avx2F16c,
    data: &[u8],
    row_bytes: usize,
    r0: usize,
    x: &[f32],
    out: &mut [f32],
) -> bool {
    assert!(
        T::ELEMS == 256
            && row_bytes.is_multiple_of(T::BYTES)
            && x.len() == row_bytes / T::BYTES * T::ELEMS
            && data.len() >= (r0 + out.len()) * row_bytes
    );
    PREP.with(|prep| {
        let mut prep = prep.borrow_mut();
        // SAFETY: the token proves AVX2, FMA and F16C; `x` is whole
        // 32-blocks.
        if !unsafe { prep.fill(t, x, T::GGML_TYPE != 12) } {
            return false;
        }
        match T::GGML_TYPE {
            12 => passes::<Q4K>(t, &prep, x, data, row_bytes, r0, out),
            13 => passes::<Q5K>(t, &prep, x, data, row_bytes, r0, out),
            14 => passes::<Q6K>(t, &prep, x, data, row_bytes, r0, out),
            _ => unreachable!("{} is not a k-quant", T::NAME),
        }
        true
    })
}

thread_local! {
    /// Each thread's prepared `x`, refilled in place on every call: no
    /// allocation and no zeroing per call (the row engine calls once per
    /// task of 8 to 64 rows, so a long `x` would otherwise be allocated and
    /// zeroed for every few rows).
    static PREP: RefCell<Prepared> = const {
        RefCell::new(Prepared {
            xp: Vec::new(),
            sx: Vec::new(),
        })
    };
}

/// `x` in the lane order of the code shuffles and the sum of each of its
/// 32-input sub-blocks.
struct Prepared {
    /// Per 32 inputs `x[32m..]`, four vectors: `x[32m + 4k..][..4]` then
    /// `x[32m + 16 + 4k..][..4]`, `k = 0..4`.
    xp: Vec<f32>,
    /// `sum(x[32m..32m + 32])`.
    sx: Vec<f32>,
}

impl Prepared {
    /// Refill from `x` (`xp` only where `shuffled`: the kernels that read
    /// it); `false` (the contents then undefined) when some `|x_i| >= 2^64`
    /// or is not finite.
    ///
    /// # Safety
    /// None beyond the token; `x.len()` a multiple of 32.
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn fill(&mut self, _: Avx2F16c, x: &[f32], shuffled: bool) -> bool {
        let n = x.len() / 32;
        // Same length as the last call: nothing to write before the loop.
        if shuffled {
            self.xp.resize(32 * n, 0.0);
        }
        self.sx.resize(n, 0.0);
        let (xp, sx) = (&mut self.xp, &mut self.sx);
        let abs = _mm256_set1_epi32(0x7FFF_FFFF);
        let mut top = _mm256_setzero_si256();
        for (m, s) in sx.iter_mut().enumerate() {
            // SAFETY: inputs `32m..32m + 32` lie in `x` and in `xp`.
            unsafe {
                let p = x.as_ptr().add(32 * m);
                let v = [
                    _mm256_loadu_ps(p),
                    _mm256_loadu_ps(p.add(8)),
                    _mm256_loadu_ps(p.add(16)),
                    _mm256_loadu_ps(p.add(24)),
                ];
                for w in v {
                    top = _mm256_max_epi32(top, _mm256_and_si256(_mm256_castps_si256(w), abs));
                }
                if shuffled {
                    let q = xp.as_mut_ptr().add(32 * m);
                    _mm256_storeu_ps(q, _mm256_permute2f128_ps::<0x20>(v[0], v[2]));
                    _mm256_storeu_ps(q.add(8), _mm256_permute2f128_ps::<0x31>(v[0], v[2]));
                    _mm256_storeu_ps(q.add(16), _mm256_permute2f128_ps::<0x20>(v[1], v[3]));
                    _mm256_storeu_ps(q.add(24), _mm256_permute2f128_ps::<0x31>(v[1], v[3]));
                }
                let t = _mm256_add_ps(_mm256_add_ps(v[0], v[1]), _mm256_add_ps(v[2], v[3]));
                *s = t.hsum();
            }
        }
        let over = _mm256_cmpgt_epi32(top, _mm256_set1_epi32(X_LIMIT_BITS - 1));
        _mm256_movemask_epi8(over) == 0
    }
}

/// Each row of `r0..r0 + out.len()` in turn.
fn passes<K: KQuant>(
    t: Avx2F16c,
    prep: &Prepared,
    x: &[f32],
    data: &[u8],
    row_bytes: usize,
    r0: usize,
    out: &mut [f32],
) {
    for (i, o) in out.iter_mut().enumerate() {
        let row = data[(r0 + i) * row_bytes..].as_ptr();
        // SAFETY: the token proves the features; the row has `row_bytes`
        // readable bytes (asserted by `dot_rows`), the whole super-blocks
        // that `prep` spans.
        *o = unsafe { kernel::<K>(t, prep, x, row) };
    }
}

/// One row's running sums: two totals of `a_j sum(q x)` (even and odd
/// steps, so that neither chain waits on the other) and the minimums'
/// `c_j sum(x)`.
struct Acc {
    tot: [__m256; 2],
    mins: __m256,
}

/// The dot of one row against `prep` (and `x`, for a kernel that reads it
/// in input order: `K::IN_ORDER`).
///
/// # Safety
/// None beyond the token; the row has `prep.sx.len() / 8` super-blocks of
/// `K::BYTES` readable bytes; `x.len() == 32 * prep.sx.len()`, and so is
/// `prep.xp.len()` unless `K::IN_ORDER`.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn kernel<K: KQuant>(_: Avx2F16c, prep: &Prepared, x: &[f32], row: *const u8) -> f32 {
    let xs = if K::IN_ORDER { x } else { &prep.xp };
    let zero = _mm256_setzero_ps();
    let mut acc = Acc {
        tot: [zero; 2],
        mins: zero,
    };
    for k in 0..prep.sx.len() / 8 {
        // SAFETY: super-block `k` of the row and inputs `256k..256k + 256`
        // of `prep` exist (the contract).
        unsafe {
            K::block(
                row.add(k * K::BYTES),
                xs.as_ptr().add(256 * k),
                prep.sx.as_ptr().add(8 * k),
                &mut acc,
            )
        }
    }
    // SAFETY: AVX2 is enabled.
    unsafe { _mm256_sub_ps(_mm256_add_ps(acc.tot[0], acc.tot[1]), acc.mins).hsum() }
}

/// The per-type body: one super-block of one row into its sums.
trait KQuant {
    /// Bytes per super-block.
    const BYTES: usize;
    /// Whether `block` reads `x` in input order (else `Prepared::xp`).
    const IN_ORDER: bool = false;

    /// Adds super-block `b`'s terms against the prepared inputs `xp` (256)
    /// and sub-block sums `sx` (8) to `acc`.
    ///
    /// # Safety
    /// AVX2, FMA and F16C in force; the bytes and floats named readable.
    unsafe fn block(b: *const u8, xp: *const f32, sx: *const f32, acc: &mut Acc);
}

/// `vpshufb` controls: lane `i` of vector `k` takes byte `4k + i` of its
/// 128-bit half, zero-extended (`ZX`) or in the top byte (`TOP`, the
/// signed byte times `2^24`).
const ZX: [[i8; 16]; 4] = controls(0);
const TOP: [[i8; 16]; 4] = controls(3);

const fn controls(at: usize) -> [[i8; 16]; 4] {
    let mut c = [[-128i8; 16]; 4];
    let mut k = 0;
    while k < 4 {
        let mut i = 0;
        while i < 4 {
            c[k][4 * i + at] = (4 * k + i) as i8;
            i += 1;
        }
        k += 1;
    }
    c
}

/// `sum(q x)` per lane of 32 byte codes `q` against their prepared inputs
/// `xp` (32 floats): one chain of four, `ctl` the shuffle controls.
///
/// # Safety
/// AVX2 and FMA in force; 32 readable floats at `xp`.
#[inline(always)]
unsafe fn chain(q: __m256i, ctl: &[[i8; 16]; 4], xp: *const f32) -> __m256 {
    // SAFETY: the caller's contract. (Functions, not closures: a closure
    // is not inlined into a `#[target_feature]` function.)
    unsafe {
        let p = _mm256_mul_ps(lane(q, &ctl[0]), _mm256_loadu_ps(xp));
        let p = _mm256_fmadd_ps(lane(q, &ctl[1]), _mm256_loadu_ps(xp.add(8)), p);
        let p = _mm256_fmadd_ps(lane(q, &ctl[2]), _mm256_loadu_ps(xp.add(16)), p);
        _mm256_fmadd_ps(lane(q, &ctl[3]), _mm256_loadu_ps(xp.add(24)), p)
    }
}

/// One `vpshufb` of `q` by `ctl` (both halves), converted to f32.
///
/// # Safety
/// AVX2 in force.
#[inline(always)]
unsafe fn lane(q: __m256i, ctl: &[i8; 16]) -> __m256 {
    // SAFETY: the caller's contract; `ctl` is 16 bytes.
    unsafe {
        let c = _mm_loadu_si128(ctl.as_ptr().cast());
        _mm256_cvtepi32_ps(_mm256_shuffle_epi8(q, _mm256_set_m128i(c, c)))
    }
}

/// The half at `p` in all 8 lanes, as f32 (F16C: exact, subnormals too).
///
/// # Safety
/// F16C in force; 2 readable bytes at `p`.
#[inline(always)]
unsafe fn half8(p: *const u8) -> __m256 {
    // SAFETY: the caller's contract.
    unsafe { _mm256_cvtph_ps(_mm_set1_epi16(p.cast::<i16>().read_unaligned())) }
}

/// Eight bytes (a little-endian u64) as f32 lanes, zero-extended.
///
/// # Safety
/// AVX2 in force.
#[inline(always)]
unsafe fn bytes8(v: u64) -> __m256 {
    // SAFETY: the caller's contract.
    unsafe { _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_cvtsi64_si128(v as i64))) }
}

/// The maps of a Q4_K / Q5_K super-block (`d`, `dmin`, 12 scale bytes at
/// byte 0): `a_j = d * sc_j` and `dmin * m_j` (the minimum subtracted), the
/// products of `k_scales::multipliers`. The 6-bit fields are unpacked with
/// ggml's `utmp` steps (`k_scales::k_a8_ints_x86` states them).
///
/// # Safety
/// AVX2 and F16C in force; 16 readable bytes at `b`.
#[inline(always)]
unsafe fn k_maps(b: *const u8) -> (__m256, __m256) {
    // SAFETY: the caller's contract.
    unsafe {
        let w = b.add(4).cast::<u32>();
        let (u0, u1, u2) = (
            w.read_unaligned(),
            w.add(1).read_unaligned(),
            w.add(2).read_unaligned(),
        );
        let (low6, nib, top2) = (0x3F3F_3F3Fu32, 0x0F0F_0F0Fu32, 0x0303_0303u32);
        let sc_hi = (u2 & nib) | (((u0 >> 6) & top2) << 4);
        let m_hi = ((u2 >> 4) & nib) | (((u1 >> 6) & top2) << 4);
        let sc = u64::from(u0 & low6) | (u64::from(sc_hi) << 32);
        let m = u64::from(u1 & low6) | (u64::from(m_hi) << 32);
        (
            _mm256_mul_ps(half8(b), bytes8(sc)),
            _mm256_mul_ps(half8(b.add(2)), bytes8(m)),
        )
    }
}

/// The eight signed bytes at `p` as f32 lanes, times `d`.
///
/// # Safety
/// AVX2 in force; 8 readable bytes at `p`.
#[inline(always)]
unsafe fn signed8(p: *const u8, d: __m256) -> __m256 {
    // SAFETY: the caller's contract.
    unsafe {
        let v = _mm_loadl_epi64(p.cast());
        _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(v)), d)
    }
}

/// Bit `c` of every byte of `qh` moved to bit 4 (the other bits cleared).
///
/// # Safety
/// AVX2 in force; `c < 8`.
#[inline(always)]
unsafe fn fifth(qh: __m256i, c: usize) -> __m256i {
    // SAFETY: the caller's contract. 16-bit shifts by at most 4 keep bit 4
    // of each byte inside its byte.
    unsafe {
        let s = match c {
            0 => _mm256_slli_epi16::<4>(qh),
            1 => _mm256_slli_epi16::<3>(qh),
            2 => _mm256_slli_epi16::<2>(qh),
            3 => _mm256_slli_epi16::<1>(qh),
            4 => qh,
            5 => _mm256_srli_epi16::<1>(qh),
            6 => _mm256_srli_epi16::<2>(qh),
            _ => _mm256_srli_epi16::<3>(qh),
        };
        _mm256_and_si256(s, _mm256_set1_epi8(0x10))
    }
}

/// Q5_K: per pair of sub-blocks, 32 bytes of nibbles (low: sub-block
/// `2i`, high: `2i + 1`) with bits `2i`, `2i + 1` of the 32 `qh` bytes as
/// their fifth bits.
///
/// # Safety
/// AVX2, FMA and F16C in force; 176 bytes at `b`.
#[inline(always)]
unsafe fn q5_k_block(b: *const u8, xp: *const f32, sx: *const f32, acc: &mut Acc) {
    // SAFETY: the caller's contract; the offsets are the layout of
    // `q5_k.rs`.
    unsafe {
        let (a, c) = k_maps(b);
        acc.mins = _mm256_fmadd_ps(c, _mm256_loadu_ps(sx), acc.mins);
        let mut av = [0f32; 8];
        _mm256_storeu_ps(av.as_mut_ptr(), a);
        let m4 = _mm256_set1_epi8(0x0F);
        let qs = b.add(48);
        let qh = _mm256_loadu_si256(b.add(16).cast());
        for i in 0..4 {
            let v = _mm256_loadu_si256(qs.add(32 * i).cast());
            let lo = _mm256_or_si256(_mm256_and_si256(v, m4), fifth(qh, 2 * i));
            let hi = _mm256_or_si256(
                _mm256_and_si256(_mm256_srli_epi16::<4>(v), m4),
                fifth(qh, 2 * i + 1),
            );
            let plo = chain(lo, &ZX, xp.add(64 * i));
            let phi = chain(hi, &ZX, xp.add(64 * i + 32));
            acc.tot[0] = _mm256_fmadd_ps(plo, _mm256_broadcast_ss(&av[2 * i]), acc.tot[0]);
            acc.tot[1] = _mm256_fmadd_ps(phi, _mm256_broadcast_ss(&av[2 * i + 1]), acc.tot[1]);
        }
    }
}

impl KQuant for Q4K {
    const BYTES: usize = 144;
    const IN_ORDER: bool = true;

    /// Per pair of sub-blocks `2i`, `2i + 1` and 8 of its 32 bytes at a
    /// time: the bytes widened to i32 lanes, their low nibbles (weights
    /// `64i + 8h..`) and high nibbles (`64i + 32 + 8h..`) converted and
    /// multiplied into one chain each against `x` in input order.
    #[inline(always)]
    unsafe fn block(b: *const u8, x: *const f32, sx: *const f32, acc: &mut Acc) {
        // SAFETY: the caller's contract; the offsets are the layout of
        // `q4_k.rs` (the 128 nibble bytes at 16).
        unsafe {
            let (a, c) = k_maps(b);
            acc.mins = _mm256_fmadd_ps(c, _mm256_loadu_ps(sx), acc.mins);
            let mut av = [0f32; 8];
            _mm256_storeu_ps(av.as_mut_ptr(), a);
            let m15 = _mm256_set1_epi32(15);
            let qs = b.add(16);
            for i in 0..4 {
                let (mut plo, mut phi) = (_mm256_setzero_ps(), _mm256_setzero_ps());
                for h in 0..4 {
                    let v = _mm256_cvtepu8_epi32(_mm_loadl_epi64(qs.add(32 * i + 8 * h).cast()));
                    let lo = _mm256_cvtepi32_ps(_mm256_and_si256(v, m15));
                    let hi = _mm256_cvtepi32_ps(_mm256_srli_epi32::<4>(v));
                    let xl = _mm256_loadu_ps(x.add(64 * i + 8 * h));
                    let xh = _mm256_loadu_ps(x.add(64 * i + 32 + 8 * h));
                    (plo, phi) = if h == 0 {
                        (_mm256_mul_ps(lo, xl), _mm256_mul_ps(hi, xh))
                    } else {
                        (_mm256_fmadd_ps(lo, xl, plo), _mm256_fmadd_ps(hi, xh, phi))
                    };
                }
                acc.tot[0] = _mm256_fmadd_ps(plo, _mm256_broadcast_ss(&av[2 * i]), acc.tot[0]);
                acc.tot[1] = _mm256_fmadd_ps(phi, _mm256_broadcast_ss(&av[2 * i + 1]), acc.tot[1]);
            }
        }
    }
}

impl KQuant for Q5K {
    const BYTES: usize = 176;

    #[inline(always)]
    unsafe fn block(b: *const u8, xp: *const f32, sx: *const f32, acc: &mut Acc) {
        // SAFETY: the caller's contract.
        unsafe { q5_k_block(b, xp, sx, acc) }
    }
}

/// Q6_K: codes `32c..32c + 32` (sub-blocks `2c`, `2c + 1`) from `ql`
/// nibbles and `qh` bit pairs (the layout of `q6_k.rs`), minus 32; the 16
/// scales times `d * 2^-24` (exact), applied two per FMA.
impl KQuant for Q6K {
    const BYTES: usize = 210;

    #[inline(always)]
    unsafe fn block(b: *const u8, xp: *const f32, _sx: *const f32, acc: &mut Acc) {
        // SAFETY: the caller's contract; 210 bytes at `b`.
        unsafe {
            let d = _mm256_mul_ps(half8(b.add(208)), _mm256_set1_ps(1.0 / 16_777_216.0));
            let a = [signed8(b.add(192), d), signed8(b.add(200), d)];
            for c in 0..8 {
                let n = c / 4;
                // The signed codes, as the int8-activation bodies read them.
                let q = super::codes_x86::q6_k_reg(b, c);
                let p = chain(q, &TOP, xp.add(32 * c));
                // Lanes 0-3: scale `2c`, lanes 4-7: `2c + 1` (of `a[n]`,
                // which holds scales `8n..8n + 8`).
                let j = (2 * (c % 4)) as i32;
                let idx = _mm256_setr_epi32(j, j, j, j, j + 1, j + 1, j + 1, j + 1);
                let s = _mm256_permutevar8x32_ps(a[n], idx);
                acc.tot[c % 2] = _mm256_fmadd_ps(p, s, acc.tot[c % 2]);
            }
        }
    }
}

#[cfg(test)]
#[path = "rows_k_tests.rs"]
mod tests;
