//! The AMX tile machinery the tile kernels share (the FP8 forward in
//! `amx.rs`, the int8-activation INT4 GEMM in `crate::int4::a8`): the
//! palette-1 configuration, the tile instructions as macros over inline
//! assembly (stable Rust has no AMX intrinsics), the per-thread
//! configure / release guard, and the proof token of AMX-INT8.
//!
//! Tile shapes, operands and semantics: Intel SDM vol. 1 ch. 18 (Intel
//! AMX), vol. 2 (LDTILECFG, TILELOADD, TDPBF16PS, TDPBSUD).

use std::arch::asm;
use std::sync::OnceLock;

use crate::simd::{Amx, Avx512, Avx512Vnni};

/// Rows of a full tile, and 32-bit lanes of a 64-byte tile row.
pub(crate) const T: usize = 16;

/// A palette-1 tile configuration (Intel SDM, LDTILECFG): per tile `t` of
/// the eight, its rows and bytes per row.
#[repr(C, align(64))]
pub(crate) struct TileConfig([u8; 64]);

impl TileConfig {
    /// Tile `t` gets `shapes[t] = (rows, bytes per row)` (at most 16 rows of
    /// 64 bytes).
    pub(crate) fn new(shapes: [(usize, usize); 8]) -> Self {
        let mut c = [0u8; 64];
        c[0] = 1;
        for (t, (rows, colsb)) in shapes.into_iter().enumerate() {
            assert!(rows <= T && colsb <= 64 && colsb.is_multiple_of(4));
            c[16 + 2 * t..18 + 2 * t].copy_from_slice(&(colsb as u16).to_le_bytes());
            c[48 + t] = rows as u8;
        }
        TileConfig(c)
    }

    /// Eight tiles of 16 rows by 64 bytes.
    pub(crate) fn sixteen_by_64() -> Self {
        Self::new([(T, 64); 8])
    }
}

/// `tileloadd tmm$t, [$ptr + $stride]`: the tile's configured rows, each
/// its configured bytes, `$stride` bytes apart.
macro_rules! tile_load {
    ($t:literal, $ptr:expr, $stride:expr) => {
        ::std::arch::asm!(concat!("tileloadd tmm", $t, ", [{p} + {s}*1]"),
            p = in(reg) $ptr, s = in(reg) $stride, options(nostack, readonly, preserves_flags))
    };
}
/// `tilestored [$ptr + 64], tmm$t`: rows 64 bytes apart.
macro_rules! tile_store {
    ($t:literal, $ptr:expr) => {
        ::std::arch::asm!(concat!("tilestored [{p} + {s}*1], tmm", $t),
            p = in(reg) $ptr, s = in(reg) 64usize, options(nostack, preserves_flags))
    };
}
/// `tilezero tmm$t`.
macro_rules! tile_zero {
    ($t:literal) => {
        ::std::arch::asm!(
            concat!("tilezero tmm", $t),
            options(nostack, nomem, preserves_flags)
        )
    };
}
/// `tdpbf16ps tmm$c, tmm$a, tmm$b`: bf16 pairs, f32 sums.
macro_rules! tile_dot_bf16 {
    ($c:literal, $a:literal, $b:literal) => {
        ::std::arch::asm!(
            concat!("tdpbf16ps tmm", $c, ", tmm", $a, ", tmm", $b),
            options(nostack, nomem, preserves_flags)
        )
    };
}
/// `tdpbsud tmm$c, tmm$a, tmm$b`: signed bytes of A times unsigned bytes
/// of B, four per 32-bit lane, exact i32 sums.
macro_rules! tile_dot_i8 {
    ($c:literal, $a:literal, $b:literal) => {
        ::std::arch::asm!(
            concat!("tdpbsud tmm", $c, ", tmm", $a, ", tmm", $b),
            options(nostack, nomem, preserves_flags)
        )
    };
}
pub(crate) use {tile_dot_bf16, tile_dot_i8, tile_load, tile_store, tile_zero};

/// A tile configuration loaded on this thread, released on drop (so an
/// idle worker does not carry 8 KiB of tile state through context
/// switches).
pub(crate) struct Tiles {
    /// Not `Send`: the configuration belongs to the thread that loaded it.
    _thread: std::marker::PhantomData<*const ()>,
}

impl Tiles {
    /// Load `cfg` on this thread.
    pub(crate) fn configure(_: Amx, cfg: &TileConfig) -> Self {
        // SAFETY: the Amx token proves the CPU and OS allow the tile
        // instructions; LDTILECFG reads the 64 bytes of `cfg` (a valid
        // palette-1 configuration by construction, `TileConfig::new`).
        unsafe {
            asm!("ldtilecfg [{0}]", in(reg) cfg.0.as_ptr(), options(nostack, readonly, preserves_flags))
        };
        Tiles {
            _thread: std::marker::PhantomData,
        }
    }
}

impl Drop for Tiles {
    fn drop(&mut self) {
        // SAFETY: a configuration was loaded on this thread (`configure`);
        // TILERELEASE returns the tile state to its initial state.
        unsafe { asm!("tilerelease", options(nostack, nomem, preserves_flags)) }
    }
}

/// Proof that the AMX-INT8 tile dot products may run, with everything an
/// [`Amx`] token proves and AVX-512 VNNI: an [`Amx`] token exists and the
/// CPU reports AMX-INT8 (CPUID leaf 7, EDX bit 25). `QUANTRS_AMX=0` turns
/// it off with the rest of AMX.
#[derive(Clone, Copy, Debug)]
pub(crate) struct AmxInt8 {
    amx: Amx,
    vnni: Avx512Vnni,
}

impl AmxInt8 {
    /// `Some` when the int8 tile kernels may run (see the type).
    pub(crate) fn new() -> Option<Self> {
        static INT8: OnceLock<bool> = OnceLock::new();
        let amx = Amx::new()?;
        let vnni = amx.avx512().vnni()?;
        // CPUID leaf 7, sub-leaf 0, EDX bit 25: AMX-INT8 (Intel SDM vol. 2A).
        let int8 = *INT8.get_or_init(|| std::arch::x86_64::__cpuid_count(7, 0).edx >> 25 & 1 == 1);
        int8.then_some(AmxInt8 { amx, vnni })
    }

    /// The [`Amx`] token this one implies.
    pub(crate) fn amx(self) -> Amx {
        self.amx
    }

    /// The AVX-512 VNNI token this one implies.
    pub(crate) fn vnni(self) -> Avx512Vnni {
        self.vnni
    }

    /// The AVX-512 token this one implies.
    pub(crate) fn avx512(self) -> Avx512 {
        self.amx.avx512()
    }
}
