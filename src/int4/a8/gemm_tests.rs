//! Tests of the int8-activation blocked GEMM: its micro-kernels against the
//! scalar twin bit for bit (odd shapes, several blocks of groups, rows and
//! columns that do not start at 0), the driver's choice at large batch, and
//! determinism.

use super::super::*;
use super::gemm;
use super::micro::{self, Micro};
use super::scalar::{cols_scalar, A8Args};
use super::tests::levels;
use super::xq8::Xq8;
use crate::simd::{Avx2, Avx512Vnni, SimdLevel};
use crate::testutil::{on_one_thread, rand_vec};

/// Bits of `y`, for equality that tells -0 from 0 and shows NaN.
pub(super) fn bits(y: &[f32]) -> Vec<u32> {
    y.iter().map(|v| v.to_bits()).collect()
}

/// Asserts that `run` writes the scalar twin's bits for the rows `rows`
/// of `args`' `x` and its columns from `o0` (given as `cols` takes them).
pub(super) fn assert_twin_bits(
    args: &A8Args,
    rows: std::ops::Range<usize>,
    o0: usize,
    run: impl FnOnce(&mut [&mut [f32]]),
    what: &str,
) {
    let width = args.out_feat - o0;
    let mut want = vec![f32::NAN; rows.len() * width];
    let mut ys: Vec<&mut [f32]> = want.chunks_exact_mut(width).collect();
    cols_scalar(args, rows.clone(), o0, &mut ys);
    let mut got = vec![f32::NAN; rows.len() * width];
    let mut ys: Vec<&mut [f32]> = got.chunks_exact_mut(width).collect();
    run(&mut ys);
    assert_eq!(bits(&got), bits(&want), "{what}");
}

/// Every micro-kernel this CPU may run.
fn micros() -> Vec<Micro> {
    let mut m = Vec::new();
    if let Some(t) = Avx2::new() {
        m.push(Micro::Avx2(t));
    }
    if let Some(t) = Avx512Vnni::new() {
        m.push(Micro::Vnni(t));
    }
    m
}

/// (in_feat, out_feat, group_size): tails short of a panel (n % 32),
/// padded inputs, several blocks of groups (in_feat above 512 rows), and
/// every group size the GEMM takes that matters (4 .. 128, 40).
const SHAPES: [(usize, usize, usize); 8] = [
    (64, 32, 16),
    (100, 70, 32),
    (1100, 70, 32),
    (256, 96, 64),
    (520, 45, 128),
    (40, 33, 4),
    (96, 64, 8),
    (700, 64, 40),
];

#[test]
fn micro_kernels_match_the_scalar_twin_bit_for_bit() {
    let ms = micros();
    if ms.is_empty() {
        return;
    }
    for (s, &(k, n, gs)) in SHAPES.iter().enumerate() {
        let qw =
            QuantizedWeight::quantize_grouped(&rand_vec(k * n, 40 + s as u64), k, n, gs).unwrap();
        let batch = 37;
        let x = rand_vec(batch * k, 50 + s as u64);
        let xq = Xq8::quantize(&x, batch, k, qw.in_padded(), gs, None).unwrap();
        let args = qw.a8_args(&xq);
        // Rows 3 .. 37 (34 rows: passes of 4 and a pass of 2), columns from
        // 1 (no panel is aligned to the matrix).
        let (rows, o0) = (3..batch, 1);
        for &m in &ms {
            let run = |ys: &mut [&mut [f32]]| gemm::cols(m, &args, rows.clone(), o0, ys);
            assert_twin_bits(
                &args,
                rows.clone(),
                o0,
                run,
                &format!("{m:?} [{k}x{n}] gs {gs}"),
            );
        }
    }
}

#[test]
fn large_batches_match_the_scalar_twin_at_every_level() {
    // Through the public entry point, so the driver's choice is covered:
    // the GEMM from 5 rows where the group size allows (every shape
    // here but the last two), the per-row kernels otherwise.
    let mut shapes = SHAPES.to_vec();
    shapes.extend([(36, 40, 6), (20, 21, 2)]);
    for (s, &(k, n, gs)) in shapes.iter().enumerate() {
        assert_eq!(micro::eligible(gs), gs % 4 == 0, "gs {gs}");
        let qw = QuantizedWeight::quantize_grouped(&rand_vec(k * n, s as u64), k, n, gs).unwrap();
        for batch in [4, 5, 17, 33, 128, 130] {
            let x = rand_vec(batch * k, 200 + s as u64);
            let mut want = vec![f32::NAN; batch * n];
            qw.view()
                .matmul_a8_with(&x, batch, &mut want, SimdLevel::Scalar)
                .unwrap();
            for level in levels() {
                let mut y = vec![f32::NAN; batch * n];
                qw.view().matmul_a8_with(&x, batch, &mut y, level).unwrap();
                let what = format!("{} [{k}x{n}] gs {gs} b {batch}", level.name());
                assert_eq!(bits(&y), bits(&want), "{what}");
            }
        }
    }
}

#[test]
fn the_gemm_runs_only_where_its_token_and_group_size_allow() {
    assert!(Micro::at(SimdLevel::Scalar, 32).is_none());
    for gs in [2, 6, 10] {
        for level in levels() {
            assert!(Micro::at(level, gs).is_none(), "gs {gs}");
        }
    }
    let top = Micro::at(simd::level(), 32);
    match simd::level() {
        SimdLevel::Avx512 if Avx512Vnni::new().is_some() => {
            assert!(matches!(top, Some(Micro::Vnni(_))))
        }
        SimdLevel::Avx2 | SimdLevel::Avx512 => assert!(matches!(top, Some(Micro::Avx2(_)))),
        _ => assert!(top.is_none()),
    }
    if Avx2::new().is_some() {
        assert!(matches!(
            Micro::at(SimdLevel::Avx2, 32),
            Some(Micro::Avx2(_))
        ));
    }
}

#[test]
fn large_batches_do_not_depend_on_the_thread_count() {
    // Above PAR_MIN_WEIGHTS: pieces of 64 rows times column chunks.
    let (k, n) = (1024, 1000);
    let qw = QuantizedWeight::try_quantize(&rand_vec(k * n, 9), k, n).unwrap();
    for batch in [33, 130] {
        let x = rand_vec(batch * k, 10 + batch as u64);
        assert_pool_one_thread_and_twin_agree(&qw, &x, batch, &format!("b {batch}"));
    }
}

/// The int8-activation product of `batch` rows of `x` on the pool, on one
/// thread and by the scalar twin: the same bits.
fn assert_pool_one_thread_and_twin_agree(
    qw: &QuantizedWeight,
    x: &[f32],
    batch: usize,
    what: &str,
) {
    let n = qw.out_feat();
    let mut y = vec![f32::NAN; batch * n];
    qw.view()
        .matmul_act(x, batch, &mut y, Activations::Int8)
        .unwrap();
    let mut y1 = vec![f32::NAN; batch * n];
    on_one_thread(|| qw.view().matmul_act(x, batch, &mut y1, Activations::Int8)).unwrap();
    assert_eq!(bits(&y), bits(&y1), "{what}: one thread vs the pool");
    let mut ys = vec![f32::NAN; batch * n];
    qw.view()
        .matmul_a8_with(x, batch, &mut ys, SimdLevel::Scalar)
        .unwrap();
    assert_eq!(bits(&y), bits(&ys), "{what}: vs the scalar twin");
}

#[test]
fn narrow_layers_split_the_batch_and_match_the_twin_on_any_thread_count() {
    // Few panels (7, the last 8 columns wide; 2, the last 13): the grid splits the
    // batch into blocks of whole micro-kernel passes from 192 rows.
    for (k, n, batch) in [(576, 200, 301), (512, 45, 193)] {
        assert!(
            gemm::task_grid(n, batch).row_tasks > 1,
            "[{k}x{n}] b {batch}"
        );
        let qw = QuantizedWeight::try_quantize(&rand_vec(k * n, 70), k, n).unwrap();
        let x = rand_vec(batch * k, 71);
        assert_pool_one_thread_and_twin_agree(&qw, &x, batch, &format!("[{k}x{n}] b {batch}"));
    }
}

#[test]
fn the_per_row_kernel_still_matches_on_many_rows() {
    // The driver sends 5 rows or more to the GEMM, so the AVX2 per-row
    // kernel's many-row path (decoded batches shared by passes of 4) is
    // reached only directly: keep it checked.
    let Some(t) = Avx2::new() else { return };
    let (k, n, gs) = (256, 100, 32);
    let qw = QuantizedWeight::quantize_grouped(&rand_vec(k * n, 60), k, n, gs).unwrap();
    let batch = 23;
    let x = rand_vec(batch * k, 61);
    let xq = Xq8::quantize(&x, batch, k, qw.in_padded(), gs, None).unwrap();
    let args = qw.a8_args(&xq);
    let (rows, o0) = (2..batch, 3);
    // SAFETY: the token proves AVX2; the kernel checks every size.
    let run = |ys: &mut [&mut [f32]]| unsafe { super::avx2::cols(t, &args, rows.clone(), o0, ys) };
    assert_twin_bits(&args, rows.clone(), o0, run, "per-row kernel");
}
