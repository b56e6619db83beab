//! The AVX-512 entry points of the step (`kernel.rs` over
//! `crate::simd::F32Lanes` for `__m512`), each taking an [`Avx512`] token,
//! the proof that the CPU runs them.

#![cfg(target_arch = "x86_64")]

use std::arch::x86_64::*;

use super::format::{Codecs, Pass1, Pass2, StepConsts};
use super::kernel::entry_points;
use crate::simd::Avx512;

entry_points!(Avx512, __m512, "avx512f,avx512bw,avx512vl,avx2,fma");
