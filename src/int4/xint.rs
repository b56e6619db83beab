//! `x` in the integer form the AVX-512 VNNI matvec multiplies.
//!
//! Per group of input rows, `x` is written as `x_int * 2^(E - 29)` with `E`
//! the exponent of the group's largest `|x|`, so `|x_int| < 2^30`, and
//! `x_int` is split into four signed bytes (balanced base 256:
//! `x_int = l0 + l1 2^8 + l2 2^16 + l3 2^24`, each limb in [-128, 127]).
//! The products `q * limb` and their sums are then exact in i32.
//!
//! Layout. The kernel works on four packed rows (eight input rows `8t ..
//! 8t + 7`) at a time: a dword of weights holds one column's low nibbles of
//! those rows (rows `8t, 8t+2, 8t+4, 8t+6`) or its high nibbles (the odd
//! rows). So limb `l` of quad `t` is stored as two dwords, `quads[t][2l]`
//! with the bytes of the even rows and `quads[t][2l + 1]` with the odd ones.
//!
//! [`XInt::new`] is the plain reference; the kernel's caller uses the
//! AVX-512 builder in `vnni.rs`, which must produce the same bits (tested).
//!
//! Accuracy. An element whose exponent is within 6 of `E` is represented
//! exactly (its 24-bit significand fits in 30 bits); a smaller one is rounded
//! by at most `2^(E - 30)`. A group is only given this form when every
//! nonzero `|x| >= 2^(E - MAX_RANGE_LOG2)`, which bounds that rounding by
//! `2^-18` (3.8e-6) of the element: inside the accuracy bound of docs/int4.md (`1e-5` of
//! `sum |x w|`) even when every element's rounding points the same way. Groups that fail the test (or hold NaN/inf, subnormal or
//! extreme values) stay on the f32 path; all-zero groups are skipped.

/// Signed bytes each `x_int` is split into.
pub const LIMBS: usize = 4;
/// A group takes the integer form only if its smallest nonzero `|x|` is at
/// least `2^-MAX_RANGE_LOG2` of its largest (relative rounding <= 2^-18). With
/// 2^-10 (the first choice) a fifth of the groups of 128 normal-distributed
/// values fell back to the f32 path; with 2^-12 an eighth.
const MAX_RANGE_LOG2: i32 = 12;
/// `x_int = x * 2^(X_INT_BITS - 1 - E)`, so `|x_int| < 2^X_INT_BITS`.
const X_INT_BITS: i32 = 30;
/// Exponents outside this range keep the f32 path (so `2^(E - 29)` and the
/// scaled sums stay normal, finite f32).
const MIN_EXP: i32 = -96;
const MAX_EXP: i32 = 100;
/// The bits of +inf: `|x|` bits at or above it are inf or NaN.
const INF_BITS: u32 = 0x7F80_0000;
/// 1.5 * 2^52: see `group_form`.
#[cfg(test)]
const ROUND_MAGIC: f64 = 6_755_399_441_055_744.0;
/// Larger groups keep the f32 path: the kernel's `l3 * 2^8 + l2` partial
/// (at most `2^17` per row of the group) must stay inside i32.
const MAX_GROUP: usize = 4096;

/// How one group of `x` enters the matvec.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum GroupForm {
    /// Every `x` in the group is zero: the group adds nothing.
    Zero,
    /// The f32 kernel handles the group.
    Float,
    /// `x = x_int * pow2` (see the module docs). The kernel multiplies the
    /// unsigned codes `q + 8`, so each limb's accumulator starts at
    /// `init[l] = -8 * (sum of limb l over the group)`.
    Int { pow2: f32, init: [i32; LIMBS] },
}

/// The integer form of one (zero-padded) `x`.
pub struct XInt {
    /// Per quad of eight input rows, for each limb: the even rows' bytes,
    /// then the odd rows' (one byte per row, in row order, to a dword).
    pub quads: Vec<[i32; 2 * LIMBS]>,
    pub forms: Vec<GroupForm>,
}

impl XInt {
    /// Split `x` (length a multiple of `group_size`) group by group: the
    /// plain reference that `vnni::xint_avx512` (what the kernel's caller
    /// runs) is tested against, hence test-only. Groups
    /// whose size is not a multiple of 8 (the kernel takes eight input rows
    /// at a time) or above `MAX_GROUP` all stay on the f32 path.
    #[cfg(test)]
    pub fn new(x: &[f32], group_size: usize) -> XInt {
        debug_assert!(group_size > 0 && x.len().is_multiple_of(group_size));
        let mut limbs = vec![[0i8; LIMBS]; x.len()];
        let forms = x
            .chunks_exact(group_size)
            .zip(limbs.chunks_exact_mut(group_size))
            .map(|(xg, lg)| {
                if !eligible(group_size) {
                    return GroupForm::Float;
                }
                group_form(xg, lg)
            })
            .collect();
        let quads = limbs
            .chunks_exact(8)
            .map(|rows| {
                let mut q = [0i32; 2 * LIMBS];
                for l in 0..LIMBS {
                    let bytes = |odd: usize| {
                        i32::from_le_bytes([0, 2, 4, 6].map(|r| rows[r + odd][l] as u8))
                    };
                    q[2 * l] = bytes(0);
                    q[2 * l + 1] = bytes(1);
                }
                q
            })
            .collect();
        XInt { quads, forms }
    }

    /// Limb `l` of `x_int[k]` (tests).
    #[cfg(test)]
    fn limb(&self, k: usize, l: usize) -> i8 {
        let dword = self.quads[k / 8][2 * l + k % 2];
        dword.to_le_bytes()[(k % 8) / 2] as i8
    }
}

/// Classify one group and, for the integer form, write its limbs.
///
/// Written as branch-free passes over the group (so they vectorize): this
/// runs on every call, before the kernel, on one thread.
#[cfg(test)]
fn group_form(xg: &[f32], limbs: &mut [[i8; LIMBS]]) -> GroupForm {
    // |x| as bits orders like |x|; NaN and inf are the values >= INF_BITS.
    let abs_bits = |v: &f32| v.to_bits() & 0x7FFF_FFFF;
    let max_bits = xg.iter().map(abs_bits).fold(0, u32::max);
    let e = match exponent_of(max_bits) {
        Ok(e) => e,
        Err(form) => return form,
    };
    let floor = floor_bits(e);
    let tiny = xg
        .iter()
        .map(abs_bits)
        .fold(false, |any, a| any | (a != 0 && a < floor));
    if tiny {
        return GroupForm::Float;
    }
    let to_int = pow2_f64(X_INT_BITS - 1 - e);
    let magic = ROUND_MAGIC.to_bits() as i64;
    for (limb, &v) in limbs.iter_mut().zip(xg) {
        // Exact in f64 (a power-of-two scaling), then one rounding: adding
        // 1.5 * 2^52 rounds |t| < 2^51 to an integer (ties to even, the
        // default mode), which the sum's low mantissa bits then hold.
        // (`round_ties_even` is a library call on baseline x86-64.)
        let t = v as f64 * to_int;
        let x_int = ((t + ROUND_MAGIC).to_bits() as i64 - magic) as i32;
        // Balanced base-256 digits: each low byte read as signed.
        let l0 = x_int as i8;
        let r1 = (x_int - l0 as i32) >> 8;
        let l1 = r1 as i8;
        let r2 = (r1 - l1 as i32) >> 8;
        let l2 = r2 as i8;
        let r3 = (r2 - l2 as i32) >> 8;
        debug_assert!(
            (-128..128).contains(&r3),
            "x_int must fit four balanced limbs"
        );
        *limb = [l0, l1, l2, r3 as i8];
    }
    let mut sums = [0i32; LIMBS];
    for limb in limbs.iter() {
        for (s, &d) in sums.iter_mut().zip(limb) {
            *s += d as i32;
        }
    }
    int_form(e, sums)
}

/// Whether groups of `group_size` rows can take the integer form: the
/// kernel takes eight input rows at a time, and its `l3 * 2^8 + l2` partial
/// must stay inside i32.
pub fn eligible(group_size: usize) -> bool {
    group_size.is_multiple_of(8) && group_size <= MAX_GROUP
}

/// The exponent `E` of a group whose largest `|x|` has the bits `max_bits`,
/// or the form the group takes without one (NaN/inf, zero, out of range).
pub fn exponent_of(max_bits: u32) -> Result<i32, GroupForm> {
    if max_bits >= INF_BITS {
        return Err(GroupForm::Float);
    }
    if max_bits == 0 {
        return Err(GroupForm::Zero);
    }
    let biased = (max_bits >> 23) as i32;
    let e = biased - 127;
    // biased == 0 is a subnormal maximum: below MIN_EXP as well.
    if biased == 0 || !(MIN_EXP..=MAX_EXP).contains(&e) {
        return Err(GroupForm::Float);
    }
    Ok(e)
}

/// The bits of the smallest nonzero `|x|` the integer form takes for `E`.
pub fn floor_bits(e: i32) -> u32 {
    pow2_f32(e - MAX_RANGE_LOG2).to_bits()
}

/// `2^(29 - E)`: `x * to_int_scale(E)` is `x_int` before rounding (exact in
/// f32 for every `x` the form takes: a normal number scaled by a power of
/// two into the normal range).
pub fn to_int_scale(e: i32) -> f32 {
    pow2_f32(X_INT_BITS - 1 - e)
}

/// The integer form of a group with exponent `E` and these limb sums.
pub fn int_form(e: i32, sums: [i32; LIMBS]) -> GroupForm {
    GroupForm::Int {
        pow2: pow2_f32(e + 1 - X_INT_BITS),
        init: sums.map(|s| -8 * s),
    }
}

/// `2^e` for a normal-range `e`.
fn pow2_f32(e: i32) -> f32 {
    debug_assert!((-126..=127).contains(&e));
    f32::from_bits(((e + 127) as u32) << 23)
}

#[cfg(test)]
fn pow2_f64(e: i32) -> f64 {
    debug_assert!((-1022..=1023).contains(&e));
    f64::from_bits(((e + 1023) as u64) << 52)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn value(xi: &XInt, k: usize, pow2: f32) -> f64 {
        let mut v = 0i64;
        for l in (0..LIMBS).rev() {
            v = v * 256 + xi.limb(k, l) as i64;
        }
        v as f64 * pow2 as f64
    }

    #[test]
    fn limbs_rebuild_x_within_the_bound() {
        let x: Vec<f32> = (0..64)
            .map(|i| ((i as f32) - 31.5) * 0.37 + if i % 3 == 0 { 1e-3 } else { 0.0 })
            .collect();
        let xi = XInt::new(&x, 32);
        for (g, form) in xi.forms.iter().enumerate() {
            let GroupForm::Int { pow2, init } = *form else {
                panic!("group {g} should be integer: {form:?}");
            };
            let mut sums = [0i32; LIMBS];
            for (k, &xk) in x.iter().enumerate().skip(g * 32).take(32) {
                let got = value(&xi, k, pow2);
                let want = xk as f64;
                assert!(
                    (got - want).abs() <= want.abs() * 2f64.powi(-18),
                    "{got} vs {want}"
                );
                for (l, s) in sums.iter_mut().enumerate() {
                    *s += xi.limb(k, l) as i32;
                }
            }
            assert_eq!(init, sums.map(|s| -8 * s));
        }
    }

    #[test]
    fn exact_within_six_binades() {
        let x: Vec<f32> = (0..8).map(|i| 1.2345678 * 2f32.powi(-(i % 7))).collect();
        let xi = XInt::new(&x, 8);
        let GroupForm::Int { pow2, .. } = xi.forms[0] else {
            panic!("integer form expected");
        };
        for (k, &v) in x.iter().enumerate() {
            assert_eq!(value(&xi, k, pow2), v as f64);
        }
    }

    #[test]
    fn forms_of_special_groups() {
        // One group of 8: the given values, then zeros.
        let f = |head: &[f32]| {
            let mut x = [0.0f32; 8];
            x[..head.len()].copy_from_slice(head);
            XInt::new(&x, 8).forms
        };
        assert_eq!(f(&[0.0, -0.0]), vec![GroupForm::Zero]);
        assert_eq!(f(&[1.0, f32::NAN]), vec![GroupForm::Float]);
        assert_eq!(f(&[1.0, f32::INFINITY]), vec![GroupForm::Float]);
        // A nonzero element below 2^-12 of the maximum: f32 path.
        assert_eq!(f(&[1.0, 1e-4]), vec![GroupForm::Float]);
        assert!(matches!(f(&[1.0, 1e-3])[0], GroupForm::Int { .. }));
        // Subnormal and extreme exponents: f32 path.
        assert_eq!(f(&[1e-40]), vec![GroupForm::Float]);
        assert_eq!(f(&[1e-30]), vec![GroupForm::Float]);
        assert_eq!(f(&[3e38]), vec![GroupForm::Float]);
        assert!(matches!(f(&[1e30])[0], GroupForm::Int { .. }));
        // Groups of 2, 4 or 12 rows cannot feed the eight-row kernel steps.
        let g = |x: &[f32], gs| XInt::new(x, gs).forms;
        assert_eq!(g(&[1.0, 2.0], 2), vec![GroupForm::Float]);
        assert_eq!(g(&[1.0; 4], 4), vec![GroupForm::Float]);
        assert_eq!(g(&[1.0; 12], 12), vec![GroupForm::Float]);
        assert_eq!(g(&vec![1.0; 8192], 8192), vec![GroupForm::Float]);
        assert!(matches!(
            g(&vec![1.0; 4096], 4096)[0],
            GroupForm::Int { .. }
        ));
    }

    #[test]
    fn largest_values_fit_four_limbs() {
        // Just below the next power of two: x_int just below 2^30.
        let x = [
            f32::from_bits(0x3FFF_FFFF),
            -f32::from_bits(0x3FFF_FFFF),
            1.0,
            -1.0,
            0.0,
            0.5,
            -0.25,
            f32::from_bits(0x3FFF_FFFF),
        ];
        let xi = XInt::new(&x, 8);
        let GroupForm::Int { pow2, .. } = xi.forms[0] else {
            panic!("integer form expected");
        };
        for (k, &v) in x.iter().enumerate() {
            assert_eq!(value(&xi, k, pow2), v as f64);
        }
    }
}
