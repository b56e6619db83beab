//! The AVX2 entry points of the step (`kernel.rs` over `crate::simd::F32Lanes`
//! for `__m256`), each taking an [`Avx2`] token, the proof that the CPU runs
//! them; with the interleaved pass 2 + pass 1 of consecutive groups.

#![cfg(target_arch = "x86_64")]

use std::arch::x86_64::*;

use super::format::{Codecs, Pass1, Pass2, StepConsts};
use super::kernel::{entry_points, interleaved_entry_point};
use crate::simd::Avx2;

entry_points!(Avx2, __m256, "avx2,fma");
interleaved_entry_point!(Avx2, __m256, "avx2,fma");
