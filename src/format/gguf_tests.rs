//! The GGUF block formats as weights: the forward against a float64
//! product of the dequantized weight, each SIMD level's row dot against
//! the scalar one, the layer blob, and the errors of bad blocks.

use super::*;
use std::sync::atomic::AtomicUsize;
use std::sync::Arc;

use crate::ggml::quantize::QuantizeRow;
use crate::ggml::{Q4K, Q4_0, Q4_1, Q5K, Q5_0, Q5_1, Q6K, Q8_0};
use crate::linear::{Device, IsqType, QuantMethod, UnquantLinear};
use crate::simd::available_levels;
use crate::testutil::rand_vec;

/// |y - ref| <= in * eps_f32 * sum |w x| + |bias| eps: the f32 rounding of
/// a sum of `in` products (any order), each exact in f64.
fn check_forward<T: QuantizeRow>() {
    let (out, inf) = (7usize, 2 * 256usize);
    let w = rand_vec(out * inf, 11);
    let q = GgufBlocks::<T>::quantize(&w, out, inf, ()).unwrap();
    let deq = GgufBlocks::<T>::dequantize(&q);
    let bias = rand_vec(out, 12);
    for rows in [1usize, 5, 40] {
        let x = rand_vec(rows * inf, 13 + rows as u64);
        let mut y = vec![0f32; rows * out];
        GgufBlocks::<T>::matmul(&q, &x, rows, Some(&bias), &mut y).unwrap();
        for b in 0..rows {
            for o in 0..out {
                let (mut exact, mut mag) = (bias[o] as f64, bias[o].abs() as f64);
                for i in 0..inf {
                    let p = deq[o * inf + i] as f64 * x[b * inf + i] as f64;
                    exact += p;
                    mag += p.abs();
                }
                let bound = (inf + 1) as f64 * f32::EPSILON as f64 * mag;
                let got = y[b * out + o] as f64;
                assert!(
                    (got - exact).abs() <= bound,
                    "{} rows {rows} [{b}, {o}]",
                    T::NAME
                );
            }
        }
    }
    // Every SIMD level's row dot is the scalar one within the same bound.
    let rows = BlockRows::<T> {
        data: q.bytes(),
        row_bytes: inf / T::ELEMS * T::BYTES,
        dots: Dots::current(),
        kind: PhantomData,
    };
    let x = rand_vec(inf, 17);
    for level in available_levels() {
        let dots = Dots::at(level).unwrap();
        for o in 0..out {
            let got = rows.dot(dots, o, &x);
            let want = rows.dot(Dots::Scalar, o, &x);
            let mag: f64 = (0..inf)
                .map(|i| (deq[o * inf + i] * x[i]).abs() as f64)
                .sum();
            let bound = 2.0 * inf as f64 * f32::EPSILON as f64 * mag;
            assert!(
                ((got - want) as f64).abs() <= bound,
                "{} {level:?} row {o}",
                T::NAME
            );
        }
    }
    // decode of an unaligned column range is the dequantized slice.
    let mut part = vec![0f32; 100];
    rows.decode(3, 37, &mut part);
    assert_eq!(part, deq[3 * inf + 37..3 * inf + 137]);
}

fn check_blob_and_errors<T: QuantizeRow>() {
    let (out, inf) = (3usize, 256usize);
    let q = GgufBlocks::<T>::quantize(&rand_vec(out * inf, 3), out, inf, ()).unwrap();
    let mut wr = Writer::new(GgufBlocks::<T>::INFO.serde_tag, 0);
    GgufBlocks::<T>::write_blob(&q, &mut wr);
    let blob = wr.finish();
    let mut r = Reader::new(
        &blob,
        GgufBlocks::<T>::INFO.serde_tag,
        super::super::FormatId::serde_name_of,
    )
    .unwrap();
    let parts = GgufBlocks::<T>::read_blob(&mut r).unwrap();
    let back = GgufBlocks::<T>::from_blob(parts).unwrap();
    assert_eq!(
        (back.bytes(), GgufBlocks::<T>::shape(&back)),
        (q.bytes(), [out, inf])
    );

    let bytes = q.bytes().to_vec();
    let short = bytes[..bytes.len() - 1].to_vec();
    assert!(matches!(
        GgufWeight::<T>::new(short, out, inf),
        Err(QuantError::DimensionMismatch { .. })
    ));
    assert!(GgufWeight::<T>::new(bytes.clone(), out, inf + 1).is_err());
    assert!(GgufWeight::<T>::new(bytes.clone(), 0, inf).is_err());
    // A NaN half scale in row 2, block 0 is named.
    let mut bad = bytes;
    let o = 2 * (inf / T::ELEMS) * T::BYTES + T::HALF_SCALES[0];
    bad[o..o + 2].copy_from_slice(&0x7E00u16.to_le_bytes());
    let err = GgufWeight::<T>::new(bad, out, inf).unwrap_err().to_string();
    assert!(err.contains("row 2 block 0"), "{err}");
}

/// The registry's quantizer (`WeightFormat::quantize`, and `apply_isq` by
/// the type's name, which calls it) writes ggml's bytes: those of
/// `crate::ggml::quantize::quantize_matrix` without an importance matrix
/// (itself checked against gguf-py and llama.cpp's formulas in its tests).
/// Rows of different magnitudes and a constant row, where a min / max
/// rounded to half first (the old round to nearest) moves codes.
fn check_registry_quantize_is_ggml_s<T: QuantizeRow>() {
    let (out, inf) = (6usize, 512usize);
    let mut w = rand_vec(out * inf, 31);
    for (r, row) in w.chunks_mut(inf).enumerate() {
        let mag = [1e-3f32, 0.37, 3.0, 41.0, 1.0, 1.0][r];
        row.iter_mut()
            .for_each(|v| *v = *v * mag + if r == 4 { 0.3 } else { 0.0 });
    }
    w[5 * inf..].fill(-0.7);
    let want = quantize_matrix::<T>(&w, out, inf, None).unwrap();
    let q = GgufBlocks::<T>::quantize(&w, out, inf, ()).unwrap();
    assert!(
        q.bytes() == want.as_slice(),
        "{}: WeightFormat::quantize",
        T::NAME
    );

    let src = UnquantLinear::new(w, out, inf, None).unwrap();
    let target = IsqType::parse(T::NAME, 32).unwrap();
    let n = AtomicUsize::new(0);
    let layer = Arc::new(src)
        .apply_isq(Some(target), Device::Cpu, &n, None)
        .unwrap();
    let deq = GgufBlocks::<T>::dequantize(&GgufWeight::<T>::new(want, out, inf).unwrap());
    let got = layer.dequantize_w_vec().unwrap();
    assert!(
        got.iter()
            .map(|v| v.to_bits())
            .eq(deq.iter().map(|v| v.to_bits())),
        "{}: apply_isq",
        T::NAME
    );
}

/// The borrowed forward is the owned one bit for bit, and refuses every
/// wrong length (bytes, x / y, bias) with an error, never a panic.
fn check_borrowed<T: QuantizeRow>() {
    let (out, inf, rows) = (5usize, 256usize, 3usize);
    let q = GgufBlocks::<T>::quantize(&rand_vec(out * inf, 21), out, inf, ()).unwrap();
    let (x, bias) = (rand_vec(rows * inf, 22), rand_vec(out, 23));
    let mut want = vec![0f32; rows * out];
    GgufBlocks::<T>::matmul(&q, &x, rows, Some(&bias), &mut want).unwrap();
    let mut y = vec![0f32; rows * out];
    matmul_blocks::<T>(q.bytes(), [out, inf], &x, rows, Some(&bias), &mut y).unwrap();
    assert_eq!(y, want);
    let short = &q.bytes()[..q.bytes().len() - 1];
    assert!(matmul_blocks::<T>(short, [out, inf], &x, rows, None, &mut y).is_err());
    assert!(matmul_blocks::<T>(q.bytes(), [out, inf], &x[1..], rows, None, &mut y).is_err());
    assert!(matmul_blocks::<T>(q.bytes(), [out, inf], &x, rows, Some(&bias[1..]), &mut y).is_err());
    assert!(matmul_blocks::<T>(q.bytes(), [out, inf + 1], &x, rows, None, &mut y).is_err());
}

macro_rules! per_type {
    ($($t:ty),*) => {
        #[test]
        fn forward_matches_float64_and_scalar_at_every_level() {
            $(check_forward::<$t>();)*
        }
        #[test]
        fn blobs_round_trip_and_bad_blocks_are_refused() {
            $(check_blob_and_errors::<$t>();)*
        }
        #[test]
        fn registry_quantize_gives_ggml_quantizer_bytes() {
            $(check_registry_quantize_is_ggml_s::<$t>();)*
        }
        #[test]
        fn borrowed_forward_is_the_owned_one() {
            $(check_borrowed::<$t>();)*
        }
    };
}
per_type!(Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4K, Q5K, Q6K);

#[test]
fn bits_per_weight_are_ggml_s() {
    assert_eq!(
        GgufBlocks::<Q8_0>::block((), 32).unwrap().bits_per_weight(),
        8.5
    );
    assert_eq!(
        GgufBlocks::<Q4_0>::block((), 32).unwrap().bits_per_weight(),
        4.5
    );
    assert_eq!(
        GgufBlocks::<Q4_1>::block((), 32).unwrap().bits_per_weight(),
        5.0
    );
    assert_eq!(
        GgufBlocks::<Q5_0>::block((), 32).unwrap().bits_per_weight(),
        5.5
    );
    assert_eq!(
        GgufBlocks::<Q5_1>::block((), 32).unwrap().bits_per_weight(),
        6.0
    );
    assert_eq!(
        GgufBlocks::<Q4K>::block((), 256).unwrap().bits_per_weight(),
        4.5
    );
    assert_eq!(
        GgufBlocks::<Q5K>::block((), 256).unwrap().bits_per_weight(),
        5.5
    );
    assert_eq!(
        GgufBlocks::<Q6K>::block((), 256).unwrap().bits_per_weight(),
        6.5625
    );
}
