//! The few vector operations the fused step needs, as a trait over one
//! register type ([`Lanes`]); `avx2.rs` implements it for `__m256` and
//! `avx512.rs` for `__m512`, and `kernel.rs` writes the step once over it
//! (the pattern of memchr's generic searchers). Every method is
//! `#[inline(always)]` in the implementations, so the generic body
//! compiles inside each `#[target_feature]` entry point to the same
//! instructions a hand-written twin would.
//!
//! Every method is `unsafe`: the CPU must support the implementation's
//! features (the entry points' `#[target_feature]` attributes), and the
//! pointer arguments must be valid for the bytes each method names.

#![cfg(target_arch = "x86_64")]

/// One SIMD register of `N` f32 lanes and its companions.
pub(super) trait Lanes: Copy {
    /// Lanes per register.
    const N: usize;
    /// `N` i32 lane indices (codes).
    type Idx: Copy;
    /// A 16-entry f32 table held in registers.
    type Table: Copy;
    /// The 16 midpoints of a code book laid out for [`Lanes::search16`].
    type Mids: Copy;
    /// The running "some lane was not finite" of [`Lanes::all_finite`].
    type Bad: Copy;

    unsafe fn splat(x: f32) -> Self;
    unsafe fn zero() -> Self;
    /// `N` f32 from `p` (unaligned).
    unsafe fn load(p: *const f32) -> Self;
    /// `N` f32 to `p` (unaligned).
    unsafe fn store(self, p: *mut f32);
    unsafe fn add(self, o: Self) -> Self;
    unsafe fn sub(self, o: Self) -> Self;
    unsafe fn mul(self, o: Self) -> Self;
    unsafe fn div(self, o: Self) -> Self;
    unsafe fn sqrt(self) -> Self;
    unsafe fn max(self, o: Self) -> Self;
    /// The sign bit cleared.
    unsafe fn abs(self) -> Self;
    /// The largest lane.
    unsafe fn hmax(self) -> f32;

    /// A 16-entry table (values or midpoints) in registers.
    unsafe fn table(t: &[f32; 16]) -> Self::Table;
    /// `t[idx]` lane-wise, `idx` in 0..16.
    unsafe fn lookup(t: Self::Table, idx: Self::Idx) -> Self;
    /// The midpoints `t` (+inf padded) for [`Lanes::search16`].
    unsafe fn mids(t: &[f32; 16]) -> Self::Mids;
    /// Lane-wise nearest code given the 16 midpoints (+inf padded): the
    /// branch-free four-step search of `Codebook16::encode`, the same
    /// compares.
    unsafe fn search16(mids: Self::Mids, x: Self) -> Self::Idx;
    /// Nearest codes on the uniform `{k/16 : k = 1..16}` map:
    /// `clamp(ceil(16x - 1.5), 0, 15)`. Equal to the midpoint search: the
    /// midpoints are `(2k + 3) / 32`, `16x` is exact, and `16x - 1.5` is
    /// exact whenever `16x >= 0.75` (and negative otherwise), so
    /// `x > mid_k` iff `k < 16x - 1.5`. Tested bit for bit against the
    /// scalar reference.
    unsafe fn search_uniform(x: Self) -> Self::Idx;
    /// `N / 2` bytes of packed nibbles at `p` -> `N` codes (element order).
    unsafe fn load_nibbles(p: *const u8) -> Self::Idx;
    /// `N` codes (< 16) -> `N / 2` bytes of packed nibbles at `p`.
    unsafe fn store_nibbles(idx: Self::Idx, p: *mut u8);
    /// Two registers of codes -> `N` bytes at `p` (one store where a
    /// narrow store per register is slow).
    #[inline(always)]
    unsafe fn store_nibbles2(a: Self::Idx, b: Self::Idx, p: *mut u8) {
        // SAFETY: the caller guarantees `N` writable bytes at `p`.
        unsafe {
            Self::store_nibbles(a, p);
            Self::store_nibbles(b, p.add(Self::N / 2));
        }
    }
    /// `t[codes[i]]` for the `N` byte codes at `codes` (a gather).
    unsafe fn gather256(t: &[f32; 256], codes: *const u8) -> Self;
    /// Lane-wise nearest code in a 256-entry midpoint table: the 8-step
    /// search of `Codebook256::encode` (gathers; indices stay in 0..=254).
    unsafe fn search256(mids: &[f32; 256], x: Self) -> Self::Idx;
    /// `N` codes (< 256) -> `N` bytes at `p`.
    unsafe fn store_bytes(idx: Self::Idx, p: *mut u8);

    /// No lane seen yet.
    unsafe fn no_bad() -> Self::Bad;
    /// `bad` plus the lanes of `x` that are NaN or infinite.
    unsafe fn add_bad(bad: Self::Bad, x: Self) -> Self::Bad;
    /// True when no lane was NaN or infinite.
    unsafe fn none_bad(bad: Self::Bad) -> bool;
}
