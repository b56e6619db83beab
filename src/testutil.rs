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
pub(crate) fn rand_vec(n: usize, seed: u64) -> Vec<f32> {
    let mut r = Xorshift::new(seed);
    (0..n).map(|_| r.next_f32()).collect()
}

/// `n` uniform f32 in [-scale, scale) from `seed`.
pub(crate) fn xorshift_f32(seed: u64, n: usize, scale: f32) -> Vec<f32> {
    let mut r = Xorshift::new(seed);
    (0..n).map(|_| r.next_f32() * scale).collect()
}
