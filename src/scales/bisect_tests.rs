//! Tests of the branch-free code search (`bisect.rs`) against the guess-and-walk
//! reference of `scalar.rs`, in a file of their own so that `bisect` does not import
//! `scalar`, which uses it.

use super::bisect::*;
use super::scalar::{fill_table, search_from, table_with, ZERO_CODE};

fn table(max: f32, step: f32) -> [f32; 256] {
    let mut t = [0f32; 256];
    table_with(max, step, &mut t, fill_table);
    t
}

/// The walk's code from both ends (it does not depend on the guess).
fn walk(x: f32, t: &[f32; 256]) -> usize {
    let c = search_from(x, 0, t);
    assert_eq!(c, search_from(x, 254, t), "{x:e}");
    c
}

fn next_up(x: f32) -> f32 {
    f32::from_bits(x.to_bits() + 1)
}

fn next_down(x: f32) -> f32 {
    f32::from_bits(x.to_bits() - 1)
}

#[test]
fn every_code_and_both_sides_of_every_edge_match_the_walk() {
    let tables = [
        (1.0f32, -0.001f32),
        (3e-7, -0.37),
        (5e3, -1.0),    // the widest grid: 2^-254 of max, deep into subnormals
        (2.0, 0.0),     // one value: every entry ties
        (0.7, -1e-7),   // steps below an ulp: long runs of equal entries
        (1e-38, -0.01), // a subnormal tail
    ];
    for (max, step) in tables {
        let t = table(max, step);
        for c in 0..255 {
            let e = t[c];
            for x in [e, next_up(e), next_down(e), e * 0.999_9, e * 1.000_1] {
                if x > 0.0 && x <= max {
                    assert_eq!(code_of(x, &t), walk(x, &t), "{max} {step} c {c} x {x:e}");
                }
            }
        }
        // Below the grid: the last code; the smallest subnormal too.
        for x in [f32::from_bits(1), t[254] * 0.5, next_down(t[254])] {
            if x > 0.0 {
                assert_eq!(code_of(x, &t), 254, "{max} {step} {x:e}");
            }
        }
        assert_eq!(code_of(max, &t), walk(max, &t));
    }
}

#[test]
fn ties_take_the_last_equal_code() {
    // A flat table holds the maximum at every code: the largest, 254.
    let t = table(2.0, 0.0);
    assert_eq!(code_of(2.0, &t), 254);
    assert_eq!(code_of(1.0, &t), 254);
    // A run of equal entries: the last of the run.
    let mut t = [0f32; 256];
    for (c, v) in t.iter_mut().enumerate().take(255) {
        *v = 1.0 - (c / 10) as f32 * 0.01;
    }
    for c in 0..255 {
        assert_eq!(code_of(t[c], &t), (c / 10 * 10 + 9).min(254), "{c}");
    }
}

#[test]
fn zeros_and_decoded_scales() {
    let t = table(4.0, -0.05);
    let mut s = vec![0.0, 4.0, 1e-30, 0.3, 0.0, f32::from_bits(7)];
    let orig = s.clone();
    let mut codes = vec![0u8; s.len()];
    encode_all(&mut s, &mut codes, &t);
    for i in 0..s.len() {
        let want = if orig[i] == 0.0 {
            ZERO_CODE as usize
        } else {
            walk(orig[i], &t)
        };
        assert_eq!((codes[i] as usize, s[i]), (want, t[want]), "{i}");
    }
    assert_eq!((codes[0], s[0]), (ZERO_CODE, 0.0));
}
