//! Counter-based randomness for stochastic rounding.
//!
//! A value is a pure function of `(seed, step, index)`, so a parallel loop
//! gets the same bits for element `i` whatever thread handles it and however
//! the work is split. The mixer is SplitMix64's finalizer (Steele, Lea &
//! Flood 2014, "Fast splittable pseudorandom number generators"; constants
//! from Vigna's `splitmix64.c`): the stream key is derived from seed and
//! step, and element `i` takes the `(i + 1)`-th SplitMix64 output of that key.

const GOLDEN: u64 = 0x9E37_79B9_7F4A_7C15;

/// SplitMix64's output function.
#[inline(always)]
pub fn mix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The key of one step's stream.
#[inline]
pub fn stream_key(seed: u64, step: u64) -> u64 {
    mix64(mix64(seed ^ GOLDEN).wrapping_add(step.wrapping_mul(GOLDEN)) ^ 0x5851_F42D_4C95_7F2D)
}

/// Uniform in `[0, 1)` with 53 random bits, for element `index` of a stream.
#[inline(always)]
pub fn uniform(key: u64, index: u64) -> f64 {
    let bits = mix64(key.wrapping_add(index.wrapping_add(1).wrapping_mul(GOLDEN)));
    (bits >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
}

/// A seedable generator: `(seed, counter)`. Each draw is `mix64` of the
/// next counter, so the state is two integers and serializes trivially.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CounterRng {
    /// The seed.
    pub seed: u64,
    /// Draws made so far.
    pub counter: u64,
}

impl CounterRng {
    /// A generator at counter 0.
    pub fn new(seed: u64) -> CounterRng {
        CounterRng { seed, counter: 0 }
    }

    /// A generator seeded from the OS-randomized hasher keys and the clock.
    pub fn from_entropy() -> CounterRng {
        use std::hash::{BuildHasher, Hasher};
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0);
        h.write_u64(now);
        CounterRng::new(h.finish())
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        let key = stream_key(self.seed, u64::MAX);
        self.counter = self.counter.wrapping_add(1);
        mix64(key.wrapping_add(self.counter.wrapping_mul(GOLDEN)))
    }

    /// Fill `out` with uniforms in `[0, 1)` and advance by one draw.
    pub fn fill_uniform(&mut self, out: &mut [f64]) {
        let key = self.next_u64();
        for (i, o) in out.iter_mut().enumerate() {
            *o = uniform(key, i as u64);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uniform_is_in_range_and_roughly_flat() {
        let key = stream_key(7, 3);
        let n = 100_000;
        let mut hist = [0usize; 10];
        for i in 0..n {
            let u = uniform(key, i);
            assert!((0.0..1.0).contains(&u));
            hist[(u * 10.0) as usize] += 1;
        }
        for h in hist {
            assert!((h as f64 - 10_000.0).abs() < 500.0, "{hist:?}");
        }
    }

    #[test]
    fn keys_differ_by_seed_and_step() {
        assert_ne!(stream_key(1, 0), stream_key(2, 0));
        assert_ne!(stream_key(1, 0), stream_key(1, 1));
        let mut a = CounterRng::new(5);
        let mut b = CounterRng::new(5);
        assert_eq!(a.next_u64(), b.next_u64());
        assert_ne!(a.next_u64(), CounterRng::new(5).next_u64());
    }
}
