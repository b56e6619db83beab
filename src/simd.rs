//! CPU feature level, detected once.
//!
//! Kernels ask [`level`] once per call (never inside a hot loop) and pick a
//! function for it. `QUANTRS_SIMD=scalar|avx2|avx512|neon` may lower the level
//! (so one machine can test every path) but never raise it above what the CPU
//! has: asking for more than the CPU supports keeps the detected level.

use std::sync::OnceLock;

/// Instruction-set level a kernel may use. The order is the x86 ladder:
/// `Avx2` means AVX2 *and* FMA, `Avx512` means AVX-512 F+BW+VL on top of it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum SimdLevel {
    Scalar,
    Neon,
    Avx2,
    Avx512,
}

impl SimdLevel {
    pub fn name(self) -> &'static str {
        match self {
            SimdLevel::Scalar => "scalar",
            SimdLevel::Neon => "neon",
            SimdLevel::Avx2 => "avx2",
            SimdLevel::Avx512 => "avx512",
        }
    }

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
pub fn lower_to(detected: SimdLevel, requested: Option<&str>) -> SimdLevel {
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

/// Whether the level in force is AVX-512 and the CPU also has VNNI
/// (the integer INT4 matvec). Detected once.
pub fn has_avx512_vnni() -> bool {
    static VNNI: OnceLock<bool> = OnceLock::new();
    *VNNI.get_or_init(|| {
        #[cfg(target_arch = "x86_64")]
        {
            level() == SimdLevel::Avx512 && is_x86_feature_detected!("avx512vnni")
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            false
        }
    })
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

/// The x86 levels at or below the active one, for tests that compare every
/// available path against the scalar reference.
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
}
