use super::*;
use crate::int4_asym::{AsymMethod, AsymWeight};
use crate::linear::fp8_dialect::f16_to_f32;
use crate::testutil::{xorshift_f32, Xorshift};

fn random(n: usize, seed: u64) -> Vec<f32> {
    let mut rng = Xorshift::new(seed);
    (0..n)
        .map(|i| {
            // Groups of both signs of min: shift every third 32-run.
            let shift = if (i / 32) % 3 == 0 { 0.7 } else { -0.2 };
            rng.next_f32() + shift
        })
        .collect()
}

/// Random valid parts: every code, every 6-bit pattern, halves of both signs.
fn random_parts(out_feat: usize, in_feat: usize, seed: u64) -> KWeight {
    let mut rng = Xorshift::new(seed);
    let groups = in_feat / GROUP;
    let nsb = in_feat / super_block(in_feat);
    let codes: Vec<u8> = (0..out_feat * in_feat).map(|i| (i % 16) as u8).collect();
    let sc: Vec<u8> = (0..out_feat * groups).map(|i| (i * 7 % 64) as u8).collect();
    let mn: Vec<u8> = (0..out_feat * groups)
        .map(|i| (i * 13 % 64) as u8)
        .collect();
    let supers = (0..out_feat * nsb * 2)
        .map(|_| crate::ggml::f32_to_f16(2.0 * rng.next_f32() - 1.0))
        .collect();
    KWeight::from_codes(&codes, &sc, &mn, supers, out_feat, in_feat).unwrap()
}

#[test]
fn decode_is_q4_k_arithmetic_written_out() {
    for (o, i) in [(3, 96), (2, 512), (1, 32)] {
        let w = random_parts(o, i, 5);
        let deq = w.dequantize();
        let sb = super_block(i);
        for r in 0..o {
            let q = w.unpacked_row(r);
            let (sc, mn) = w.unpacked_scale_codes(r);
            for k in 0..i {
                let (g, s) = (k / 32, k / sb);
                let big_d = f16_to_f32(w.supers()[r * 2 * (i / sb) + 2 * s]);
                let big_m = f16_to_f32(w.supers()[r * 2 * (i / sb) + 2 * s + 1]);
                let want = (big_d * sc[g] as f32) * q[k] as f32 - big_m * mn[g] as f32;
                assert_eq!(deq[r * i + k].to_bits(), want.to_bits(), "[{r}, {k}]");
            }
        }
        // The packed scale codes read back as written.
        let groups = i / 32;
        let (sc, mn) = w.unpacked_scale_codes(o - 1);
        let base = (o - 1) * groups;
        assert!((0..groups).all(|g| sc[g] as usize == (base + g) * 7 % 64));
        assert!((0..groups).all(|g| mn[g] as usize == (base + g) * 13 % 64));
    }
}

#[test]
fn the_fused_dot_matches_float64_at_every_level() {
    use crate::linear::dispatch::Dots;
    // Five and six rows: the AVX2 multi-row kernel's passes of four and
    // its shorter last passes.
    for (o, i) in [(5, 96), (6, 512), (2, 576)] {
        let w = random_parts(o, i, 11);
        let x = random(i, 12);
        let deq = w.dequantize();
        for level in crate::simd::available_levels() {
            let dots = Dots::at(level).unwrap();
            let mut want = vec![(0f64, 0f64); o];
            for (r, wr) in want.iter_mut().enumerate() {
                let (sc, mn) = w.unpacked_scale_codes(r);
                let q = w.unpacked_row(r);
                let sb = super_block(i);
                let (mut exact, mut mag) = (0f64, 0f64);
                for k in 0..i {
                    let s = r * 2 * (i / sb) + 2 * (k / sb);
                    let d = f16_to_f32(w.supers()[s]) as f64 * sc[k / 32] as f64;
                    let m = f16_to_f32(w.supers()[s + 1]) as f64 * mn[k / 32] as f64;
                    exact += deq[r * i + k] as f64 * x[k] as f64;
                    mag += ((d * q[k] as f64).abs() + m.abs()) * (x[k] as f64).abs();
                }
                let bound = (i + 3) as f64 * f32::EPSILON as f64 * mag;
                *wr = (exact, bound);
                let got = w.dot_row(dots, r, &x) as f64;
                assert!(
                    (got - exact).abs() <= bound,
                    "{level:?} {i} row {r}: {got} vs {exact}"
                );
                let scalar = w.dot_row(Dots::Scalar, r, &x) as f64;
                assert!((got - scalar).abs() <= 2.0 * bound, "{level:?} vs scalar");
            }
            for r0 in [0, 1] {
                let mut out = vec![0f32; o - r0];
                w.dot_rows(dots, r0, &x, &mut out);
                for (r, &got) in (r0..).zip(&out) {
                    let (exact, bound) = want[r];
                    let err = (got as f64 - exact).abs();
                    assert!(err <= bound, "{level:?} {i} dot_rows from {r0}, row {r}");
                }
            }
        }
    }
}

#[test]
fn search_is_never_worse_than_rtn_per_row() {
    let mut rng = Xorshift::new(3);
    for (o, i) in [(8, 96), (4, 512), (4, 576)] {
        let w = random(o * i, 40 + i as u64);
        let imp: Vec<f32> = (0..i).map(|_| 2.0 * rng.next_f32().abs() + 0.01).collect();
        for imp in [None, Some(&imp[..])] {
            let a = KWeight::quantize(&w, o, i, KMethod::Rtn, imp).unwrap();
            let b = KWeight::quantize(&w, o, i, KMethod::Search, imp).unwrap();
            let (mut ta, mut tb) = (0.0, 0.0);
            for r in 0..o {
                let x = &w[r * i..(r + 1) * i];
                let (ea, eb) = (row_error(&a, r, x, imp), row_error(&b, r, x, imp));
                assert!(eb <= ea, "{i} row {r}: search {eb} > rtn {ea}");
                ta += ea;
                tb += eb;
            }
            assert!(tb < 0.9 * ta, "search {tb} vs rtn {ta}");
        }
    }
}

#[test]
fn quantize_error_is_within_half_a_step_plus_code_rounding() {
    let (o, i) = (4, 512);
    let w = random(o * i, 77);
    let a = KWeight::quantize(&w, o, i, KMethod::Rtn, None).unwrap();
    let deq = a.dequantize();
    // Ranges ~1, 15 steps, and a 6-bit step code off by up to half a unit
    // of D over 15 codes: well under 0.1.
    let err = w
        .iter()
        .zip(&deq)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0, f32::max);
    assert!(err < 0.1, "{err}");
    assert_eq!(a.nbytes(), o * (i / 2 + 3 * 16 / 2 + 2 * 2 * 2));
}

#[test]
fn constant_rows_and_zero_rows() {
    let mut w = vec![0f32; 2 * 64];
    w[64..].fill(-0.5);
    let a = KWeight::quantize(&w, 2, 64, KMethod::Search, None).unwrap();
    let deq = a.dequantize();
    assert!(deq[..64].iter().all(|&v| v == 0.0));
    assert!(
        deq[64..].iter().all(|&v| (v + 0.5).abs() < 1e-3),
        "{:?}",
        &deq[64..68]
    );
}

#[test]
fn bad_inputs_are_errors() {
    let w = vec![0.5f32; 64];
    let e = KWeight::quantize(&w[..48], 1, 48, KMethod::Rtn, None).unwrap_err();
    assert!(e.to_string().contains("multiple of 32"), "{e}");
    let mut big = w.clone();
    big[3] = 1e9;
    let e = KWeight::quantize(&big, 1, 64, KMethod::Rtn, None).unwrap_err();
    assert!(e.to_string().contains("w[0, 3] is 1000000000.0"), "{e}");
    assert!(e.to_string().contains("|w| <= 65504"), "{e}");
    let mut nan = w.clone();
    nan[5] = f32::NAN;
    let e = KWeight::quantize(&nan, 1, 64, KMethod::Rtn, None).unwrap_err();
    assert!(e.to_string().contains("w[0, 5] is NaN"), "{e}");
    let e = KWeight::quantize(&w, 1, 64, KMethod::Search, Some(&[1.0; 3])).unwrap_err();
    assert!(e.to_string().contains("importance"), "{e}");
    let e = KWeight::new(vec![0; 32], vec![0; 3], vec![0, 0x7C00], 1, 64).unwrap_err();
    assert!(e.to_string().contains("row 0 super-block 0 Dmin"), "{e}");
    let e = KWeight::new(vec![0; 48], vec![0, 0, 0, 0, 0x10], vec![0, 0], 1, 96).unwrap_err();
    assert!(e.to_string().contains("padding nibble"), "{e}");
    let e = KWeight::from_codes(&[0; 64], &[64, 0], &[0, 0], vec![0, 0], 1, 64).unwrap_err();
    assert!(e.to_string().contains("sc[0, 0] is 64"), "{e}");
}

/// The AVX2 + F16C unpack of the `(d, -m)` pairs is the scalar `row_dm`
/// bit for bit: every 6-bit scale and minimum at every group position,
/// halves of both signs (zero, subnormals, the largest), 1 to 4 super-blocks
/// of 256, and rows whose super-block is the whole row (eight groups at a
/// time, then the last groups from a padded copy or, with bytes after the
/// row's codes, in place).
#[cfg(target_arch = "x86_64")]
#[test]
fn vector_row_dm_is_the_scalar_one() {
    let Some(t) = crate::simd::Avx2::new().and_then(|a| a.f16c()) else {
        return;
    };
    let halves: [u16; 12] = [
        0x0000, 0x8000, 0x0001, 0x8001, 0x03FF, 0x83FF, 0x3C00, 0xBC00, 0x7BFF, 0xFBFF, 0x2E66,
        0xA0A3,
    ];
    for (in_feat, rows) in [
        (256, 64),
        (512, 32),
        (1024, 16),
        (96, 4),
        (576, 64),
        (1056, 64),
        (256 + 32, 4),
    ] {
        let groups = in_feat / GROUP;
        let gps = super_block(in_feat) / GROUP;
        let nsb = groups / gps;
        for r in 0..rows {
            // Group `g` of row `r`: scale `r + 3g`, minimum `5r + g + 1` (mod
            // 64): 64 rows of 8 groups hold every value at every position.
            let sc: Vec<u8> = (0..groups).map(|g| ((r + 3 * g) % 64) as u8).collect();
            let mn: Vec<u8> = (0..groups).map(|g| ((5 * r + g + 1) % 64) as u8).collect();
            let mut packed = vec![0u8; scale_code_bytes(groups)];
            pack_scale_codes(&sc, &mn, &mut packed);
            let supers: Vec<u16> = (0..2 * nsb).map(|i| halves[(r + 5 * i) % 12]).collect();
            let (mut want, mut got) = (vec![0f32; 2 * groups], vec![f32::NAN; 2 * groups]);
            row_dm(&packed, &supers, gps, &mut want);
            row_dm_avx2::row_dm_f16c(t, &packed, &supers, gps, &mut got);
            for (g, (w, v)) in want.iter().zip(&got).enumerate() {
                assert_eq!(w.to_bits(), v.to_bits(), "in {in_feat}, row {r}, slot {g}");
            }
            // The codes followed by other bytes (the next rows' codes, as
            // the weight passes them): a whole row's last groups unpack in
            // place, the bytes after them read and dropped.
            for fill in [0x00u8, 0xFF, 0x5A] {
                let mut ahead = packed.clone();
                ahead.extend(std::iter::repeat_n(fill, 1 + r % 16));
                let mut got = vec![f32::NAN; 2 * groups];
                row_dm_avx2::row_dm_f16c(t, &ahead, &supers, gps, &mut got);
                let same = want
                    .iter()
                    .zip(&got)
                    .all(|(w, v)| w.to_bits() == v.to_bits());
                assert!(same, "in {in_feat}, row {r}, {} bytes after", 1 + r % 16);
            }
            // And the scalar pairs are the format's `(D sc, -(Dmin mn))`.
            for g in 0..groups {
                let s = g / gps;
                let d = f16_to_f32(supers[2 * s]) * f32::from(sc[g]);
                let m = -(f16_to_f32(supers[2 * s + 1]) * f32::from(mn[g]));
                assert_eq!(
                    (want[2 * g].to_bits(), want[2 * g + 1].to_bits()),
                    (d.to_bits(), m.to_bits())
                );
            }
        }
    }
}

/// Every decode body (AVX2 where this CPU has it) gives the scalar
/// reference's floats bit for bit (`(D sc) q - Dmin mn` written out):
/// every code and 6-bit pattern, halves of both signs (zero, subnormal, the
/// largest finite), super-blocks of 256 and whole rows (96, 576, 1056
/// inputs), spans cut mid-run.
#[test]
fn every_decode_body_is_the_scalar_one_bit_for_bit() {
    let halves: [u16; 10] = [
        0x0000, 0x8000, 0x0001, 0x83FF, 0x3C00, 0xBC00, 0x7BFF, 0xFBFF, 0x2E66, 0xA0A3,
    ];
    for (out_feat, in_feat) in [(3, 32), (2, 96), (4, 512), (5, 576), (2, 1056)] {
        let groups = in_feat / GROUP;
        let nsb = in_feat / super_block(in_feat);
        let codes: Vec<u8> = (0..out_feat * in_feat)
            .map(|i| ((i * 5 + i / 16) % 16) as u8)
            .collect();
        let sc: Vec<u8> = (0..out_feat * groups).map(|i| (i * 7 % 64) as u8).collect();
        let mn: Vec<u8> = (0..out_feat * groups)
            .map(|i| (i * 13 % 64) as u8)
            .collect();
        let supers = (0..out_feat * nsb * 2)
            .map(|i| halves[(i * 3 + 1) % 10])
            .collect();
        let w = KWeight::from_codes(&codes, &sc, &mn, supers, out_feat, in_feat).unwrap();
        let gps = super_block(in_feat) / GROUP;
        for r in 0..out_feat {
            for (k0, n) in crate::int4_asym::tests::decode_spans(in_feat) {
                let mut want = vec![f32::NAN; n];
                w.decode_by(Decoder::Scalar, r, k0, &mut want);
                for (j, v) in want.iter().enumerate() {
                    let (k, g) = (k0 + j, (k0 + j) / GROUP);
                    let h = &w.supers()[(r * nsb + g / gps) * 2..];
                    let d = f16_to_f32(h[0]) * f32::from(sc[r * groups + g]);
                    let m = f16_to_f32(h[1]) * f32::from(mn[r * groups + g]);
                    let e = d * f32::from(codes[r * in_feat + k]) - m;
                    assert_eq!(v.to_bits(), e.to_bits(), "[{r}, {k}]");
                }
                let what = format!("[{out_feat}x{in_feat}] r{r} {k0}+{n}");
                Decoder::assert_all_give(&want, |dec, got| w.decode_by(dec, r, k0, got), &what);
            }
        }
    }
}

/// Both nibble-group quantizers name the first bad value of the lowest
/// bad row (`w[r, c]`, with the half bound) on any number of threads,
/// bad values in later rows notwithstanding, and take the largest half.
#[test]
fn quantizers_name_the_lowest_bad_row_on_any_thread_count() {
    let (rows, cols) = (192, 256);
    let mut w = xorshift_f32(11, rows * cols, 1.0);
    w[2 * cols + 5] = 65504.0;
    w[3 * cols + 6] = -65504.0;
    assert!(AsymWeight::quantize(&w, rows, cols, 32, AsymMethod::Rtn, None).is_ok());
    assert!(KWeight::quantize(&w, rows, cols, KMethod::Rtn, None).is_ok());
    w[191 * cols + 9] = f32::NAN;
    w[150 * cols + 70] = f32::INFINITY;
    w[150 * cols + 71] = f32::NAN;
    w[170 * cols] = -65520.0;
    for threads in [1, 2, 4, 8] {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .unwrap();
        let errors = pool.install(|| {
            [
                AsymWeight::quantize(&w, rows, cols, 32, AsymMethod::Search, None).unwrap_err(),
                KWeight::quantize(&w, rows, cols, KMethod::Search, None).unwrap_err(),
            ]
        });
        for e in errors {
            let msg = e.to_string();
            assert!(msg.contains("w[150, 70] is inf"), "{threads}: {msg}");
            assert!(msg.contains("|w| <= 65504"), "{msg}");
        }
    }
}
