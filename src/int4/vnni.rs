//! AVX-512 VNNI INT4 matvec (Cascade Lake, Ice Lake, Zen 4 and later).
//! Callable only with an [`Avx512Vnni`] token.
//!
//! Why: the f32 kernel spends a widening load, a shift and two permutes on
//! every 32 weights before its two FMAs, and those shuffles, not memory, set
//! its speed when the weights come from cache, and keep it from overlapping
//! fully with the reads from DRAM. Here `x` is split into four signed bytes
//! per element (see [`super::xint`]) and the weights stay bytes. Per four packed rows (eight
//! input rows) and 64 columns: four loads, and two rounds of byte/word
//! unpacks (8 ops) transpose the 4 x 64 bytes so that each dword holds one
//! column's four bytes; `(b & 0x0F) ^ 8` (one ternary-logic op) is then the
//! column's four low-nibble codes `q + 8` in 0..15, and the same after a
//! 16-bit shift the four high-nibble codes. Eight `vpdpbusd` per 16 columns
//! (4 limbs x low/high) sum `code * limb` in exact i32 arithmetic. That is
//! 52 vector ops per 512 weights against the f32 kernel's 96. The unpacks
//! work within 128-bit lanes, so accumulator `m` holds columns
//! `16 L + 4 m + d` (lane block `L`, dword `d`); the epilogue transposes the
//! 4 x 4 blocks back once per group. Per group the four limb sums are
//! combined in f32 and scaled once. The groups the integer form cannot carry
//! exactly enough use the f32 kernel.

use std::arch::x86_64::*;

use super::avx512::strip as strip_avx512;
use super::format::{scalar_group, MatvecArgs};
use super::strips::Ahead;
use super::xint::{self, GroupForm, XInt, LIMBS};
use crate::simd::{Avx512, Avx512Vnni};

/// Columns one strip covers: 4 vectors of 16 dwords, 4 limbs each = 16 i32
/// accumulators.
const STRIP_COLS: usize = 64;

/// AVX-512 VNNI matvec over the columns `o0 .. o0 + y.len()`.
///
/// # Safety
/// The token proves AVX-512 F/BW/VL/VNNI, AVX2 and FMA; `xint` must be
/// built from `args.x` with `args.group_size`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma")]
pub(super) unsafe fn matvec(
    _: Avx512Vnni,
    args: &MatvecArgs,
    xint: &XInt,
    o0: usize,
    y: &mut [f32],
) {
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
    low_nibble: __m512i,
    eight: __m512i,
}

impl Consts {
    #[target_feature(enable = "avx512f,avx512bw")]
    fn new() -> Consts {
        Consts {
            low_nibble: _mm512_set1_epi8(0x0F),
            eight: _mm512_set1_epi8(0x08),
        }
    }
}

/// One integer-form group's contribution to the 64 columns from `c0`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma")]
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
    // Quads of four packed rows (eight input rows).
    let quads = args.group_size / 8;
    let t0 = g * quads;
    assert!(c0 + STRIP_COLS <= n && 4 * (t0 + quads) * n <= args.data.len());
    let srow = &args.scales[g * n + c0..g * n + c0 + STRIP_COLS];
    let xq = &xint.quads[t0..t0 + quads];
    let start = [
        _mm512_set1_epi32(init[0]),
        _mm512_set1_epi32(init[1]),
        _mm512_set1_epi32(init[2]),
        _mm512_set1_epi32(init[3]),
    ];
    // acc[m][l]: columns 16 L + 4 m + d of the strip, limb l.
    let mut acc = [start; 4];
    ahead.prefetch_scales(args, g, c0, 4);
    let base = args.data.as_ptr().wrapping_add(c0);
    for (t, limbs) in (t0..).zip(xq) {
        // SAFETY: packed rows 4t .. 4t + 3 are < num_pairs and the strip's
        // 64 bytes are inside each row (asserted above). Prefetches never
        // fault.
        unsafe {
            let r0 = base.add(4 * t * n);
            let rows = [r0, r0.add(n), r0.add(2 * n), r0.add(3 * n)];
            for r in rows {
                ahead.prefetch_row(r, 1);
            }
            let p0 = _mm512_loadu_si512(rows[0] as *const _);
            let p1 = _mm512_loadu_si512(rows[1] as *const _);
            let p2 = _mm512_loadu_si512(rows[2] as *const _);
            let p3 = _mm512_loadu_si512(rows[3] as *const _);
            // Bytes of rows (0, 1) and (2, 3) paired, then the pairs paired:
            // z[m] dword (L, d) = the four rows' bytes of column 16L + 4m + d.
            let a_lo = _mm512_unpacklo_epi8(p0, p1);
            let a_hi = _mm512_unpackhi_epi8(p0, p1);
            let b_lo = _mm512_unpacklo_epi8(p2, p3);
            let b_hi = _mm512_unpackhi_epi8(p2, p3);
            let z = [
                _mm512_unpacklo_epi16(a_lo, b_lo),
                _mm512_unpackhi_epi16(a_lo, b_lo),
                _mm512_unpacklo_epi16(a_hi, b_hi),
                _mm512_unpackhi_epi16(a_hi, b_hi),
            ];
            for (m, zm) in z.into_iter().enumerate() {
                // (nibble & 0x0F) ^ 0x08 (ternary-logic table 0x6A = (A & B)
                // ^ C) is q + 8 for a two's complement nibble.
                let lo = _mm512_ternarylogic_epi32::<0x6A>(zm, k.low_nibble, k.eight);
                let hi = _mm512_ternarylogic_epi32::<0x6A>(
                    _mm512_srli_epi16::<4>(zm),
                    k.low_nibble,
                    k.eight,
                );
                // The limbs are broadcast at the point of use (a broadcast
                // from memory runs on a load port), not hoisted: eight more
                // live registers next to the 16 accumulators and the decode
                // temporaries would not fit in 32.
                for l in 0..LIMBS {
                    let even = _mm512_set1_epi32(limbs[2 * l]);
                    let odd = _mm512_set1_epi32(limbs[2 * l + 1]);
                    acc[m][l] = _mm512_dpbusd_epi32(acc[m][l], lo, even);
                    acc[m][l] = _mm512_dpbusd_epi32(acc[m][l], hi, odd);
                }
            }
        }
    }
    // acc[m][l] = sum of q * limb_l exactly (the -8 * sum of limbs start
    // cancels the +8 of the codes). hi = l3 * 2^8 + l2 and lo = l1 * 2^8 + l0
    // stay exact in i32; the group sum is hi * 2^16 + lo in f32 (each
    // conversion and the FMA round: at most ~2^-23 of sum |q x_int|).
    let scale = _mm512_set1_ps(pow2);
    let two16 = _mm512_set1_ps(65536.0);
    let mut part = [_mm512_setzero_ps(); 4];
    for (p, a) in part.iter_mut().zip(&acc) {
        let hi = _mm512_add_epi32(_mm512_slli_epi32::<8>(a[3]), a[2]);
        let lo = _mm512_add_epi32(_mm512_slli_epi32::<8>(a[1]), a[0]);
        let sum = _mm512_fmadd_ps(_mm512_cvtepi32_ps(hi), two16, _mm512_cvtepi32_ps(lo));
        *p = _mm512_mul_ps(sum, scale);
    }
    // Transpose the 4 x 4 blocks of 128 bits: natural[L] = columns 16 L ..
    // 16 L + 15 = block L of part[0], part[1], part[2], part[3].
    let a01 = _mm512_shuffle_f32x4::<0b01_00_01_00>(part[0], part[1]);
    let b01 = _mm512_shuffle_f32x4::<0b11_10_11_10>(part[0], part[1]);
    let a23 = _mm512_shuffle_f32x4::<0b01_00_01_00>(part[2], part[3]);
    let b23 = _mm512_shuffle_f32x4::<0b11_10_11_10>(part[2], part[3]);
    let natural = [
        _mm512_shuffle_f32x4::<0b10_00_10_00>(a01, a23),
        _mm512_shuffle_f32x4::<0b11_01_11_01>(a01, a23),
        _mm512_shuffle_f32x4::<0b10_00_10_00>(b01, b23),
        _mm512_shuffle_f32x4::<0b11_01_11_01>(b01, b23),
    ];
    for (v, nat) in natural.into_iter().enumerate() {
        // SAFETY: srow and y hold the strip's 64 floats; v < 4.
        unsafe {
            let s = _mm512_loadu_ps(srow.as_ptr().add(16 * v));
            let yp = y.as_mut_ptr().add(16 * v);
            _mm512_storeu_ps(yp, _mm512_fmadd_ps(nat, s, _mm512_loadu_ps(yp)));
        }
    }
}

/// [`XInt::new`] with AVX-512, 16 elements a step: the same forms and limbs
/// bit for bit (tested); the scalar split would cost as much as the kernel.
///
/// # Safety
/// None beyond the token (AVX-512 F/BW/VL); panics unless `x.len()` is a
/// multiple of `group_size`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma")]
pub(super) unsafe fn xint(_: Avx512, x: &[f32], group_size: usize) -> XInt {
    assert!(group_size > 0 && x.len().is_multiple_of(group_size));
    let groups = x.len() / group_size;
    let mut quads = vec![[0i32; 2 * LIMBS]; x.len() / 8];
    if !xint::eligible(group_size) {
        return XInt {
            quads,
            forms: vec![GroupForm::Float; groups],
        };
    }
    let abs_mask = _mm512_set1_epi32(0x7FFF_FFFF);
    // Bytes of 16 rows -> [even rows 0-7, odd rows 0-7, even 8-15, odd 8-15].
    let deal = _mm_setr_epi8(0, 2, 4, 6, 1, 3, 5, 7, 8, 10, 12, 14, 9, 11, 13, 15);
    let mut forms = Vec::with_capacity(groups);
    for (g, xg) in x.chunks_exact(group_size).enumerate() {
        // Steps of 16 rows; a group of 8 (mod 16) rows ends with a half step.
        // (Plain loops, no closures: those are not inlined into this
        // target-feature function.)
        let mut max = _mm512_setzero_si512();
        for c in (0..group_size).step_by(16) {
            let m = lanes(group_size - c);
            // SAFETY: the mask covers only rows c .. min(c + 16, group_size).
            let v = unsafe { _mm512_maskz_loadu_epi32(m, xg.as_ptr().add(c) as *const i32) };
            max = _mm512_max_epu32(max, _mm512_and_si512(v, abs_mask));
        }
        let e = match xint::exponent_of(_mm512_reduce_max_epu32(max)) {
            Ok(e) => e,
            Err(form) => {
                forms.push(form);
                continue;
            }
        };
        let floor = _mm512_set1_epi32(xint::floor_bits(e) as i32);
        let scale = _mm512_set1_ps(xint::to_int_scale(e));
        let mut tiny = 0u16;
        let mut sums = [_mm512_setzero_si512(); LIMBS];
        for c in (0..group_size).step_by(16) {
            let m = lanes(group_size - c);
            // SAFETY: as above.
            let v = unsafe { _mm512_maskz_loadu_ps(m, xg.as_ptr().add(c)) };
            let a = _mm512_and_si512(_mm512_castps_si512(v), abs_mask);
            // Nonzero and below the floor (|x| bits compare as unsigned).
            tiny |= _mm512_mask_cmplt_epu32_mask(_mm512_test_epi32_mask(a, a), a, floor);
            // Exact scaling, then one rounding to nearest, ties to even.
            let x_int = _mm512_cvt_roundps_epi32::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(
                _mm512_mul_ps(v, scale),
            );
            // Balanced base-256 digits: each low byte read as signed.
            let l0 = _mm512_srai_epi32::<24>(_mm512_slli_epi32::<24>(x_int));
            let r1 = _mm512_srai_epi32::<8>(_mm512_sub_epi32(x_int, l0));
            let l1 = _mm512_srai_epi32::<24>(_mm512_slli_epi32::<24>(r1));
            let r2 = _mm512_srai_epi32::<8>(_mm512_sub_epi32(r1, l1));
            let l2 = _mm512_srai_epi32::<24>(_mm512_slli_epi32::<24>(r2));
            let l3 = _mm512_srai_epi32::<8>(_mm512_sub_epi32(r2, l2));
            let t = (g * group_size + c) / 8;
            let digits = [l0, l1, l2, l3];
            for l in 0..LIMBS {
                sums[l] = _mm512_add_epi32(sums[l], digits[l]);
                let dealt = _mm_shuffle_epi8(_mm512_cvtepi32_epi8(digits[l]), deal);
                // Quad t's (even, odd) dwords of limb l, then quad t + 1's.
                quads[t][2 * l] = _mm_extract_epi32::<0>(dealt);
                quads[t][2 * l + 1] = _mm_extract_epi32::<1>(dealt);
                if m == 0xFFFF {
                    quads[t + 1][2 * l] = _mm_extract_epi32::<2>(dealt);
                    quads[t + 1][2 * l + 1] = _mm_extract_epi32::<3>(dealt);
                }
            }
        }
        if tiny != 0 {
            forms.push(GroupForm::Float);
            continue;
        }
        let sums = [
            _mm512_reduce_add_epi32(sums[0]),
            _mm512_reduce_add_epi32(sums[1]),
            _mm512_reduce_add_epi32(sums[2]),
            _mm512_reduce_add_epi32(sums[3]),
        ];
        forms.push(xint::int_form(e, sums));
    }
    XInt { quads, forms }
}

/// The load mask for a step with `rows` rows left (16 or fewer lanes).
fn lanes(rows: usize) -> u16 {
    if rows >= 16 {
        0xFFFF
    } else {
        (1u16 << rows) - 1
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The AVX-512 builder the kernel's caller uses gives the reference's
    /// forms and limbs bit for bit: random, mixed-range and special values,
    /// group sizes with and without a half step, and ineligible ones.
    #[test]
    fn avx512_builder_matches_the_reference() {
        let Some(token) = Avx512::new() else {
            eprintln!("skipped: AVX-512 is not in force on this CPU (QUANTRS_SIMD or hardware)");
            return;
        };
        let mut rng = crate::testutil::Xorshift::from_state(0x2545_F491_4F6C_DD1D);
        let mut next = move || rng.next_u64();
        let specials = [
            0.0f32,
            -0.0,
            f32::NAN,
            f32::INFINITY,
            1e-40,
            f32::MIN_POSITIVE,
            3e38,
            1e30,
            -1e-30,
        ];
        for &gs in &[8usize, 16, 24, 32, 40, 128, 4, 12] {
            for case in 0..40 {
                let k = gs * (1 + case % 5);
                let x: Vec<f32> = (0..k)
                    .map(|i| {
                        let r = next();
                        let v = ((r >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0;
                        match (case + i / gs) % 6 {
                            0 => 0.0,
                            1 if r % 9 == 0 => specials[(r >> 8) as usize % specials.len()],
                            2 => v * 2f32.powi((r % 30) as i32 - 15),
                            3 if r % 4 == 0 => v * 1e-4,
                            _ => v * 3.0,
                        }
                    })
                    .collect();
                let want = XInt::new(&x, gs);
                // SAFETY: the token proves AVX-512 F/BW/VL; k is a multiple of gs.
                let got = unsafe { xint(token, &x, gs) };
                assert_eq!(got.forms, want.forms, "gs {gs} case {case}");
                for (g, form) in want.forms.iter().enumerate() {
                    if matches!(form, GroupForm::Int { .. }) {
                        let quads = g * gs / 8..(g + 1) * gs / 8;
                        assert_eq!(
                            got.quads[quads.clone()],
                            want.quads[quads],
                            "gs {gs} case {case} g {g}"
                        );
                    }
                }
            }
        }
    }
}
