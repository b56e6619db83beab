//! Helpers shared by the crate's unit tests: one deterministic generator.

/// Marsaglia's xorshift64 (shifts 13, 7, 17): reproducible test data
/// without an external crate.
pub(crate) struct Xorshift(u64);

impl Xorshift {
    /// A generator from a small seed (spread so that seeds 0, 1, 2 ... give
    /// unrelated streams).
    pub(crate) fn new(seed: u64) -> Self {
        Xorshift(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    /// A generator from a raw nonzero state.
    pub(crate) fn from_state(state: u64) -> Self {
        Xorshift(state)
    }

    /// The next 64 random bits.
    pub(crate) fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    /// A uniform f32 in [-1, 1) (24 random bits).
    pub(crate) fn next_f32(&mut self) -> f32 {
        ((self.next_u64() >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }
}

/// `n` uniform f32 in [-1, 1) from `seed`.
/// `(first row, rows)` windows for multi-row kernels: every count from 1 to 5, 7, 8 and
/// 11 (tails after full passes of 4), starting at offsets 0-2.
pub(crate) const ROW_WINDOWS: [(usize, usize); 8] = [
    (0, 1),
    (1, 2),
    (2, 3),
    (0, 4),
    (1, 5),
    (2, 7),
    (0, 8),
    (2, 11),
];

pub(crate) fn rand_vec(n: usize, seed: u64) -> Vec<f32> {
    let mut r = Xorshift::new(seed);
    (0..n).map(|_| r.next_f32()).collect()
}

/// `n` uniform f32 in [-scale, scale) from `seed`.
pub(crate) fn xorshift_f32(seed: u64, n: usize, scale: f32) -> Vec<f32> {
    let mut r = Xorshift::new(seed);
    (0..n).map(|_| r.next_f32() * scale).collect()
}

/// `f` run inside a rayon pool of one thread: the tests that compare a
/// parallel result with the one-thread result bit for bit.
pub(crate) fn on_one_thread<R: Send>(f: impl FnOnce() -> R + Send) -> R {
    rayon::ThreadPoolBuilder::new()
        .num_threads(1)
        .build()
        .expect("a one-thread rayon pool")
        .install(f)
}

/// Asserts `dx [rows, in_feat]` is `g [rows, out_feat] @ W` for `W[o][i] =
/// w(o, i)`, each element within the f32 summation bound
/// `out_feat * 2^-23 * sum_o |g w|` of the f64 product.
pub(crate) fn assert_transposed_product(
    g: &[f32],
    w: impl Fn(usize, usize) -> f32,
    dx: &[f32],
    rows: usize,
    out_feat: usize,
    in_feat: usize,
    what: &str,
) {
    for b in 0..rows {
        for i in 0..in_feat {
            let (mut r, mut mag) = (0f64, 0f64);
            for o in 0..out_feat {
                let t = g[b * out_feat + o] as f64 * w(o, i) as f64;
                r += t;
                mag += t.abs();
            }
            let err = (dx[b * in_feat + i] as f64 - r).abs();
            assert!(
                err <= out_feat as f64 * 2f64.powi(-23) * mag,
                "{what}: {err} at {b},{i}"
            );
        }
    }
}
