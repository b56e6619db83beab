//! The int8-activation path (`a8.rs`): every level bit for bit its scalar
//! twin, the twin within the activation-rounding bound of the float64 dot
//! of the dequantized row, the activation codes by their formula, and bad
//! inputs.

use super::*;
use crate::format::{GgufBlocks, GgufWeight, WeightFormat};
use crate::ggml::a8::dot_row_a8_scalar;

/// Every kernel this machine can run (the scalar twin first).
fn a8_levels() -> Vec<A8Dots> {
    available_levels().into_iter().map(A8Dots::at).collect()
}

/// `blocks` random blocks of `T` and `x` for them: mixed magnitudes per
/// block (one block all zero, one tiny, one large) so that the per-block
/// scales differ.
fn row_and_x<T: GgmlType>(blocks: usize, seed: u64) -> (Vec<u8>, Vec<f32>) {
    let row: Vec<u8> = (0..blocks)
        .flat_map(|b| random_block::<T>(seed * 100 + b as u64))
        .collect();
    let mut x: Vec<f32> = rand_vec(blocks * T::ELEMS, seed + 7)
        .iter()
        .map(|v| 2.0 * v - 1.0)
        .collect();
    for (b, xb) in x.chunks_exact_mut(T::ELEMS).enumerate() {
        let f = [1.0, 0.0, 1e-3, 300.0][b % 4];
        xb.iter_mut().for_each(|v| *v *= f);
    }
    (row, x)
}

/// Levels equal to the scalar twin bit for bit on 1..=9 blocks (the
/// legacy bodies take four blocks per step, then a tail).
fn check_levels<T: GgmlType>() {
    for blocks in 1..=9 {
        let (row, x) = row_and_x::<T>(blocks, blocks as u64);
        // Six rows of activations: one pass of four, then two alone.
        let n = x.len();
        let x6: Vec<f32> = (0..6)
            .flat_map(|r| x.iter().map(move |v| v * (1.0 - 0.3 * r as f32)))
            .collect();
        let xq = Xq::quantize::<T>(&x6, 6, n).unwrap();
        let want: Vec<f32> = (0..6)
            .map(|r| dot_row_a8_scalar::<T>(&row, xq.row(r)))
            .collect();
        assert!(want.iter().all(|v| v.is_finite()), "{}: {want:?}", T::NAME);
        for dots in a8_levels() {
            let mut got = vec![0f32; 6];
            dot_row_a8::<T>(dots, &row, &xq, &mut got);
            for (g, w) in got.iter().zip(&want) {
                assert_eq!(
                    g.to_bits(),
                    w.to_bits(),
                    "{} {dots:?} {blocks} blocks: {got:?} vs {want:?}",
                    T::NAME
                );
            }
        }
    }
}

/// The twin against the float64 dot of the dequantized row:
/// `|y - w . x| <= sum_blocks dx / 2 * sum_i |w_i|` (each activation is
/// within half a step of its code) plus float32 rounding: per block at
/// most four roundings of its terms (`d * dx`, int to float, the product,
/// the sum with the minimum's term), the weight's own float32 rounding,
/// and `blocks / 4 + 2` additions of the accumulators, each relative to
/// `sum_i (|a_j q_i| + |c_j|) (|x_i| + dx / 2)`.
fn check_bound<T: GgmlType>() {
    let blocks = 9;
    let (row, x) = row_and_x::<T>(blocks, 40);
    let xq = Xq::quantize::<T>(&x, 1, x.len()).unwrap();
    let got = f64::from(dot_row_a8_scalar::<T>(&row, xq.row(0)));
    let (mut exact, mut quant, mut mag) = (0f64, 0f64, 0f64);
    let mut w = vec![0f32; T::ELEMS];
    let mut q: Codes = [0; MAX_BLOCK_ELEMS];
    for (bi, (b, xb)) in row
        .chunks_exact(T::BYTES)
        .zip(x.chunks_exact(T::ELEMS))
        .enumerate()
    {
        T::dequantize_block(b, &mut w);
        T::codes(b, &mut q);
        let (a, c) = T::factors(b);
        let dx = f64::from(xq.row(0).d[bi]);
        for i in 0..T::ELEMS {
            let j = i / T::SUB;
            exact += f64::from(w[i]) * f64::from(xb[i]);
            quant += dx / 2.0 * f64::from(w[i]).abs();
            mag += (f64::from(a[j] * f32::from(q[i])).abs() + f64::from(c[j]).abs())
                * (f64::from(xb[i]).abs() + dx / 2.0);
        }
    }
    let rounding = (blocks + 8) as f64 * f64::from(f32::EPSILON) * mag;
    assert!(
        (got - exact).abs() <= quant + rounding,
        "{}: {got} vs {exact} (bound {quant} + {rounding})",
        T::NAME
    );
    // The bound is not vacuous: the activation error is most of it.
    assert!(quant > 10.0 * rounding, "{}", T::NAME);
}

#[test]
fn a8_levels_equal_the_scalar_twin_bit_for_bit() {
    each_type!(check_levels);
}

#[test]
fn a8_dot_is_within_the_activation_rounding_bound() {
    each_type!(check_bound);
}

#[test]
fn activation_codes_round_half_even_per_block() {
    // Block 0: absmax 127 -> d = 1, halves round to even; block 1 zero;
    // block 2 subnormal scale -> stored as zero.
    let mut x = vec![0f32; 96];
    x[..5].copy_from_slice(&[127.0, 0.5, 1.5, -2.5, -127.0]);
    x[64] = 1e-40;
    let xq = Xq::quantize::<Q4_0>(&x, 1, 96).unwrap();
    let r = xq.row(0);
    assert_eq!(&r.q[..5], &[127, 0, 2, -2, -127]);
    assert_eq!(r.d, &[1.0, 0.0, 0.0]);
    assert!(r.q[32..].iter().all(|&v| v == 0));
    assert_eq!(r.sums, &[0, 0, 0]);
    let xq = Xq::quantize::<Q6K>(&[3.0; 256], 1, 256).unwrap();
    assert_eq!(xq.row(0).sums, &[16 * 127; 16]);
}

#[test]
fn a8_matmul_rejects_non_finite_x_and_bad_lengths() {
    let data: Vec<u8> = (0..2).flat_map(random_block::<Q4K>).collect();
    let w = GgufWeight::<Q4K>::new(data, 2, 256).unwrap();
    let mut y = vec![7f32; 2];
    let mut x = vec![0.5f32; 256];
    x[3] = f32::NAN;
    let e = GgufBlocks::<Q4K>::matmul_int8_activations(&w, &x, 1, &mut y).unwrap_err();
    assert!(e.to_string().contains("x: non-finite"), "{e}");
    assert!(GgufBlocks::<Q4K>::matmul_int8_activations(&w, &x[..255], 1, &mut y).is_err());
    assert_eq!(y, [7.0, 7.0]);
}

#[test]
fn a8_matmul_batches_equal_their_rows() {
    let data: Vec<u8> = (0..12).flat_map(random_block::<Q5_1>).collect();
    let w = GgufWeight::<Q5_1>::new(data, 3, 128).unwrap();
    let x: Vec<f32> = rand_vec(5 * 128, 3).iter().map(|v| v - 0.5).collect();
    let mut y = vec![0f32; 5 * 3];
    GgufBlocks::<Q5_1>::matmul_int8_activations(&w, &x, 5, &mut y).unwrap();
    for b in 0..5 {
        let mut yb = vec![0f32; 3];
        let xb = &x[b * 128..(b + 1) * 128];
        GgufBlocks::<Q5_1>::matmul_int8_activations(&w, xb, 1, &mut yb).unwrap();
        assert_eq!(&y[b * 3..(b + 1) * 3], &yb[..]);
    }
}

/// `n` rows of `blocks` blocks of `T`: random blocks, except that row 0
/// walks its code bytes through every byte value (every code and high-bit
/// pattern of the legacy types) and one block of row 1 has zero halves.
fn weight_rows<T: GgmlType>(n: usize, blocks: usize, seed: u64) -> Vec<u8> {
    let mut data: Vec<u8> = (0..n * blocks)
        .flat_map(|i| random_block::<T>(seed * 1000 + i as u64))
        .collect();
    let mut v = 0u8;
    for b in data[..blocks * T::BYTES].chunks_exact_mut(T::BYTES) {
        for (o, byte) in b.iter_mut().enumerate() {
            if !T::HALF_SCALES.iter().any(|&h| o == h || o == h + 1) {
                *byte = v;
                v = v.wrapping_add(1);
            }
        }
    }
    if n > 1 {
        let b = &mut data[(blocks + blocks / 2) * T::BYTES..][..T::BYTES];
        for &h in T::HALF_SCALES {
            b[h..h + 2].copy_from_slice(&[0, 0x80]); // -0.0
        }
    }
    data
}

/// Every level's [`dot_row_a8`] of the weight `rows` (`stride` bytes each)
/// with every activation row of `xq` equals the scalar twin, bit for bit.
fn assert_levels_equal_scalar<T: GgmlType>(rows: &[u8], stride: usize, xq: &Xq, case: &str) {
    let batch = xq.q.len() / xq.in_feat;
    let want: Vec<f32> = rows
        .chunks_exact(stride)
        .flat_map(|w| (0..batch).map(|b| dot_row_a8_scalar::<T>(w, xq.row(b))))
        .collect();
    for dots in a8_levels() {
        let mut got = vec![f32::NAN; want.len()];
        dot_row_a8::<T>(dots, rows, xq, &mut got);
        let same = got
            .iter()
            .zip(&want)
            .all(|(g, w)| g.to_bits() == w.to_bits());
        assert!(same, "{} {dots:?} {case}: {got:?} vs {want:?}", T::NAME);
    }
}

/// Every level's [`dot_row_a8`] over windows of weight rows (1-11 rows
/// from an offset: the eight-row passes and their tails) and batches 1-17
/// equals the scalar twin per weight row and activation row, bit for bit.
fn check_weight_row_windows<T: GgmlType>() {
    for blocks in [1, 2, 3, 5, 8] {
        let stride = blocks * T::BYTES;
        let data = weight_rows::<T>(13, blocks, blocks as u64);
        let inf = blocks * T::ELEMS;
        let (_, x) = row_and_x::<T>(blocks * 17, 9);
        let x: Vec<f32> = x.chunks_exact(inf).flat_map(|c| c.to_vec()).collect();
        for batch in 1..=17 {
            let xq = Xq::quantize::<T>(&x[..batch * inf], batch, inf).unwrap();
            for (r0, n) in crate::testutil::ROW_WINDOWS {
                let rows = &data[r0 * stride..(r0 + n) * stride];
                let case = format!("{blocks} blocks, rows {r0}+{n}, batch {batch}");
                assert_levels_equal_scalar::<T>(rows, stride, &xq, &case);
            }
        }
    }
}

#[test]
fn a8_weight_row_windows_equal_the_scalar_twin_bit_for_bit() {
    each_type!(check_weight_row_windows);
}

/// The unsigned code forms the AVX2 legacy body feeds to `vpmaddubsw`:
/// `q + bias` in `0..=31` for every code of every block, and Q8_0 (full
/// signed bytes) without one.
#[cfg(target_arch = "x86_64")]
#[test]
fn legacy_code_bias_makes_the_codes_unsigned() {
    use crate::ggml::a8_legacy_x86::code_bias;
    fn check<T: GgmlType>(want: Option<i8>) {
        assert_eq!(code_bias(T::GGML_TYPE), want, "{}", T::NAME);
        let Some(bias) = want else { return };
        let data = weight_rows::<T>(2, 16, 5);
        let mut q: Codes = [0; MAX_BLOCK_ELEMS];
        let mut seen = [false; 32];
        for b in data.chunks_exact(T::BYTES) {
            T::codes(b, &mut q);
            for &c in &q[..32] {
                let u = i16::from(c) + i16::from(bias);
                assert!((0..=31).contains(&u), "{}: {c} + {bias}", T::NAME);
                seen[u as usize] = true;
            }
        }
        let top = if T::NAME.starts_with("q4") { 16 } else { 32 };
        assert!(seen[..top].iter().all(|&s| s), "{}: {seen:?}", T::NAME);
    }
    check::<Q4_0>(Some(8));
    check::<Q4_1>(Some(0));
    check::<Q5_0>(Some(16));
    check::<Q5_1>(Some(0));
    check::<Q8_0>(None);
    check::<Q4K>(None);
}

/// The activation codes equal the textbook formula (`round_ties_even` of
/// the true quotient, clamped) on every level, including ties, values a
/// hair from the clamp and zero / subnormal blocks.
#[test]
fn activation_codes_equal_round_ties_even_of_the_quotient() {
    let mut x: Vec<f32> = rand_vec(32 * 64, 11).iter().map(|v| v * 300.0).collect();
    // Ties: block 1 scaled so that d = 1 and codes sit on halves.
    for (i, v) in x[32..64].iter_mut().enumerate() {
        *v = (i as f32 - 16.0) + 0.5;
    }
    x[63] = 127.0;
    x[64..96].fill(0.0);
    x[96..128].fill(1e-39);
    let xq = Xq::quantize::<Q4_0>(&x, 1, x.len()).unwrap();
    let r = xq.row(0);
    for (b, xb) in x.chunks_exact(32).enumerate() {
        let amax = xb.iter().fold(0f32, |m, v| m.max(v.abs()));
        let s = amax / 127.0;
        for (i, &v) in xb.iter().enumerate() {
            let want = if s < f32::MIN_POSITIVE {
                0
            } else {
                (v / s).round_ties_even().clamp(-127.0, 127.0) as i8
            };
            assert_eq!(r.q[b * 32 + i], want, "block {b} elem {i}: {v} / {s}");
        }
    }
    assert_eq!(&r.q[32..36], &[-16, -14, -14, -12]);
    // The portable twin (the body compiled without AVX2) gives the same.
    let (mut q, mut d) = (vec![0i8; x.len()], vec![0f32; x.len() / 32]);
    crate::ggml::xq::quantize_blocks(&x, 32, &mut q, &mut d);
    assert_eq!((&q[..], &d[..]), (r.q, r.d));
}

/// The integer bounds of the AVX2 bodies (int16 sums of `vpmaddubsw`
/// results, the Q6_K offset correction): rows whose code and scale bytes
/// are all one extreme pattern (`0x00`, `0xFF`, `0x80`, `0x7F`, `0x88`,
/// `0x77`: the largest and smallest codes, 6-bit scales and minimums of 63,
/// Q6_K scales of -128 and 127) against activations whose codes are all
/// `+-127` with one sign, alternating, or by sub-block, eleven weight rows
/// (a pass of eight and a tail), batches 1-17 (passes of eight, four and
/// one activation rows; for Q4_K / Q5_K one pass of sixteen and a tail):
/// every level equals the scalar twin bit for bit.
fn check_extreme_codes<T: GgmlType>() {
    const PATTERNS: [u8; 6] = [0x00, 0xFF, 0x80, 0x7F, 0x88, 0x77];
    let blocks = 5;
    let stride = blocks * T::BYTES;
    let mut data = vec![0u8; 11 * stride];
    for (w, row) in data.chunks_exact_mut(stride).enumerate() {
        for b in row.chunks_exact_mut(T::BYTES) {
            b.fill(PATTERNS[w % PATTERNS.len()]);
            for &h in T::HALF_SCALES {
                b[h..h + 2].copy_from_slice(&0x3C00u16.to_le_bytes()); // 1.0
            }
        }
    }
    let inf = blocks * T::ELEMS;
    let signs: [fn(usize) -> f32; 4] = [
        |_| 1.0,
        |_| -1.0,
        |i| if i % 2 == 0 { 1.0 } else { -1.0 },
        |i| if (i / 16) % 2 == 0 { -1.0 } else { 1.0 },
    ];
    for batch in 1..=17 {
        let x: Vec<f32> = (0..batch * inf)
            .map(|i| signs[(i / inf) % signs.len()](i % inf))
            .collect();
        let xq = Xq::quantize::<T>(&x, batch, inf).unwrap();
        assert!(xq.q.iter().all(|&v| v.abs() == 127));
        assert_levels_equal_scalar::<T>(&data, stride, &xq, &format!("batch {batch}"));
    }
}

#[test]
fn a8_extreme_codes_and_activations_equal_the_scalar_twin() {
    each_type!(check_extreme_codes);
}

/// The unsigned operand bounds behind `a8_legacy_x86::int16_terms`: the
/// sums of that many `vpmaddubsw` results stay within int16 for the
/// largest codes (15, 31, `|q| = 128`) and activations (`127`).
#[cfg(target_arch = "x86_64")]
#[test]
fn legacy_int16_terms_stay_within_int16() {
    use crate::ggml::a8_legacy_x86::int16_terms;
    for (ty, top, want) in [(2, 15, 8), (3, 15, 8), (6, 31, 4), (7, 31, 4), (8, 128, 1)] {
        let n = int16_terms(ty);
        assert_eq!(n, want, "type {ty}");
        assert!(n * 2 * top * 127 <= 32767 && 8 % n == 0, "type {ty}");
    }
}

/// Q6_K's offset form: every 6-bit field `0..=63` is `q + 32` of its code,
/// and every field occurs.
#[cfg(target_arch = "x86_64")]
#[test]
fn kquant_code_bias_makes_q6_k_codes_unsigned() {
    use crate::ggml::a8_kquant_x86::kquant_code_bias;
    assert_eq!(kquant_code_bias(Q6K::GGML_TYPE), Some(32));
    assert_eq!(kquant_code_bias(Q4K::GGML_TYPE), None);
    assert_eq!(kquant_code_bias(Q5K::GGML_TYPE), None);
    // Blocks of low-nibble bytes `v` (every value) and high-bit bytes
    // whose four bit pairs are all `h` (`0x00`, `0x55`, `0xAA`, `0xFF`):
    // the 6-bit fields cover `0..=63`.
    let mut q: Codes = [0; MAX_BLOCK_ELEMS];
    let mut seen = [false; 64];
    for (v, h) in (0..=255u8).flat_map(|v| [0x00u8, 0x55, 0xAA, 0xFF].map(|h| (v, h))) {
        let mut b = [v; Q6K::BYTES];
        b[128..192].fill(h);
        Q6K::codes(&b, &mut q);
        for &c in &q[..] {
            let u = i16::from(c) + 32;
            assert!((0..=63).contains(&u), "{c}");
            seen[u as usize] = true;
        }
    }
    assert!(seen.iter().all(|&s| s), "{seen:?}");
}

/// The bounds behind `a8_kquant_lanes_x86::lanes_int16_terms`: that many
/// `vpmaddubsw` results of the largest codes (15 for Q4_K, 31 for Q5_K)
/// and activations (`127`) stay within int16, and they split a
/// sub-block's eight evenly; the other types have no such body.
#[cfg(target_arch = "x86_64")]
#[test]
fn kquant_lanes_int16_terms_stay_within_int16() {
    use crate::ggml::a8_kquant_lanes_x86::{lanes_int16_terms, lanes_layout};
    for (ty, top, want) in [(Q4K::GGML_TYPE, 15, 8), (Q5K::GGML_TYPE, 31, 4)] {
        let n = lanes_int16_terms(ty);
        assert_eq!(n, want, "type {ty}");
        assert!(n * 2 * top * 127 <= 32767 && 8 % n == 0, "type {ty}");
        assert!(lanes_layout(ty).is_some(), "type {ty}");
    }
    assert!(lanes_layout(Q6K::GGML_TYPE).is_none());
    assert!(lanes_layout(Q8_0::GGML_TYPE).is_none());
}
