//! The bodies of the AVX-512 row dot and of the AVX2 / AVX-512 block decode
//! of every block type, written once over the f32 register type `L`
//! (`crate::simd::F32Lanes`; the AVX2 row dot is `rows_avx2.rs`): the codes
//! of a block come from `GgmlType::codes_x86` into an int8 buffer of one
//! block (256 bytes, in L1), are widened to f32 lanes and multiply-added
//! with `x` per sub-block, then scaled by the sub-block's `a_j` (and its
//! `c_j` times `sum(x)` for the types with a minimum).

use super::{Codes, GgmlType, MAX_BLOCK_ELEMS};
use crate::simd::F32Lanes;

/// `row . x`: `row` whole blocks of `T`, `x` their `ELEMS` floats each.
/// Even and odd sub-blocks add into two accumulators (two FMA chains).
///
/// # Safety
/// The caller's target features cover `L` and AVX2 (`codes_x86`), and
/// `x.len() == row.len() / T::BYTES * T::ELEMS` (`fused::dot_row` checks).
#[inline(always)]
pub(super) unsafe fn dot_row_body<T: GgmlType, L: F32Lanes>(row: &[u8], x: &[f32]) -> f32 {
    let mut buf: Codes = [0; MAX_BLOCK_ELEMS];
    let subs = T::ELEMS / T::SUB;
    // SAFETY: block `k` reads `x[k * ELEMS..(k + 1) * ELEMS]`, inside `x` by
    // the length check; the codes pointer covers `ELEMS` bytes (codes_x86);
    // the features are the caller's.
    unsafe {
        // Accumulators in named registers (an array indexed by `j % 2`
        // would live on the stack).
        let (mut tq0, mut tq1, mut ts0, mut ts1) = (L::zero(), L::zero(), L::zero(), L::zero());
        for (k, b) in row.chunks_exact(T::BYTES).enumerate() {
            let q = T::codes_x86(b.as_ptr(), buf.as_mut_ptr());
            let (a, c) = T::factors(b);
            let xb = x.as_ptr().add(k * T::ELEMS);
            // Sub-block `j`: (sum q x, sum x) as lanes.
            let sub = |j: usize| {
                let (mut p, mut s) = (L::zero(), L::zero());
                for i in (j * T::SUB..(j + 1) * T::SUB).step_by(L::LANES) {
                    let xv = L::load(xb.add(i));
                    p = L::fmadd(L::load_i8(q.add(i)), xv, p);
                    if T::AFFINE {
                        s = s.add(xv);
                    }
                }
                (p, s)
            };
            let mut j = 0;
            while j < subs {
                let (p, s) = sub(j);
                tq0 = L::fmadd(L::splat(a[j]), p, tq0);
                if T::AFFINE {
                    ts0 = L::fmadd(L::splat(c[j]), s, ts0);
                }
                if j + 1 < subs {
                    let (p, s) = sub(j + 1);
                    tq1 = L::fmadd(L::splat(a[j + 1]), p, tq1);
                    if T::AFFINE {
                        ts1 = L::fmadd(L::splat(c[j + 1]), s, ts1);
                    }
                }
                j += 2;
            }
        }
        tq0.add(tq1).add(ts0.add(ts1)).hsum()
    }
}

/// Block `b` of `T` decoded into `out` (`ELEMS` floats): `a_j * q` then
/// `+ c_j`, two rounded operations as `T::dequantize_block`, so bit for bit
/// its value.
///
/// # Safety
/// As [`dot_row_body`]; `b.len() == T::BYTES`, `out.len() == T::ELEMS`.
#[inline(always)]
pub(super) unsafe fn decode_body<T: GgmlType, L: F32Lanes>(b: &[u8], out: &mut [f32]) {
    let mut buf: Codes = [0; MAX_BLOCK_ELEMS];
    // SAFETY: `out` holds `ELEMS` floats and the codes `ELEMS` bytes; the
    // features are the caller's.
    unsafe {
        let q = T::codes_x86(b.as_ptr(), buf.as_mut_ptr());
        let (a, c) = T::factors(b);
        let po = out.as_mut_ptr();
        for j in 0..T::ELEMS / T::SUB {
            let (av, cv) = (L::splat(a[j]), L::splat(c[j]));
            for i in (j * T::SUB..(j + 1) * T::SUB).step_by(L::LANES) {
                let w = L::load_i8(q.add(i)).mul(av);
                // No `+ 0.0` for the types without a minimum: it would turn
                // a -0.0 weight into +0.0.
                let w = if T::AFFINE { w.add(cv) } else { w };
                w.store(po.add(i));
            }
        }
    }
}
