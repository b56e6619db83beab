//! CPU features, detected once, handed out as proof tokens.
//!
//! Every SIMD kernel in the crate is an `unsafe fn` with
//! `#[target_feature(...)]`. The only way to call one soundly is to hold a
//! token from this module: a zero-sized value whose constructor checked the
//! CPU (the pattern of memchr's `arch` module). Per-ISA functions take the
//! token as their first argument, so safe code cannot reach an instruction
//! the CPU lacks, whatever `SimdLevel` a caller asks for.
//!
//! `QUANTRS_SIMD=scalar|avx2|avx512|neon` may lower the level in force (so one
//! machine can test every path) but never raise it above what the CPU has;
//! `QUANTRS_AMX=0` turns the AMX tile kernels off. Both are read here and
//! nowhere else.

mod lanes;
#[cfg(target_arch = "x86_64")]
mod lanes_avx2;
#[cfg(target_arch = "x86_64")]
mod lanes_avx512;

use std::sync::OnceLock;

#[cfg(target_arch = "x86_64")]
pub(crate) use lanes::F32Lanes;

use crate::error::{QuantError, Result};

/// Instruction-set level a kernel may use. The order is the x86 ladder:
/// `Avx2` means AVX2 *and* FMA, `Avx512` means AVX-512 F+BW+VL on top of it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum SimdLevel {
    /// Portable Rust, no vector intrinsics (the reference every path is tested against).
    Scalar,
    /// AArch64 NEON (no hand-written kernels yet: the scalar code is auto-vectorised).
    Neon,
    /// x86-64 AVX2 + FMA.
    Avx2,
    /// x86-64 AVX-512 F, BW and VL (with AVX2 + FMA).
    Avx512,
}

impl SimdLevel {
    /// The name `QUANTRS_SIMD` and `build_info()` use.
    pub fn name(self) -> &'static str {
        match self {
            SimdLevel::Scalar => "scalar",
            SimdLevel::Neon => "neon",
            SimdLevel::Avx2 => "avx2",
            SimdLevel::Avx512 => "avx512",
        }
    }

    /// Parse a level name (case-insensitive; `none` means scalar).
    pub fn parse(s: &str) -> Option<SimdLevel> {
        match s.trim().to_ascii_lowercase().as_str() {
            "scalar" | "none" => Some(SimdLevel::Scalar),
            "neon" => Some(SimdLevel::Neon),
            "avx2" => Some(SimdLevel::Avx2),
            "avx512" => Some(SimdLevel::Avx512),
            _ => None,
        }
    }
}

/// What the CPU supports, ignoring the environment.
pub fn detected() -> SimdLevel {
    static DETECTED: OnceLock<SimdLevel> = OnceLock::new();
    *DETECTED.get_or_init(detect_cpu)
}

/// The level kernels use: the detected one, lowered by `QUANTRS_SIMD` if set.
pub fn level() -> SimdLevel {
    static LEVEL: OnceLock<SimdLevel> = OnceLock::new();
    *LEVEL.get_or_init(|| {
        let requested = std::env::var("QUANTRS_SIMD").ok();
        lower_to(detected(), requested.as_deref())
    })
}

/// Apply an override to a detected level. Unknown names and requests above
/// the detected level leave the detected level in force; `scalar` always wins.
pub(crate) fn lower_to(detected: SimdLevel, requested: Option<&str>) -> SimdLevel {
    let Some(req) = requested.and_then(SimdLevel::parse) else {
        return detected;
    };
    match (req, detected) {
        (SimdLevel::Scalar, _) => SimdLevel::Scalar,
        // NEON and the x86 ladder are different architectures: a NEON request
        // on x86 (or an AVX request on ARM) cannot lower anything.
        (SimdLevel::Neon, SimdLevel::Neon) => SimdLevel::Neon,
        (SimdLevel::Neon, _) | (_, SimdLevel::Neon) => detected,
        (r, d) if r <= d => r,
        _ => detected,
    }
}

/// The levels at or below the one in force, scalar first, for tests that
/// compare every available path against the scalar reference.
pub fn available_levels() -> Vec<SimdLevel> {
    let top = level();
    [
        SimdLevel::Scalar,
        SimdLevel::Neon,
        SimdLevel::Avx2,
        SimdLevel::Avx512,
    ]
    .into_iter()
    .filter(|&l| l == SimdLevel::Scalar || lower_to(top, Some(l.name())) == l)
    .collect()
}

/// Check that `requested` can run here: an entry point that takes a level
/// (tests, benches) calls this and gets an error, not an illegal instruction,
/// for a level above the one in force.
pub fn require(requested: SimdLevel) -> Result<SimdLevel> {
    if available_levels().contains(&requested) {
        Ok(requested)
    } else {
        Err(QuantError::UnsupportedOperation(format!(
            "SIMD level {} is not available on this CPU (level in force: {}; QUANTRS_SIMD can only lower it)",
            requested.name(),
            level().name()
        )))
    }
}

#[cfg(target_arch = "x86_64")]
fn detect_cpu() -> SimdLevel {
    let avx2 = is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma");
    let avx512 = avx2
        && is_x86_feature_detected!("avx512f")
        && is_x86_feature_detected!("avx512bw")
        && is_x86_feature_detected!("avx512vl");
    if avx512 {
        SimdLevel::Avx512
    } else if avx2 {
        SimdLevel::Avx2
    } else {
        SimdLevel::Scalar
    }
}

#[cfg(target_arch = "aarch64")]
fn detect_cpu() -> SimdLevel {
    if std::arch::is_aarch64_feature_detected!("neon") {
        SimdLevel::Neon
    } else {
        SimdLevel::Scalar
    }
}

#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
fn detect_cpu() -> SimdLevel {
    SimdLevel::Scalar
}

/// Extra x86 features beyond the ladder, detected once (false elsewhere).
#[derive(Clone, Copy, Debug, Default)]
struct Extras {
    vnni: bool,
    dq: bool,
    f16c: bool,
}

fn extras() -> Extras {
    static EXTRAS: OnceLock<Extras> = OnceLock::new();
    *EXTRAS.get_or_init(|| {
        #[cfg(target_arch = "x86_64")]
        {
            Extras {
                vnni: is_x86_feature_detected!("avx512vnni"),
                dq: is_x86_feature_detected!("avx512dq"),
                f16c: is_x86_feature_detected!("f16c"),
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            Extras::default()
        }
    })
}

/// Proof that AVX2 and FMA may run (the CPU has them and `QUANTRS_SIMD`
/// allows them). Zero-sized; only [`Avx2::new`] makes one.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Avx2 {
    _proof: (),
}

impl Avx2 {
    /// `Some` when the level in force is at least AVX2.
    pub(crate) fn new() -> Option<Self> {
        (level() >= SimdLevel::Avx2 && level() != SimdLevel::Neon).then_some(Avx2 { _proof: () })
    }

    /// The token for `requested`: `Some` only when `requested` is at least
    /// AVX2 *and* the CPU allows it (a request never raises the level).
    pub(crate) fn at(requested: SimdLevel) -> Option<Self> {
        if requested >= SimdLevel::Avx2 && requested != SimdLevel::Neon {
            Self::new()
        } else {
            None
        }
    }

    /// AVX2 + FMA + F16C (the FP8 E4M3 dot converts halves).
    pub(crate) fn f16c(self) -> Option<Avx2F16c> {
        extras().f16c.then_some(Avx2F16c { _proof: () })
    }
}

/// Proof that AVX2, FMA and F16C may run.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Avx2F16c {
    _proof: (),
}

/// Proof that AVX-512 F, BW and VL (and AVX2 + FMA) may run.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Avx512 {
    _proof: (),
}

impl Avx512 {
    /// `Some` when the level in force is AVX-512.
    pub(crate) fn new() -> Option<Self> {
        (level() == SimdLevel::Avx512).then_some(Avx512 { _proof: () })
    }

    /// The token for `requested`: `Some` only when `requested` is AVX-512
    /// and the CPU allows it.
    pub(crate) fn at(requested: SimdLevel) -> Option<Self> {
        if requested == SimdLevel::Avx512 {
            Self::new()
        } else {
            None
        }
    }

    /// AVX-512 plus VNNI (`vpdpbusd`), for the integer INT4 matvec.
    pub(crate) fn vnni(self) -> Option<Avx512Vnni> {
        extras().vnni.then_some(Avx512Vnni { _proof: () })
    }

    /// AVX-512 plus DQ (64-bit integer <-> double conversions in QAT).
    pub(crate) fn dq(self) -> Option<Avx512Dq> {
        extras().dq.then_some(Avx512Dq { _proof: () })
    }
}

/// Proof that AVX-512 F/BW/VL and VNNI may run.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Avx512Vnni {
    _proof: (),
}

impl Avx512Vnni {
    /// `Some` when AVX-512 is in force and the CPU has VNNI.
    pub(crate) fn new() -> Option<Self> {
        Avx512::new().and_then(Avx512::vnni)
    }

    /// The AVX-512 token this one implies.
    pub(crate) fn avx512(self) -> Avx512 {
        Avx512 { _proof: () }
    }

    /// The AVX2 + FMA token this one implies (AVX-512 is in force only on
    /// top of them, see [`SimdLevel`]).
    pub(crate) fn avx2(self) -> Avx2 {
        Avx2 { _proof: () }
    }
}

/// Proof that AVX-512 F/BW/VL and DQ may run.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Avx512Dq {
    _proof: (),
}

/// Proof that the AMX-BF16 tile instructions may run on every thread of
/// this process, and AVX-512 F/BW/VL with AVX512-BF16 alongside: AVX-512 is
/// in force, the CPU reports AMX-TILE, AMX-BF16 and AVX512-BF16, `QUANTRS_AMX`
/// is not `0`, and Linux granted the process the tile-data state
/// (`arch_prctl(ARCH_REQ_XCOMP_PERM)`, which covers threads started before
/// and after). Elsewhere (other systems, CPUs without AMX) never made.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Amx {
    _proof: (),
}

impl Amx {
    /// `Some` when the tile kernels may run (see the type).
    pub(crate) fn new() -> Option<Self> {
        static GRANTED: OnceLock<bool> = OnceLock::new();
        let granted = *GRANTED.get_or_init(|| {
            let off = std::env::var("QUANTRS_AMX").is_ok_and(|v| v.trim() == "0");
            !off && level() == SimdLevel::Avx512 && amx_granted()
        });
        granted.then_some(Amx { _proof: () })
    }

    /// The AVX-512 token this one implies.
    pub(crate) fn avx512(self) -> Avx512 {
        Avx512 { _proof: () }
    }
}

/// Whether the CPU has AMX-TILE, AMX-BF16 and AVX512-BF16 and the kernel
/// lets this process use the tile registers (asked once).
#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
fn amx_granted() -> bool {
    // CPUID leaf 7, sub-leaf 0, EDX: bit 22 AMX-BF16, bit 24 AMX-TILE
    // (Intel SDM vol. 2A, CPUID).
    let edx = std::arch::x86_64::__cpuid_count(7, 0).edx;
    let cpu = edx >> 22 & 1 == 1 && edx >> 24 & 1 == 1 && is_x86_feature_detected!("avx512bf16");
    if !cpu {
        return false;
    }
    // arch_prctl(ARCH_REQ_XCOMP_PERM = 0x1023, XFEATURE_XTILEDATA = 18):
    // Linux (>= 5.16) keeps the 8 KiB tile state off until a process asks;
    // using a tile instruction without it is SIGILL. Returns 0 when granted.
    let ret: i64;
    // SAFETY: a plain system call (number 158, arch_prctl) with integer
    // arguments; it touches no memory of ours and clobbers rcx and r11, as
    // declared.
    unsafe {
        std::arch::asm!(
            "syscall",
            inlateout("rax") 158i64 => ret,
            in("rdi") 0x1023i64,
            in("rsi") 18i64,
            lateout("rcx") _,
            lateout("r11") _,
            options(nostack),
        );
    }
    ret == 0
}

#[cfg(not(all(target_arch = "x86_64", target_os = "linux")))]
fn amx_granted() -> bool {
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn override_only_lowers() {
        use SimdLevel::*;
        assert_eq!(lower_to(Avx2, Some("avx512")), Avx2);
        assert_eq!(lower_to(Avx512, Some("avx2")), Avx2);
        assert_eq!(lower_to(Avx512, Some("scalar")), Scalar);
        assert_eq!(lower_to(Avx2, Some("neon")), Avx2);
        assert_eq!(lower_to(Neon, Some("avx2")), Neon);
        assert_eq!(lower_to(Neon, Some("SCALAR")), Scalar);
        assert_eq!(lower_to(Avx2, Some("bogus")), Avx2);
        assert_eq!(lower_to(Avx2, None), Avx2);
    }

    #[test]
    fn available_levels_start_with_scalar() {
        let levels = available_levels();
        assert_eq!(levels[0], SimdLevel::Scalar);
        assert!(levels.contains(&level()));
    }

    #[test]
    fn tokens_follow_the_level_in_force() {
        assert_eq!(
            Avx2::new().is_some(),
            level() >= SimdLevel::Avx2 && level() != SimdLevel::Neon
        );
        assert_eq!(Avx512::new().is_some(), level() == SimdLevel::Avx512);
        assert!(Avx512::at(SimdLevel::Avx2).is_none());
        assert!(Avx2::at(SimdLevel::Scalar).is_none());
        if Avx512Vnni::new().is_some() || Avx512::new().and_then(Avx512::dq).is_some() {
            assert!(Avx512::new().is_some());
        }
    }

    #[test]
    fn require_refuses_levels_above_the_one_in_force() {
        assert!(require(SimdLevel::Scalar).is_ok());
        assert!(require(level()).is_ok());
        for l in [SimdLevel::Neon, SimdLevel::Avx2, SimdLevel::Avx512] {
            assert_eq!(require(l).is_ok(), available_levels().contains(&l));
        }
    }
}
