//! The code search of the table codec without branches: a binary search by
//! compares over the group's decoded table. The guess-and-walk search
//! (`scalar::search_from`) stays the reference: it mispredicted about once
//! per scale (the walk's length varies with where the scale falls between
//! two codes), and on Zen 3 that made the search a large part of the
//! codec's cost. Eight compares and adds settle any scale, whatever the
//! group's spread, with no logarithm for a guess.

/// The largest code `c <= 254` with `t[c] >= x`, for `x > 0` and a table
/// that is non-increasing with `t[255] = 0` (`scalar::table_with`): the
/// predicate `t[c] >= x` holds on a prefix of `0..=255` that never reaches
/// 255, so a binary search over it finds the same code as the walk. `x =
/// 0` gives 255 ([`super::ZERO_CODE`]); a NaN `x` (never a scale) gives 0.
#[inline(always)]
pub(crate) fn code_of(x: f32, t: &[f32; 256]) -> usize {
    let mut c = 0usize;
    // Each step adds `half` when the code `c + half` still holds `x`; an
    // add of a compare result compiles to no branch. `& 255` proves the
    // index in bounds (`c + half <= 255` already holds).
    for half in [128usize, 64, 32, 16, 8, 4, 2, 1] {
        c += half * (t[(c + half) & 255] >= x) as usize;
    }
    c
}

/// Encode the scales `s` of a group with its table `t`: each code (255 for
/// a zero scale) and its decoded scale, written back to `s`.
#[inline(always)]
pub(crate) fn encode_all(s: &mut [f32], codes: &mut [u8], t: &[f32; 256]) {
    for (x, c) in s.iter_mut().zip(codes.iter_mut()) {
        // A zero scale searches to code 255 (`t[c] >= 0` holds everywhere),
        // whose entry is 0: the all-zero block's code and scale, no branch.
        let k = code_of(*x, t);
        *c = k as u8;
        *x = t[k];
    }
}
