//! The scalar twins of the linear layers' dot-product kernels (each with
//! four partial sums like the SIMD ones). A leaf: no `unsafe`.

use crate::fp8::{decode_table, Fp8Format};

/// Scalar f32 dot product (the reference; 4 partial sums like the SIMD ones).
pub(crate) fn dot_f32_scalar(a: &[f32], b: &[f32]) -> f32 {
    let mut s = [0f32; 4];
    let n = a.len() / 4 * 4;
    for i in (0..n).step_by(4) {
        for l in 0..4 {
            s[l] = a[i + l].mul_add(b[i + l], s[l]);
        }
    }
    let mut t = (s[0] + s[1]) + (s[2] + s[3]);
    for i in n..a.len() {
        t = a[i].mul_add(b[i], t);
    }
    t
}

/// `part[i][j] = xs[i] . ws[j]` over equal-length slices.
pub(crate) fn dot4x4_scalar(xs: &[&[f32]; 4], ws: &[&[f32]; 4], part: &mut [[f32; 4]; 4]) {
    for i in 0..4 {
        for j in 0..4 {
            part[i][j] = dot_f32_scalar(xs[i], ws[j]);
        }
    }
}

/// Scalar E4M3 dot product (table decode).
pub(crate) fn dot_e4m3_scalar(codes: &[u8], x: &[f32]) -> f32 {
    let t = decode_table(Fp8Format::E4M3);
    let mut s = [0f32; 4];
    let n = codes.len() / 4 * 4;
    for i in (0..n).step_by(4) {
        for l in 0..4 {
            s[l] = t[codes[i + l] as usize].mul_add(x[i + l], s[l]);
        }
    }
    let mut r = (s[0] + s[1]) + (s[2] + s[3]);
    for i in n..codes.len() {
        r = t[codes[i] as usize].mul_add(x[i], r);
    }
    r
}

/// Scalar int8 dot product.
pub(crate) fn dot_i8_scalar(q: &[i8], x: &[f32]) -> f32 {
    let mut s = [0f32; 4];
    let n = q.len() / 4 * 4;
    for i in (0..n).step_by(4) {
        for l in 0..4 {
            s[l] = (q[i + l] as f32).mul_add(x[i + l], s[l]);
        }
    }
    let mut r = (s[0] + s[1]) + (s[2] + s[3]);
    for i in n..q.len() {
        r = (q[i] as f32).mul_add(x[i], r);
    }
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scalar_dots_by_hand() {
        let x = [1.0f32, -2.0, 0.5, 4.0, 3.0];
        assert_eq!(
            dot_f32_scalar(&x, &[2.0, 1.0, 4.0, 0.25, -1.0]),
            2.0 - 2.0 + 2.0 + 1.0 - 3.0
        );
        // E4M3 codes: 0x38 = 1.0, 0xC0 = -2.0, 0x30 = 0.5, 0x48 = 4.0, 0x00 = 0.
        let c = [0x38u8, 0xC0, 0x30, 0x48, 0x00];
        assert_eq!(dot_e4m3_scalar(&c, &x), 1.0 + 4.0 + 0.25 + 16.0);
        assert_eq!(dot_i8_scalar(&[1, -1, 2, 0, -3], &x), 1.0 + 2.0 + 1.0 - 9.0);
        let rows: [&[f32]; 4] = [&x, &x, &x, &x];
        let mut part = [[0f32; 4]; 4];
        dot4x4_scalar(&rows, &rows, &mut part);
        assert!(part.iter().flatten().all(|&p| p == dot_f32_scalar(&x, &x)));
    }
}
