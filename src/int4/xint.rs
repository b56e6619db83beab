//! `x` in the integer form the AVX-512 VNNI matvec multiplies.
//!
//! Per group of input rows, `x` is written as `x_int * 2^(E - 29)` with `E`
//! the exponent of the group's largest `|x|`, so `|x_int| < 2^30`, and
//! `x_int` is split into four signed bytes (balanced base 256:
//! `x_int = l0 + l1 2^8 + l2 2^16 + l3 2^24`, each limb in [-128, 127]).
//! The products `q * limb` and their sums are then exact in i32.
//!
//! Accuracy. An element whose exponent is within 6 of `E` is represented
//! exactly (its 24-bit significand fits in 30 bits); a smaller one is rounded
//! by at most `2^(E - 30)`. A group is only given this form when every
//! nonzero `|x| >= 2^(E - MAX_RANGE_LOG2)`, which bounds that rounding by
//! `2^-20` of the element: well inside the SPEC bound (`1e-5` of
//! `sum |x w|`). Groups that fail the test (or hold NaN/inf, subnormal or
//! extreme values) stay on the f32 path; all-zero groups are skipped.

/// Signed bytes each `x_int` is split into.
pub const LIMBS: usize = 4;
/// A group takes the integer form only if its smallest nonzero `|x|` is at
/// least `2^-MAX_RANGE_LOG2` of its largest (relative rounding <= 2^-20).
const MAX_RANGE_LOG2: i32 = 10;
/// `x_int = x * 2^(X_INT_BITS - 1 - E)`, so `|x_int| < 2^X_INT_BITS`.
const X_INT_BITS: i32 = 30;
/// Exponents outside this range keep the f32 path (so `2^(E - 29)` and the
/// scaled sums stay normal, finite f32).
const MIN_EXP: i32 = -96;
const MAX_EXP: i32 = 100;
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
    /// `limbs[l * in_padded + k]`: limb `l` of `x_int[k]`.
    pub limbs: Vec<i8>,
    pub in_padded: usize,
    pub forms: Vec<GroupForm>,
}

impl XInt {
    /// Split `x` (length a multiple of `group_size`) group by group. Groups
    /// whose size is not a multiple of 4 (the VNNI dot product sums four
    /// rows) or above `MAX_GROUP` all stay on the f32 path.
    pub fn new(x: &[f32], group_size: usize) -> XInt {
        debug_assert!(group_size > 0 && x.len().is_multiple_of(group_size));
        let in_padded = x.len();
        let mut limbs = vec![0i8; LIMBS * in_padded];
        let forms = x
            .chunks_exact(group_size)
            .enumerate()
            .map(|(g, xg)| {
                if !group_size.is_multiple_of(4) || group_size > MAX_GROUP {
                    return GroupForm::Float;
                }
                group_form(xg, g * group_size, in_padded, &mut limbs)
            })
            .collect();
        XInt {
            limbs,
            in_padded,
            forms,
        }
    }

    /// Limb `l` of the rows from `k0` on.
    pub fn limb(&self, l: usize, k0: usize) -> &[i8] {
        &self.limbs[l * self.in_padded + k0..(l + 1) * self.in_padded]
    }
}

/// Classify one group starting at row `k0` and, for the integer form,
/// write its limbs.
fn group_form(xg: &[f32], k0: usize, in_padded: usize, limbs: &mut [i8]) -> GroupForm {
    let mut max = 0.0f32;
    for &v in xg {
        if !v.is_finite() {
            return GroupForm::Float;
        }
        max = max.max(v.abs());
    }
    if max == 0.0 {
        return GroupForm::Zero;
    }
    let biased = ((max.to_bits() >> 23) & 0xFF) as i32;
    let e = biased - 127;
    // biased == 0 is a subnormal maximum: below MIN_EXP as well.
    if biased == 0 || !(MIN_EXP..=MAX_EXP).contains(&e) {
        return GroupForm::Float;
    }
    let floor = pow2_f32(e - MAX_RANGE_LOG2);
    if xg.iter().any(|&v| v != 0.0 && v.abs() < floor) {
        return GroupForm::Float;
    }
    let to_int = pow2_f64(X_INT_BITS - 1 - e);
    let mut sums = [0i32; LIMBS];
    for (i, &v) in xg.iter().enumerate() {
        // Exact in f64 (a power-of-two scaling), then one rounding.
        let mut rest = (v as f64 * to_int).round_ties_even() as i64;
        for (l, sum) in sums.iter_mut().enumerate() {
            // The low byte read as signed: the balanced base-256 digit.
            let limb = rest as i8;
            limbs[l * in_padded + k0 + i] = limb;
            *sum += limb as i32;
            rest = (rest - limb as i64) >> 8;
        }
        debug_assert_eq!(rest, 0, "x_int must fit four balanced limbs");
    }
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
            v = v * 256 + xi.limbs[l * xi.in_padded + k] as i64;
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
                    (got - want).abs() <= want.abs() * 2f64.powi(-20),
                    "{got} vs {want}"
                );
                for (l, s) in sums.iter_mut().enumerate() {
                    *s += xi.limbs[l * xi.in_padded + k] as i32;
                }
            }
            assert_eq!(init, sums.map(|s| -8 * s));
        }
    }

    #[test]
    fn exact_within_six_binades() {
        let x: Vec<f32> = (0..4).map(|i| 1.2345678 * 2f32.powi(-i)).collect();
        let xi = XInt::new(&x, 4);
        let GroupForm::Int { pow2, .. } = xi.forms[0] else {
            panic!("integer form expected");
        };
        for (k, &v) in x.iter().enumerate() {
            assert_eq!(value(&xi, k, pow2), v as f64);
        }
    }

    #[test]
    fn forms_of_special_groups() {
        let f = |x: &[f32], gs| XInt::new(x, gs).forms;
        assert_eq!(f(&[0.0, -0.0, 0.0, 0.0], 4), vec![GroupForm::Zero]);
        assert_eq!(f(&[1.0, f32::NAN, 0.0, 0.0], 4), vec![GroupForm::Float]);
        assert_eq!(
            f(&[1.0, f32::INFINITY, 0.0, 0.0], 4),
            vec![GroupForm::Float]
        );
        // A nonzero element below 2^-10 of the maximum: f32 path.
        assert_eq!(f(&[1.0, 1e-4, 0.0, 0.0], 4), vec![GroupForm::Float]);
        assert!(matches!(
            f(&[1.0, 1e-3, 0.0, 0.0], 4)[0],
            GroupForm::Int { .. }
        ));
        // Subnormal and extreme exponents: f32 path.
        assert_eq!(f(&[1e-40, 0.0, 0.0, 0.0], 4), vec![GroupForm::Float]);
        assert_eq!(f(&[1e-30, 0.0, 0.0, 0.0], 4), vec![GroupForm::Float]);
        assert_eq!(f(&[3e38, 0.0, 0.0, 0.0], 4), vec![GroupForm::Float]);
        assert!(matches!(
            f(&[1e30, 0.0, 0.0, 0.0], 4)[0],
            GroupForm::Int { .. }
        ));
        // Groups of 2 or 6 rows cannot feed a four-row dot product.
        assert_eq!(f(&[1.0, 2.0], 2), vec![GroupForm::Float]);
        assert_eq!(f(&[1.0; 6], 6), vec![GroupForm::Float]);
        assert_eq!(f(&vec![1.0; 8192], 8192), vec![GroupForm::Float]);
        assert!(matches!(
            f(&vec![1.0; 4096], 4096)[0],
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
        ];
        let xi = XInt::new(&x, 4);
        let GroupForm::Int { pow2, .. } = xi.forms[0] else {
            panic!("integer form expected");
        };
        for (k, &v) in x.iter().enumerate() {
            assert_eq!(value(&xi, k, pow2), v as f64);
        }
    }
}
