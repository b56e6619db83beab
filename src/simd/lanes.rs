//! One register of f32 lanes as a trait ([`F32Lanes`]), for kernel bodies
//! written once and compiled for AVX2 and AVX-512 (the pattern of memchr's
//! `Vector`): the linear kernels' dot products (`src/linear/dots.rs`,
//! `src/int4/strips.rs`) and the optimizer's fused step
//! (`src/optim/kernel.rs`: look-ups, nearest-code searches, nibble
//! packing, gathers). `lanes_avx2.rs` implements it for `__m256`,
//! `lanes_avx512.rs` for `__m512`.
//!
//! A kernel body generic over [`F32Lanes`] is `#[inline(always)]`; each
//! per-ISA file instantiates it inside its own `#[target_feature]` function,
//! which takes the proof token. Every method is `#[inline(always)]` in the
//! implementations, so in that function it becomes the instructions it
//! names (outside such a function it would not inline, so no such call is
//! written).
//!
//! Every method is `unsafe`: the CPU must have the implementing type's
//! instruction set (AVX2 + FMA for `__m256`, AVX-512 F/BW/VL for `__m512`),
//! and a pointer argument must be valid for the bytes each method names.

#![cfg(target_arch = "x86_64")]

/// One SIMD register of `LANES` f32 lanes and its companions.
pub(crate) trait F32Lanes: Copy {
    /// f32 lanes per register.
    const LANES: usize;
    /// `LANES` i32 lane indices (codes).
    type Idx: Copy;
    /// A 16-entry f32 table held in registers.
    type Table: Copy;
    /// The 16 midpoints of a code book laid out for [`F32Lanes::search16`].
    type Mids: Copy;
    /// The running "some lane was not finite" of [`F32Lanes::all_finite`].
    type Bad: Copy;

    unsafe fn splat(x: f32) -> Self;
    unsafe fn zero() -> Self;
    /// `LANES` f32 from `p` (unaligned).
    unsafe fn load(p: *const f32) -> Self;
    /// `LANES` f32 to `p` (unaligned).
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

    /// `LANES` signed bytes from `p`, each converted to f32 (exact).
    unsafe fn load_i8(p: *const i8) -> Self;
    /// `a * b + c`, one rounding (FMA: the linear kernels only; the
    /// optimizer's step never fuses, to stay bit-identical to its scalar twin).
    unsafe fn fmadd(a: Self, b: Self, c: Self) -> Self;
    /// The sum of the lanes, in the fixed order of the implementation.
    unsafe fn hsum(self) -> f32;

    /// A 16-entry table (values or midpoints) in registers.
    unsafe fn table(t: &[f32; 16]) -> Self::Table;
    /// `t[idx]` lane-wise, `idx` in 0..16.
    unsafe fn lookup(t: Self::Table, idx: Self::Idx) -> Self;
    /// The midpoints `t` (+inf padded) for [`F32Lanes::search16`].
    unsafe fn mids(t: &[f32; 16]) -> Self::Mids;
    /// Lane-wise nearest code given the 16 midpoints (+inf padded, sorted):
    /// the code of `Codebook16::encode`'s branch-free four-step search, the
    /// number of midpoints strictly below `x` (the AVX-512 body runs the
    /// same compares, the AVX2 one counts in two levels).
    unsafe fn search16(mids: Self::Mids, x: Self) -> Self::Idx;
    /// Nearest codes on the uniform `{k/16 : k = 1..16}` map:
    /// `clamp(ceil(16x - 1.5), 0, 15)`. Equal to the midpoint search: the
    /// midpoints are `(2k + 3) / 32`, `16x` is exact, and `16x - 1.5` is
    /// exact whenever `16x >= 0.75` (and negative otherwise), so
    /// `x > mid_k` iff `k < 16x - 1.5`. Tested bit for bit against the
    /// scalar reference.
    unsafe fn search_uniform(x: Self) -> Self::Idx;
    /// `LANES / 2` bytes of packed nibbles at `p` -> `LANES` codes (element order).
    unsafe fn load_nibbles(p: *const u8) -> Self::Idx;
    /// `LANES` codes (< 16) -> `LANES / 2` bytes of packed nibbles at `p`.
    unsafe fn store_nibbles(idx: Self::Idx, p: *mut u8);
    /// Two registers of codes -> `LANES` bytes at `p` (one store where a
    /// narrow store per register is slow).
    #[inline(always)]
    unsafe fn store_nibbles2(a: Self::Idx, b: Self::Idx, p: *mut u8) {
        // SAFETY: the caller guarantees `LANES` writable bytes at `p`.
        unsafe {
            Self::store_nibbles(a, p);
            Self::store_nibbles(b, p.add(Self::LANES / 2));
        }
    }
    /// `t[codes[i]]` for the `LANES` byte codes at `codes` (a gather).
    unsafe fn gather256(t: &[f32; 256], codes: *const u8) -> Self;
    /// Lane-wise nearest code in a 256-entry midpoint table: the 8-step
    /// search of `Codebook256::encode` (gathers; indices stay in 0..=254).
    unsafe fn search256(mids: &[f32; 256], x: Self) -> Self::Idx;
    /// `LANES` codes (< 256) -> `LANES` bytes at `p`.
    unsafe fn store_bytes(idx: Self::Idx, p: *mut u8);

    /// No lane seen yet.
    unsafe fn no_bad() -> Self::Bad;
    /// `bad` plus the lanes of `x` that are NaN or infinite.
    unsafe fn add_bad(bad: Self::Bad, x: Self) -> Self::Bad;
    /// True when no lane was NaN or infinite.
    unsafe fn none_bad(bad: Self::Bad) -> bool;
}
