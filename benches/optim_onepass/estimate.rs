//! What a one-pass 4-bit AdamW step would cost per element on an AVX2 core
//! (docs/optim.md, "A one-pass state layout: the estimate"). A measurement
//! program, not part of the crate: it depends on `std` only.
//!
//! Build and run (x86_64 with AVX2, FMA and F16C):
//!
//!     rustc --edition 2021 -O -C codegen-units=1 benches/optim_onepass/estimate.rs -o /tmp/onepass
//!     /tmp/onepass [THREADS] [ROUNDS]
//!
//! Each round times every variant once, in turn, on the same arrays (a 2^18
//! parameter, whose arrays stay in L2/L3, then a 2^24 one, from DRAM), split
//! over THREADS threads; it prints the process CPU time per element (best and
//! median over the rounds) and the wall time. The state bytes are not
//! meaningful: the code arrays start from arbitrary codes.
//!
//! The variants, per block of 128 elements, all in one pass (decode m and v,
//! the AdamW update with FMA, the block's maxima from registers kept in a
//! 1 KiB stack scratch, the new scales, encode):
//!
//! - `nf4_search`: NF4 m and the `sqrt_log` v map (format 2's code books),
//!   nearest codes by the 4-step binary search of `src/optim/step_lanes.rs`;
//!   m's block scale rounded up to an IEEE half (F16C), v's kept as f32.
//! - `int4_pow2h_closed`: linear `k/7` m and a v map on `sqrt(v)` whose
//!   values are consecutive float32 bit patterns `2^22` apart (`1.5 * 2^-8`
//!   up to 1: `{.., 0.375, 0.5, 0.75, 1}`), so each nearest code is closed
//!   form: `round(7x) + 8` for m, `(bits(x) - bits(1.5 * 2^-8) + 2^21) >> 22`
//!   for v (the nearest value: within an octave the bits are linear in x).
//! - `nf4_pow2h_v_closed`: NF4 m by the search, v by the `pow2h` closed form.
//! - `pow2h_closed`: both closed form: m on a signed twin of `pow2h`, a sign bit
//!   and a 3-bit magnitude `{0, 0.125, 0.1875, .., 0.75, 1}` (decoded by the
//!   16-entry look-up, encoded from the bits, 0 below 0.0625).
//! - `decode_update`: the decode and the update of `nf4_search` without the
//!   encode (the floor of this decode).
//! - `f32_adamw`: float32 AdamW with f32 m and v arrays (28 bytes per
//!   parameter), the same element math.
//! - `finite_pass`: the gradient's finiteness check, a separate read.
//!
//! The program checks the closed-form codes against a nearest-value search
//! of the same tables before timing (it exits non-zero on a mismatch).

#![cfg(target_arch = "x86_64")]

use std::arch::x86_64::*;
use std::time::Instant;

/// Elements per block (one f16 m scale and one f32 v scale per block:
/// `0.5 + 0.5 + 6 / 128 = 1.047` bytes per parameter).
const BS: usize = 128;

/// QLoRA's NF4 values, ascending.
const NF4: [f32; 16] = [
    -1.0,
    -0.696_192_8,
    -0.525_073_1,
    -0.394_917_5,
    -0.284_441_4,
    -0.184_807_4,
    -0.091_050_0,
    0.0,
    0.079_580_3,
    0.160_930_2,
    0.246_112_3,
    0.337_915_2,
    0.440_709_8,
    0.562_617,
    0.722_956_8,
    1.0,
];

/// `bits(1.5 * 2^-8)`: code 0 of the `pow2h` v map.
const POW2H_BASE: i32 = 0x3BC0_0000;

/// `bits(0.09375)`: the magnitude code 0 of the bit formula for signed `pow2h` m (code 7 is 1).
const POW2H_M_BASE: i32 = 0x3DC0_0000;

/// Step constants of the element math (AdamW, decoupled decay).
struct Consts {
    b1: f32,
    b2: f32,
    inv_sqrt_bc2: f32,
    eps: f32,
    step_size: f32,
    keep: f32,
}

/// One thread's share: whole blocks of every array.
struct Part<'a> {
    w: &'a mut [f32],
    g: &'a [f32],
    m_codes: &'a mut [u8],
    v_codes: &'a mut [u8],
    m_scale: &'a mut [f32],
    v_scale: &'a mut [f32],
    m32: &'a mut [f32],
    v32: &'a mut [f32],
}

#[derive(Clone, Copy, PartialEq)]
enum Variant {
    Nf4Search,
    Nf4Pow2h,
    Pow2hClosed,
    ClosedForm,
    DecodeUpdate,
    F32AdamW,
    FinitePass,
}

const VARIANTS: [(Variant, &str); 7] = [
    (Variant::Nf4Search, "nf4_search"),
    (Variant::Nf4Pow2h, "nf4_pow2h_v_closed"),
    (Variant::Pow2hClosed, "pow2h_closed"),
    (Variant::ClosedForm, "int4_pow2h_closed"),
    (Variant::DecodeUpdate, "decode_update"),
    (Variant::F32AdamW, "f32_adamw"),
    (Variant::FinitePass, "finite_pass"),
];

fn mids(t: &[f32; 16]) -> [f32; 16] {
    let mut m = [f32::INFINITY; 16];
    for i in 0..15 {
        m[i] = 0.5 * (t[i] + t[i + 1]);
    }
    m
}

fn pow2h_table() -> [f32; 16] {
    std::array::from_fn(|c| f32::from_bits((POW2H_BASE + ((c as i32) << 22)) as u32))
}

fn sqrt_log_table() -> [f32; 16] {
    std::array::from_fn(|k| 10f32.powf(-2.0 * (15 - k) as f32 / 15.0))
}

/// Signed `pow2h` m values by code (`sign << 3 | magnitude`).
fn pow2h_m_table() -> [f32; 16] {
    let t = pow2h_table();
    std::array::from_fn(|c| {
        let mag = if c % 8 == 0 { 0.0 } else { t[8 + c % 8] };
        if c >= 8 {
            -mag
        } else {
            mag
        }
    })
}

/// The nearest code by the midpoints (`x > mid` moves up, as the crate's search).
fn nearest_scalar(t: &[f32; 16], x: f32) -> i32 {
    mids(t)[..15].iter().filter(|&&m| x > m).count() as i32
}

/// The closed-form v code of `pow2h`, scalar.
fn pow2h_code(x: f32) -> i32 {
    ((x.to_bits() as i32 - POW2H_BASE + (1 << 21)) >> 22).clamp(0, 15)
}

/// Two 8-entry halves of a 16-entry table.
#[derive(Clone, Copy)]
struct Lut {
    lo: __m256,
    hi: __m256,
}

/// Midpoints as the 4-step binary search reads them (`step_lanes.rs`).
#[derive(Clone, Copy)]
struct Search {
    top: __m256,
    fours: __m256,
    twos: __m256,
    ones: __m256,
}

/// The registers of one variant's loop.
#[derive(Clone, Copy)]
struct Regs {
    lut_m: Lut,
    lut_v: Lut,
    search_m: Search,
    search_v: Search,
    b1: __m256,
    omb1: __m256,
    b2: __m256,
    omb2: __m256,
    isb2: __m256,
    eps: __m256,
    step: __m256,
    keep: __m256,
}

impl Regs {
    #[target_feature(enable = "avx2,fma")]
    fn new(k: &Consts, m_table: &[f32; 16], v_table: &[f32; 16]) -> Regs {
        let lut = |t: &[f32; 16]| Lut {
            lo: _mm256_setr_ps(t[0], t[1], t[2], t[3], t[4], t[5], t[6], t[7]),
            hi: _mm256_setr_ps(t[8], t[9], t[10], t[11], t[12], t[13], t[14], t[15]),
        };
        let search = |t: &[f32; 16]| {
            let m = mids(t);
            Search {
                top: _mm256_set1_ps(m[7]),
                fours: _mm256_setr_ps(m[3], m[11], 0.0, 0.0, 0.0, 0.0, 0.0, 0.0),
                twos: _mm256_setr_ps(m[1], m[5], m[9], m[13], 0.0, 0.0, 0.0, 0.0),
                ones: _mm256_setr_ps(m[0], m[2], m[4], m[6], m[8], m[10], m[12], m[14]),
            }
        };
        Regs {
            lut_m: lut(m_table),
            lut_v: lut(v_table),
            search_m: search(m_table),
            search_v: search(v_table),
            b1: _mm256_set1_ps(k.b1),
            omb1: _mm256_set1_ps(1.0 - k.b1),
            b2: _mm256_set1_ps(k.b2),
            omb2: _mm256_set1_ps(1.0 - k.b2),
            isb2: _mm256_set1_ps(k.inv_sqrt_bc2),
            eps: _mm256_set1_ps(k.eps),
            step: _mm256_set1_ps(k.step_size),
            keep: _mm256_set1_ps(k.keep),
        }
    }
}

#[target_feature(enable = "avx2")]
fn lookup(t: Lut, i: __m256i) -> __m256 {
    let a = _mm256_permutevar8x32_ps(t.lo, i);
    let b = _mm256_permutevar8x32_ps(t.hi, i);
    _mm256_blendv_ps(a, b, _mm256_castsi256_ps(_mm256_slli_epi32::<28>(i)))
}

#[target_feature(enable = "avx2")]
fn search(s: Search, x: __m256) -> __m256i {
    let above = |mid: __m256| _mm256_castps_si256(_mm256_cmp_ps::<_CMP_GT_OQ>(x, mid));
    let mut p = _mm256_srli_epi32::<31>(above(s.top));
    for t in [s.fours, s.twos, s.ones] {
        let bit = above(_mm256_permutevar8x32_ps(t, p));
        p = _mm256_sub_epi32(_mm256_add_epi32(p, p), bit);
    }
    p
}

/// The codes of 16 elements from 8 bytes (element `2i` in the low nibble).
#[target_feature(enable = "avx2")]
fn unpack(bytes: &[u8; 8]) -> (__m256i, __m256i) {
    let b = _mm_set_epi64x(0, i64::from_le_bytes(*bytes));
    let low = _mm_set1_epi8(15);
    let codes = _mm_unpacklo_epi8(
        _mm_and_si128(b, low),
        _mm_and_si128(_mm_srli_epi16::<4>(b), low),
    );
    (
        _mm256_cvtepu8_epi32(codes),
        _mm256_cvtepu8_epi32(_mm_unpackhi_epi64(codes, codes)),
    )
}

/// 16 codes (below 16) packed into 8 bytes, the layout of [`unpack`].
#[target_feature(enable = "avx2")]
fn pack(a: __m256i, b: __m256i) -> [u8; 8] {
    let pairs = |x: __m256i| _mm256_or_si256(x, _mm256_srli_epi64::<28>(x));
    let sel = |k: i8| {
        _mm256_setr_epi8(
            k,
            k + 8,
            -1,
            -1,
            -1,
            -1,
            -1,
            -1,
            -1,
            -1,
            -1,
            -1,
            -1,
            -1,
            -1,
            -1, //
            -1,
            -1,
            k,
            k + 8,
            -1,
            -1,
            -1,
            -1,
            -1,
            -1,
            -1,
            -1,
            -1,
            -1,
            -1,
            -1,
        )
    };
    let qa = _mm256_shuffle_epi8(pairs(a), sel(0));
    let qb = _mm256_shuffle_epi8(pairs(b), sel(0));
    // Each half's two bytes land at 0, 1 (low half) and 2, 3 (high half);
    // a's four bytes then go to 0..4, b's to 4..8.
    let lo = _mm_or_si128(
        _mm256_castsi256_si128(qa),
        _mm256_extracti128_si256::<1>(qa),
    );
    let hi = _mm_or_si128(
        _mm256_castsi256_si128(qb),
        _mm256_extracti128_si256::<1>(qb),
    );
    let both = _mm_unpacklo_epi32(lo, hi);
    (_mm_cvtsi128_si64(both) as u64).to_le_bytes()
}

#[target_feature(enable = "avx2")]
fn hmax(x: __m256) -> f32 {
    let a = _mm_max_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps::<1>(x));
    let b = _mm_max_ps(a, _mm_movehl_ps(a, a));
    _mm_cvtss_f32(_mm_max_ss(b, _mm_shuffle_ps::<1>(b, b)))
}

/// `x` rounded up to an IEEE half and back (the stored m scale).
#[target_feature(enable = "avx2,f16c")]
fn f16_up(x: f32) -> f32 {
    let h = _mm_cvtps_ph::<_MM_FROUND_TO_POS_INF>(_mm_set_ss(x));
    _mm_cvtss_f32(_mm_cvtph_ps(h))
}

#[target_feature(enable = "avx2")]
fn load8(x: &[f32]) -> __m256 {
    let x: &[f32; 8] = x[..8].try_into().unwrap();
    // SAFETY: `x` holds 8 readable f32 (the array reference).
    unsafe { _mm256_loadu_ps(x.as_ptr()) }
}

#[target_feature(enable = "avx2")]
fn store8(v: __m256, x: &mut [f32]) {
    let x: &mut [f32; 8] = (&mut x[..8]).try_into().unwrap();
    // SAFETY: `x` holds 8 writable f32 (the array reference).
    unsafe { _mm256_storeu_ps(x.as_mut_ptr(), v) }
}

/// How a variant stores m and v.
#[derive(Clone, Copy, PartialEq)]
enum Codes {
    /// 16-entry look-up, nearest code by the binary search.
    Search,
    /// m only: linear `k/7`, `round(7x) + 8` (decode by conversion).
    Int4,
    /// `pow2h` closed form (v: on `sqrt(v)`; m: sign and magnitude, look-up decode).
    Pow2h,
}

impl Variant {
    /// (m, v) storage of a one-pass variant.
    fn codes(self) -> (Codes, Codes) {
        match self {
            Variant::Nf4Pow2h => (Codes::Search, Codes::Pow2h),
            Variant::Pow2hClosed => (Codes::Pow2h, Codes::Pow2h),
            Variant::ClosedForm => (Codes::Int4, Codes::Pow2h),
            _ => (Codes::Search, Codes::Search),
        }
    }
}

/// `pow2h` v codes of 8 normalized values in `[0, 1]`.
#[target_feature(enable = "avx2")]
fn pow2h_v(u: __m256) -> __m256i {
    let d = _mm256_sub_epi32(
        _mm256_castps_si256(u),
        _mm256_set1_epi32(POW2H_BASE - (1 << 21)),
    );
    let c = _mm256_max_epi32(_mm256_srai_epi32::<22>(d), _mm256_setzero_si256());
    _mm256_min_epi32(c, _mm256_set1_epi32(15))
}

/// Signed `pow2h` m codes (`sign << 3 | magnitude`) of 8 values in `[-1, 1]`.
#[target_feature(enable = "avx2")]
fn pow2h_m(x: __m256) -> __m256i {
    let bits = _mm256_castps_si256(x);
    let a = _mm256_and_si256(bits, _mm256_set1_epi32(0x7fff_ffff));
    let d = _mm256_sub_epi32(a, _mm256_set1_epi32(POW2H_M_BASE - (1 << 21)));
    let mag = _mm256_min_epi32(
        _mm256_max_epi32(_mm256_srai_epi32::<22>(d), _mm256_set1_epi32(1)),
        _mm256_set1_epi32(7),
    );
    // Below 0.0625 the nearest magnitude is 0.
    let zero = _mm256_cmpgt_epi32(_mm256_set1_epi32(0x3D80_0000), a);
    let sign = _mm256_and_si256(_mm256_srli_epi32::<28>(bits), _mm256_set1_epi32(8));
    _mm256_or_si256(_mm256_andnot_si256(zero, mag), sign)
}

/// One-pass step of one thread's blocks.
#[target_feature(enable = "avx2,fma,f16c")]
fn one_pass(r: &Regs, p: &mut Part<'_>, variant: Variant) {
    let (m_codes, v_codes) = variant.codes();
    let absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fff_ffff));
    let base = _mm256_set1_epi32(POW2H_BASE);
    let (mut sm, mut su) = ([0f32; BS], [0f32; BS]);
    for b in 0..p.w.len() / BS {
        let e0 = b * BS;
        // int4 m decodes as (code - 8) * scale / 7.
        let m_s = _mm256_set1_ps(if m_codes == Codes::Int4 {
            p.m_scale[b] / 7.0
        } else {
            p.m_scale[b]
        });
        let v_s = _mm256_set1_ps(p.v_scale[b]);
        let (mut am, mut au) = (_mm256_setzero_ps(), _mm256_setzero_ps());
        for j in (0..BS).step_by(16) {
            let (e, c) = (e0 + j, (e0 + j) / 2);
            let (mi, vi) = (
                unpack(p.m_codes[c..c + 8].try_into().unwrap()),
                unpack(p.v_codes[c..c + 8].try_into().unwrap()),
            );
            for (h, mc, vc) in [(0, mi.0, vi.0), (8, mi.1, vi.1)] {
                let m_hat = if m_codes == Codes::Int4 {
                    _mm256_cvtepi32_ps(_mm256_sub_epi32(mc, _mm256_set1_epi32(8)))
                } else {
                    lookup(r.lut_m, mc)
                };
                let r_hat = if v_codes == Codes::Pow2h {
                    _mm256_castsi256_ps(_mm256_add_epi32(_mm256_slli_epi32::<22>(vc), base))
                } else {
                    lookup(r.lut_v, vc)
                };
                let (m_hat, r_hat) = (_mm256_mul_ps(m_hat, m_s), _mm256_mul_ps(r_hat, v_s));
                let (w, g) = (load8(&p.w[e + h..]), load8(&p.g[e + h..]));
                let m = _mm256_fmadd_ps(r.b1, m_hat, _mm256_mul_ps(r.omb1, g));
                let v = _mm256_fmadd_ps(
                    r.b2,
                    _mm256_mul_ps(r_hat, r_hat),
                    _mm256_mul_ps(r.omb2, _mm256_mul_ps(g, g)),
                );
                let root = _mm256_sqrt_ps(v);
                let denom = _mm256_fmadd_ps(root, r.isb2, r.eps);
                let w = _mm256_fmsub_ps(w, r.keep, _mm256_div_ps(_mm256_mul_ps(r.step, m), denom));
                store8(w, &mut p.w[e + h..]);
                store8(m, &mut sm[j + h..]);
                store8(root, &mut su[j + h..]);
                am = _mm256_max_ps(am, _mm256_and_ps(m, absmask));
                au = _mm256_max_ps(au, root);
            }
        }
        if variant == Variant::DecodeUpdate {
            continue;
        }
        let (ms, vs) = (f16_up(hmax(am)), hmax(au));
        p.m_scale[b] = ms;
        p.v_scale[b] = vs;
        let inv = |s: f32| _mm256_set1_ps(if s > 0.0 { 1.0 / s } else { 0.0 });
        let (im, iv) = (inv(ms), inv(vs));
        for j in (0..BS).step_by(16) {
            let c = (e0 + j) / 2;
            let x = [0, 8].map(|h| _mm256_mul_ps(load8(&sm[j + h..]), im));
            let u = [0, 8].map(|h| _mm256_mul_ps(load8(&su[j + h..]), iv));
            let mc = x.map(|x| match m_codes {
                Codes::Search => search(r.search_m, x),
                Codes::Int4 => {
                    _mm256_cvtps_epi32(_mm256_fmadd_ps(x, _mm256_set1_ps(7.0), _mm256_set1_ps(8.0)))
                }
                Codes::Pow2h => pow2h_m(x),
            });
            let vc = u.map(|u| match v_codes {
                Codes::Pow2h => pow2h_v(u),
                _ => search(r.search_v, u),
            });
            p.m_codes[c..c + 8].copy_from_slice(&pack(mc[0], mc[1]));
            p.v_codes[c..c + 8].copy_from_slice(&pack(vc[0], vc[1]));
        }
    }
}

/// Float32 AdamW over f32 m and v: the same element math, 28 bytes a parameter.
#[target_feature(enable = "avx2,fma")]
fn f32_adamw(r: &Regs, p: &mut Part<'_>) {
    for e in (0..p.w.len()).step_by(8) {
        let (w, g) = (load8(&p.w[e..]), load8(&p.g[e..]));
        let m = _mm256_fmadd_ps(r.b1, load8(&p.m32[e..]), _mm256_mul_ps(r.omb1, g));
        let v = _mm256_fmadd_ps(
            r.b2,
            load8(&p.v32[e..]),
            _mm256_mul_ps(r.omb2, _mm256_mul_ps(g, g)),
        );
        let denom = _mm256_fmadd_ps(_mm256_sqrt_ps(v), r.isb2, r.eps);
        store8(
            _mm256_fmsub_ps(w, r.keep, _mm256_div_ps(_mm256_mul_ps(r.step, m), denom)),
            &mut p.w[e..],
        );
        store8(m, &mut p.m32[e..]);
        store8(v, &mut p.v32[e..]);
    }
}

#[target_feature(enable = "avx2")]
fn all_finite(x: &[f32]) -> bool {
    let (inf, absmask) = (
        _mm256_set1_ps(f32::INFINITY),
        _mm256_castsi256_ps(_mm256_set1_epi32(0x7fff_ffff)),
    );
    let mut bad = _mm256_setzero_ps();
    for c in x.chunks_exact(8) {
        bad = _mm256_or_ps(
            bad,
            _mm256_cmp_ps::<_CMP_NLT_UQ>(_mm256_and_ps(load8(c), absmask), inf),
        );
    }
    _mm256_movemask_ps(bad) == 0
}

fn run(r: &Regs, p: &mut Part<'_>, variant: Variant) {
    // SAFETY: `main` checked AVX2, FMA and F16C before building any `Regs`.
    unsafe {
        match variant {
            Variant::F32AdamW => f32_adamw(r, p),
            Variant::FinitePass => assert!(all_finite(p.g)),
            v => one_pass(r, p, v),
        }
    }
}

/// Process CPU time in ns (CLOCK_PROCESS_CPUTIME_ID).
fn cpu_ns() -> u64 {
    #[repr(C)]
    struct Timespec {
        sec: i64,
        nsec: i64,
    }
    extern "C" {
        fn clock_gettime(clock: i32, ts: *mut Timespec) -> i32;
    }
    let mut t = Timespec { sec: 0, nsec: 0 };
    // SAFETY: `t` is a valid, writable timespec; clock 2 is Linux's
    // CLOCK_PROCESS_CPUTIME_ID.
    let rc = unsafe { clock_gettime(2, &mut t) };
    assert_eq!(rc, 0, "clock_gettime");
    t.sec as u64 * 1_000_000_000 + t.nsec as u64
}

/// Closed-form codes against a nearest-value search, and the nibble round trip.
fn self_check() {
    let (t_int4, t_pow2h) = (
        std::array::from_fn::<f32, 16, _>(|c| (c as f32 - 8.0).max(-7.0) / 7.0),
        pow2h_table(),
    );
    let mut x = 0.0f32;
    while x <= 1.0 {
        assert_eq!(
            pow2h_code(x),
            nearest_scalar(&t_pow2h, x),
            "pow2h code of {x}"
        );
        let m = 2.0 * x - 1.0;
        let closed = (m * 7.0 + 8.0).round_ties_even() as i32;
        let searched = nearest_scalar(&t_int4, m);
        // Codes 0 and 1 both hold -1 in the int4 table; ties may go either way.
        assert!(
            (t_int4[closed as usize] - t_int4[searched as usize]).abs() <= 1.0 / 7.0 + 1e-6,
            "int4 {m}"
        );
        x += 1.0 / 4099.0;
    }
    // Signed pow2h m: the decoded value of the closed-form code is the nearest table value.
    let t_m = pow2h_m_table();
    let xs: Vec<f32> = (0..=8192).map(|i| i as f32 / 4096.0 - 1.0).collect();
    for chunk in xs.chunks_exact(8) {
        let mut codes = [0i32; 8];
        // SAFETY: `main` checked AVX2; `chunk` holds 8 f32, `codes` 8 i32.
        unsafe {
            _mm256_storeu_si256(
                codes.as_mut_ptr().cast(),
                pow2h_m(_mm256_loadu_ps(chunk.as_ptr())),
            )
        };
        for (&x, &c) in chunk.iter().zip(&codes) {
            let best = t_m
                .iter()
                .map(|t| (t - x).abs())
                .fold(f32::INFINITY, f32::min);
            assert!(
                (t_m[c as usize] - x).abs() <= best + 1e-7,
                "pow2h m code of {x}"
            );
        }
    }
    let bytes = [0x10, 0x32, 0x54, 0x76, 0x98, 0xba, 0xdc, 0xfe];
    // SAFETY: `main` checked AVX2 before calling this.
    let back = unsafe {
        let (a, b) = unpack(&bytes);
        pack(a, b)
    };
    assert_eq!(back, bytes, "nibble round trip");
}

fn main() {
    assert!(
        is_x86_feature_detected!("avx2")
            && is_x86_feature_detected!("fma")
            && is_x86_feature_detected!("f16c"),
        "needs AVX2, FMA and F16C"
    );
    self_check();
    let args: Vec<usize> = std::env::args()
        .skip(1)
        .map(|a| a.parse().expect("THREADS ROUNDS"))
        .collect();
    let threads = args.first().copied().unwrap_or(1).max(1);
    let k = Consts {
        b1: 0.9,
        b2: 0.999,
        inv_sqrt_bc2: 3.0,
        eps: 1e-8,
        step_size: 1e-3,
        keep: 1.0 - 1e-5,
    };
    let (t_nf4, t_sqrt_log) = (NF4, sqrt_log_table());
    let t_int4 = std::array::from_fn(|c| (c as f32 - 8.0).max(-7.0) / 7.0);
    // SAFETY: the features were checked above.
    let regs = VARIANTS.map(|(variant, _)| {
        let (m, v) = variant.codes();
        let m_table = match m {
            Codes::Search => t_nf4,
            Codes::Int4 => t_int4,
            Codes::Pow2h => pow2h_m_table(),
        };
        let v_table = if v == Codes::Pow2h {
            pow2h_table()
        } else {
            t_sqrt_log
        };
        // SAFETY: the features were checked above.
        unsafe { Regs::new(&k, &m_table, &v_table) }
    });
    println!("threads {threads}; CPU ns per element (best / median), wall ms (min / median)");
    for log2n in [18usize, 24] {
        let n = 1usize << log2n;
        let rounds = args
            .get(1)
            .copied()
            .unwrap_or(if log2n == 18 { 200 } else { 12 });
        let mut s = 0x9E37_79B9_7F4A_7C15u64;
        let mut rnd = || {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s >> 40) as f32 / (1u64 << 24) as f32 - 0.5
        };
        let mut w: Vec<f32> = (0..n).map(|_| rnd()).collect();
        let g: Vec<f32> = (0..n).map(|_| rnd() * 0.01).collect();
        let mut m_codes: Vec<u8> = (0..n / 2).map(|i| (i * 37) as u8).collect();
        let mut v_codes: Vec<u8> = (0..n / 2).map(|i| (i * 91) as u8).collect();
        let (mut m_scale, mut v_scale) = (vec![0.01f32; n / BS], vec![0.01f32; n / BS]);
        let (mut m32, mut v32) = (vec![0f32; n], vec![0f32; n]);
        let mut cpu = vec![Vec::new(); VARIANTS.len()];
        let mut wall = vec![Vec::new(); VARIANTS.len()];
        for _ in 0..rounds {
            for (i, &(variant, _)) in VARIANTS.iter().enumerate() {
                let r = &regs[i];
                let share = n / threads;
                let (c0, t0) = (cpu_ns(), Instant::now());
                std::thread::scope(|scope| {
                    let parts = w
                        .chunks_mut(share)
                        .zip(g.chunks(share))
                        .zip(
                            m_codes
                                .chunks_mut(share / 2)
                                .zip(v_codes.chunks_mut(share / 2)),
                        )
                        .zip(
                            m_scale
                                .chunks_mut(share / BS)
                                .zip(v_scale.chunks_mut(share / BS)),
                        )
                        .zip(m32.chunks_mut(share).zip(v32.chunks_mut(share)));
                    for ((((w, g), (m_codes, v_codes)), (m_scale, v_scale)), (m32, v32)) in parts {
                        let mut p = Part {
                            w,
                            g,
                            m_codes,
                            v_codes,
                            m_scale,
                            v_scale,
                            m32,
                            v32,
                        };
                        if threads == 1 {
                            run(r, &mut p, variant);
                        } else {
                            scope.spawn(move || run(r, &mut p, variant));
                        }
                    }
                });
                cpu[i].push((cpu_ns() - c0) as f64 / n as f64);
                wall[i].push(t0.elapsed().as_secs_f64() * 1e3);
            }
        }
        for (i, &(_, name)) in VARIANTS.iter().enumerate() {
            let (c, t) = (&mut cpu[i], &mut wall[i]);
            c.sort_by(f64::total_cmp);
            t.sort_by(f64::total_cmp);
            println!(
                "2^{log2n} {name:18} CPU {:.3} / {:.3} ns, wall {:.2} / {:.2} ms ({rounds} rounds)",
                c[0],
                c[c.len() / 2],
                t[0],
                t[t.len() / 2]
            );
        }
    }
}
