//! Tests of the int8-activation GEMM on the AMX tile unit: the scalar
//! twin's bits on edge shapes (rows short of a 16-row tile, one tile of a
//! pair, columns short of a panel and not starting at 0, padded inputs,
//! 32- and 64-deep tile steps, several blocks of groups) and through the
//! driver at the batches it takes.

use super::super::*;
use super::amx;
use super::gemm_tests::{assert_twin_bits, bits};
use super::xq8::Xq8;
use crate::linear::tiles::AmxInt8;
use crate::simd::SimdLevel;
use crate::testutil::rand_vec;

/// (in_feat, out_feat, group_size): SmolLM2's 576 inputs at g32 and g128
/// (padded to 640), a 64-deep step (g64), a 32-deep one that is not a
/// whole 64 (g96), several blocks of groups (1100 inputs at g32), columns
/// short of a panel.
const SHAPES: [(usize, usize, usize); 6] = [
    (576, 64, 32),
    (576, 70, 128),
    (256, 96, 64),
    (300, 45, 96),
    (1100, 100, 32),
    (64, 33, 32),
];

#[test]
fn tiles_match_the_scalar_twin_bit_for_bit() {
    let Some(tok) = AmxInt8::new() else {
        eprintln!("skipped: no AMX-INT8 here");
        return;
    };
    for (s, &(k, n, gs)) in SHAPES.iter().enumerate() {
        let qw =
            QuantizedWeight::quantize_grouped(&rand_vec(k * n, 70 + s as u64), k, n, gs).unwrap();
        let batch = 53;
        let x: Vec<f32> = rand_vec(batch * k, 80 + s as u64)
            .iter()
            .map(|v| 8.0 * v - 4.0)
            .collect();
        let xq = Xq8::quantize(&x, batch, k, qw.in_padded(), gs, None).unwrap();
        let args = qw.a8_args(&xq);
        // 1 to 50 rows from row 3: one short tile, a pair, a pair and a
        // short tile; columns from 1 (no panel aligned to the matrix).
        for rows in [3..4, 3..19, 3..35, 3..53] {
            let run = |ys: &mut [&mut [f32]]| amx::cols(tok, &args, rows.clone(), 1, ys);
            let what = format!("[{k}x{n}] gs {gs} rows {rows:?}");
            assert_twin_bits(&args, rows.clone(), 1, run, &what);
        }
    }
}

#[test]
fn the_driver_takes_the_tiles_from_min_batch_with_the_same_bits() {
    for (s, &(k, n, gs)) in SHAPES.iter().enumerate() {
        assert!(amx::eligible(gs));
        let qw = QuantizedWeight::quantize_grouped(&rand_vec(k * n, s as u64), k, n, gs).unwrap();
        for batch in [amx::MIN_BATCH, 17, 130, 300] {
            let x = rand_vec(batch * k, 90 + s as u64);
            let mut want = vec![f32::NAN; batch * n];
            qw.view()
                .matmul_a8_with(&x, batch, &mut want, SimdLevel::Scalar)
                .unwrap();
            let mut y = vec![f32::NAN; batch * n];
            qw.view()
                .matmul_act(&x, batch, &mut y, Activations::Int8)
                .unwrap();
            assert_eq!(bits(&y), bits(&want), "[{k}x{n}] gs {gs} b {batch}");
        }
    }
    for gs in [4, 16, 40] {
        assert!(!amx::eligible(gs), "gs {gs}");
    }
    for (gs, chosen) in [(32, false), (96, false), (64, true), (128, true)] {
        assert_eq!(amx::chosen(gs), chosen, "gs {gs}");
    }
}
