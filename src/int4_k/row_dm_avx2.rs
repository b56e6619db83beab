//! [`super::row_dm`] with AVX2 + F16C for rows of 256-input super-blocks
//! (8 groups, 12 scale-code bytes each): the multi-row kernel
//! (`crate::int4_asym::rows_avx2`) asks for every row's `(d, -m)` pairs on
//! every call, and the scalar unpack (two integer-to-float conversions and
//! two multiplies per group, software half conversions) cost about as much
//! as the group's dot. Here a super-block's 8 groups are unpacked at once:
//! one in-lane byte shuffle puts each group's 12-bit field in a 32-bit lane
//! (groups 0-3 from bytes 0-5, 4-7 from bytes 6-11 of the broadcast
//! bytes), one per-lane shift aligns the odd groups' fields, two masks give
//! `sc` and `mn`, and the products with `D` and `-Dmin` (halves by F16C)
//! are the scalar ones bit for bit (the same f32 multiplications).
//!
//! Rows whose super-block is the whole row (`in` not a multiple of 256,
//! e.g. SmolLM2's 576 inputs: 18 groups under one `(D, Dmin)`) take the
//! same unpack eight groups at a time, the last `groups % 8` groups from
//! their bytes in place (reading on into the next row's codes, which are
//! dropped; the last row from a zero-padded copy): through the scalar
//! unpack they made a batch-1 call of `[1536, 576]` half again as slow as
//! one of `[576, 1536]`.

use std::arch::x86_64::*;

use super::{row_dm, scale_code_bytes, GROUP, SUPER};
use crate::simd::Avx2F16c;

/// Groups per 256-input super-block.
const GPS: usize = SUPER / GROUP;

/// [`super::row_dm`] (the same values): vector code for every eight groups
/// under one `(D, Dmin)` (super-blocks of 8 groups, or one super-block per
/// row), the scalar unpack for the rest. `sc` starts with the row's scale
/// codes and may run on into the next rows' (the weight's whole array from
/// this row): a row's last `groups % 8` groups then unpack from their bytes
/// in place, the following ones read and dropped.
pub(crate) fn row_dm_f16c(t: Avx2F16c, sc: &[u8], supers: &[u16], gps: usize, dm: &mut [f32]) {
    let groups = dm.len() / 2;
    let sc_row = &sc[..scale_code_bytes(groups)];
    let whole_row = gps == groups;
    if !(whole_row || gps == GPS && groups.is_multiple_of(GPS)) {
        return row_dm(sc_row, supers, gps, dm);
    }
    assert!(supers.len() >= 2 * groups.div_ceil(gps));
    // SAFETY: the token proves AVX2, FMA and F16C; `sc` holds the row's
    // codes (sliced above) and `supers` its halves (asserted).
    unsafe { row_dm_body(t, sc, supers, gps, dm) }
}

/// The body of [`row_dm_f16c`], with [`unpack`] inlined.
///
/// # Safety
/// None beyond the token; `sc` holds the row's `scale_code_bytes(groups)`
/// code bytes, `supers` its halves, `gps` is 8 (dividing the groups) or the
/// whole row (checked by [`row_dm_f16c`]).
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn row_dm_body(t: Avx2F16c, sc: &[u8], supers: &[u16], gps: usize, dm: &mut [f32]) {
    let groups = dm.len() / 2;
    let vector = groups / GPS * GPS;
    // SAFETY: `vector / 8` runs of 12 code bytes lie in the row's codes.
    unsafe { unpack(t, sc, supers, gps, &mut dm[..2 * vector]) };
    if vector < groups {
        // The last `groups % 8` groups (a row that is one super-block),
        // through the same unpack eight groups at a time; the pad's pairs
        // are dropped. Their 12 bytes read in place where the array has
        // them (every row but the last): copied into a buffer first, the
        // unpack's loads waited on the copy's byte stores (no store to load
        // forwarding), which cost a 576-input row about as much as its
        // other 16 groups. The last row copies, zero-padded.
        let at = vector / 2 * 3;
        let mut bytes = [0u8; 12];
        let from = match sc.get(at..at + 12) {
            Some(b) => b,
            None => {
                // Element loops, not `copy_from_slice`: a copy of a length
                // known only at run time is a `memmove` call.
                bytes.iter_mut().zip(&sc[at..]).for_each(|(b, &v)| *b = v);
                &bytes
            }
        };
        let mut pairs = [0f32; 2 * GPS];
        // SAFETY: as above: 12 code bytes, the row's one pair of halves
        // (`whole_row`), 16 floats.
        unsafe { unpack(t, from, &supers[..2], gps, &mut pairs) };
        // A fixed trip count with a test, not a copy of the run-time
        // length (which compiles to a `memmove` call per row).
        let tail = &mut dm[2 * vector..];
        for (j, p) in pairs.into_iter().enumerate() {
            if j < tail.len() {
                tail[j] = p;
            }
        }
    }
}

/// Per eight groups `c` (12 code bytes at `12 c`, under the halves of
/// super-block `s = 8 c / gps`, at `2 s`, `2 s + 1`), the 16 floats
/// `dm[16 c..]`.
///
/// # Safety
/// None beyond the token; `dm.len() / 16` runs of eight groups of codes
/// and their halves present, each inside one super-block of `gps` groups
/// (checked by [`row_dm_f16c`]).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn unpack(_: Avx2F16c, sc_row: &[u8], supers: &[u16], gps: usize, dm: &mut [f32]) {
    // Lane `g` of each 128-bit half: bytes `3(g/2) + g%2` and the next,
    // zero-extended to 32 bits (half 1 starts at byte 6).
    let ctl = _mm256_setr_epi8(
        0, 1, -1, -1, 1, 2, -1, -1, 3, 4, -1, -1, 4, 5, -1, -1, //
        6, 7, -1, -1, 7, 8, -1, -1, 9, 10, -1, -1, 10, 11, -1, -1,
    );
    let shift = _mm256_setr_epi32(0, 4, 0, 4, 0, 4, 0, 4);
    let six = _mm256_set1_epi32(0x3F);
    for (c, out) in dm.chunks_exact_mut(2 * GPS).enumerate() {
        // `c * GPS / gps` without the division (one per eight groups, its
        // latency in the way of every row's unpack): `gps` is 8 or the
        // whole row (`row_dm_f16c`'s cases).
        let s = if gps == GPS { c } else { 0 };
        let b = &sc_row[12 * c..12 * c + 12];
        // SAFETY: 12 bytes at `b` (8 + 4 read), 16 floats in `out`.
        unsafe {
            // The 12 bytes by two loads (8, then 4) straight from the row:
            // copied into a 16-byte buffer first, the one 16-byte load of
            // the copy waited on the copy's narrower stores (no store to
            // load forwarding), which made this unpack cost half as much as
            // the row's dot on a 576-input row.
            let b = b.as_ptr();
            let tail = b.add(8).cast::<i32>().read_unaligned();
            let v12 = _mm_unpacklo_epi64(_mm_loadl_epi64(b.cast()), _mm_cvtsi32_si128(tail));
            let v = _mm256_broadcastsi128_si256(v12);
            let f = _mm256_srlv_epi32(_mm256_shuffle_epi8(v, ctl), shift);
            let sc = _mm256_cvtepi32_ps(_mm256_and_si256(f, six));
            let mn = _mm256_cvtepi32_ps(_mm256_and_si256(_mm256_srli_epi32::<6>(f), six));
            let big_d = _mm256_cvtph_ps(_mm_set1_epi16(supers[2 * s] as i16));
            let dmin = _mm256_cvtph_ps(_mm_set1_epi16(supers[2 * s + 1] as i16));
            let d = _mm256_mul_ps(big_d, sc);
            // Negating `Dmin` is exact, so `(-Dmin) * mn` is `-(Dmin * mn)`.
            let m = _mm256_mul_ps(_mm256_xor_ps(dmin, _mm256_set1_ps(-0.0)), mn);
            let (lo, hi) = (_mm256_unpacklo_ps(d, m), _mm256_unpackhi_ps(d, m));
            let p = out.as_mut_ptr();
            _mm256_storeu_ps(p, _mm256_permute2f128_ps::<0x20>(lo, hi));
            _mm256_storeu_ps(p.add(8), _mm256_permute2f128_ps::<0x31>(lo, hi));
        }
    }
}
