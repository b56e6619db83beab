//! What to quantize to, how, and the AdamW hyper-parameters.

use crate::error::{QuantError, Result};
use crate::fp8::Fp8Format;

/// Integer storage types of the fake-quantized view.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum IntDtype {
    /// 8-bit signed codes.
    Int8,
    /// 4-bit signed codes.
    Int4,
}

impl IntDtype {
    /// `(qmin, qmax)` for a scheme: symmetric ranges are balanced
    /// (`[-127, 127]`, `[-7, 7]`) so that `-x` quantizes to `-q`; affine
    /// ranges use the full two's-complement range.
    pub fn range(self, scheme: QuantScheme) -> (i32, i32) {
        match (self, scheme) {
            (IntDtype::Int8, QuantScheme::Symmetric) => (-127, 127),
            (IntDtype::Int8, QuantScheme::Affine) => (-128, 127),
            (IntDtype::Int4, QuantScheme::Symmetric) => (-7, 7),
            (IntDtype::Int4, QuantScheme::Affine) => (-8, 7),
        }
    }
}

/// The grid of the quantized view.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum QuantTarget {
    /// Integer codes of this type.
    Int(IntDtype),
    /// The FP8 grid of this format.
    Fp8(Fp8Format),
}

impl QuantTarget {
    /// Parse `"int8"`, `"int4"`, `"fp8_e4m3"`, `"fp8_e5m2"` (case-insensitive).
    pub fn parse(s: &str) -> Result<QuantTarget> {
        match s.to_ascii_lowercase().as_str() {
            "int8" => Ok(QuantTarget::Int(IntDtype::Int8)),
            "int4" => Ok(QuantTarget::Int(IntDtype::Int4)),
            "fp8_e4m3" | "e4m3" => Ok(QuantTarget::Fp8(Fp8Format::E4M3)),
            "fp8_e5m2" | "e5m2" => Ok(QuantTarget::Fp8(Fp8Format::E5M2)),
            _ => Err(QuantError::arg(format!(
                "target: expected one of 'int8', 'int4', 'fp8_e4m3', 'fp8_e5m2', got {s:?}"
            ))),
        }
    }

    /// The name `parse` accepts.
    pub fn name(self) -> &'static str {
        match self {
            QuantTarget::Int(IntDtype::Int8) => "int8",
            QuantTarget::Int(IntDtype::Int4) => "int4",
            QuantTarget::Fp8(Fp8Format::E4M3) => "fp8_e4m3",
            QuantTarget::Fp8(Fp8Format::E5M2) => "fp8_e5m2",
        }
    }
}

/// Integer calibration scheme.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum QuantScheme {
    /// `zero_point = 0`, `scale = absmax / qmax`.
    Symmetric,
    /// `[min, max]` widened to include 0, `scale = (max - min) / (qmax - qmin)`.
    Affine,
}

impl QuantScheme {
    /// Parse `"symmetric"` or `"affine"` (alias `"asymmetric"`; case-insensitive).
    pub fn parse(s: &str) -> Result<QuantScheme> {
        match s.to_ascii_lowercase().as_str() {
            "symmetric" => Ok(QuantScheme::Symmetric),
            "affine" | "asymmetric" => Ok(QuantScheme::Affine),
            _ => Err(QuantError::arg(format!(
                "scheme: expected 'symmetric' or 'affine', got {s:?}"
            ))),
        }
    }

    /// The name `parse` accepts.
    pub fn name(self) -> &'static str {
        match self {
            QuantScheme::Symmetric => "symmetric",
            QuantScheme::Affine => "affine",
        }
    }
}

/// How a value between two grid points is rounded.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RoundingMode {
    /// Round to nearest, ties to even.
    Nearest,
    /// Round up with probability equal to the fraction (unbiased in
    /// expectation; Gupta et al. 2015, "Deep learning with limited numerical
    /// precision").
    Stochastic,
}

impl RoundingMode {
    /// Parse `"nearest"` or `"stochastic"` (case-insensitive).
    pub fn parse(s: &str) -> Result<RoundingMode> {
        match s.to_ascii_lowercase().as_str() {
            "nearest" => Ok(RoundingMode::Nearest),
            "stochastic" => Ok(RoundingMode::Stochastic),
            _ => Err(QuantError::arg(format!(
                "rounding: expected 'nearest' or 'stochastic', got {s:?}"
            ))),
        }
    }

    /// The name `parse` accepts.
    pub fn name(self) -> &'static str {
        match self {
            RoundingMode::Nearest => "nearest",
            RoundingMode::Stochastic => "stochastic",
        }
    }
}

/// Configuration of a [`crate::qat::QatOptimizer`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct QatConfig {
    /// The grid of the quantized view.
    pub target: QuantTarget,
    /// Integer calibration scheme (symmetric only for FP8 targets).
    pub scheme: QuantScheme,
    /// How the view rounds.
    pub rounding: RoundingMode,
    /// AdamW learning rate, finite and >= 0.
    pub lr: f64,
    /// First-moment decay, in [0, 1).
    pub beta1: f64,
    /// Second-moment decay, in [0, 1).
    pub beta2: f64,
    /// Added to the denominator, finite and > 0.
    pub eps: f64,
    /// Decoupled weight decay, finite and >= 0.
    pub weight_decay: f64,
}

impl QatConfig {
    /// A configuration with the given grid, scheme, rounding and learning
    /// rate, and the AdamW defaults: betas (0.9, 0.999), eps 1e-8, no weight
    /// decay (set the public fields to change them). Checked by
    /// [`Self::validate`] when an optimizer is built.
    ///
    /// ```
    /// use quantrs::qat::{IntDtype, QatConfig, QuantScheme, QuantTarget, RoundingMode};
    ///
    /// let mut c = QatConfig::new(
    ///     QuantTarget::Int(IntDtype::Int4),
    ///     QuantScheme::Affine,
    ///     RoundingMode::Stochastic,
    ///     1e-2,
    /// );
    /// assert_eq!((c.beta1, c.beta2, c.eps, c.weight_decay), (0.9, 0.999, 1e-8, 0.0));
    /// c.weight_decay = 0.01;
    /// assert!(c.validate().is_ok());
    /// ```
    pub fn new(
        target: QuantTarget,
        scheme: QuantScheme,
        rounding: RoundingMode,
        lr: f64,
    ) -> QatConfig {
        QatConfig {
            target,
            scheme,
            rounding,
            lr,
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            weight_decay: 0.0,
        }
    }

    /// The defaults for `target`: symmetric, nearest, lr 1e-3 and the AdamW
    /// defaults of [`Self::new`].
    pub fn with_target(target: QuantTarget) -> QatConfig {
        QatConfig::new(target, QuantScheme::Symmetric, RoundingMode::Nearest, 1e-3)
    }

    /// Reject hyper-parameters AdamW is not defined for, and options that
    /// would do nothing (a scheme other than symmetric for an FP8 target).
    pub fn validate(&self) -> Result<()> {
        let check = |name: &str, v: f64, ok: bool, what: &str| {
            if ok {
                Ok(())
            } else {
                Err(QuantError::arg(format!("{name}: expected {what}, got {v}")))
            }
        };
        check(
            "lr",
            self.lr,
            self.lr.is_finite() && self.lr >= 0.0,
            "a finite value >= 0",
        )?;
        for (n, b) in [("beta1", self.beta1), ("beta2", self.beta2)] {
            check(n, b, (0.0..1.0).contains(&b), "a value in [0, 1)")?;
        }
        check(
            "eps",
            self.eps,
            self.eps.is_finite() && self.eps > 0.0,
            "a finite value > 0",
        )?;
        check(
            "weight_decay",
            self.weight_decay,
            self.weight_decay.is_finite() && self.weight_decay >= 0.0,
            "a finite value >= 0",
        )?;
        if matches!(self.target, QuantTarget::Fp8(_)) && self.scheme == QuantScheme::Affine {
            return Err(QuantError::arg(
                "scheme: 'affine' applies to integer targets only; FP8 targets cast onto the FP8 grid",
            ));
        }
        Ok(())
    }
}
