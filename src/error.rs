//! The one error type of the core. `src/python/errors.rs` maps it onto the
//! Python exception hierarchy in a single place.

use thiserror::Error;

/// Every fallible core operation returns this.
#[derive(Debug, Error)]
pub enum QuantError {
    /// A length or shape disagrees with what the operation needs.
    #[error("dimension mismatch: {what}: expected {expected}, got {actual}")]
    DimensionMismatch {
        /// The argument (or quantity) that is wrong.
        what: String,
        /// What it should have been.
        expected: String,
        /// What it was.
        actual: String,
    },
    /// The object is not in a state where the operation is possible.
    #[error("invalid state: {0}")]
    InvalidState(String),
    /// The operation is not implemented for this kind of object.
    #[error("unsupported operation: {0}")]
    UnsupportedOperation(String),
    /// A value (not a shape) is out of its domain.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// Bytes or a file that cannot be decoded.
    #[error("serialization error: {0}")]
    Serialization(String),
    /// Reading or writing a file failed.
    #[error("I/O error: {0}")]
    Io(#[from] std::io::Error),
    /// A CUDA device was requested where none can be used.
    #[error("CUDA is not available: {0}")]
    CudaNotAvailable(String),
    /// The GPU runtime reported an error.
    #[error("GPU error: {0}")]
    Gpu(String),
}

/// [`QuantError`] under the name the original crates used, so that match
/// arms on `GpuOptimError::{DimensionMismatch, InvalidState,
/// UnsupportedOperation}` keep compiling (docs/rust.md).
pub type GpuOptimError = QuantError;

/// The core's result type.
pub type Result<T> = std::result::Result<T, QuantError>;

impl QuantError {
    /// Shorthand for a [`QuantError::DimensionMismatch`].
    pub fn dims(what: impl Into<String>, expected: impl ToString, actual: impl ToString) -> Self {
        QuantError::DimensionMismatch {
            what: what.into(),
            expected: expected.to_string(),
            actual: actual.to_string(),
        }
    }

    /// Shorthand for a [`QuantError::InvalidArgument`].
    pub fn arg(msg: impl Into<String>) -> Self {
        QuantError::InvalidArgument(msg.into())
    }

    /// The [`QuantError::InvalidArgument`] of an int8-activation kernel
    /// given a NaN or infinity in `x` (rows of `in_feat`): it names the
    /// first such value and its index.
    pub(crate) fn non_finite_activation(x: &[f32], in_feat: usize) -> Self {
        let i = x.iter().position(|v| !v.is_finite()).unwrap_or(0);
        QuantError::arg(format!(
            "x: non-finite value {} at index [{}, {}] cannot be quantized to int8 \
             (activations='int8'; use activations='float32' to propagate it)",
            x.get(i).copied().unwrap_or(f32::NAN),
            i / in_feat.max(1),
            i % in_feat.max(1)
        ))
    }

    /// Shorthand for a [`QuantError::Serialization`].
    pub fn ser(msg: impl Into<String>) -> Self {
        QuantError::Serialization(msg.into())
    }
}

/// `rows` within `0..out_feat` (`start <= end`): the row ranges that the
/// weights' `dequantize_rows` accept.
pub(crate) fn check_rows(rows: &std::ops::Range<usize>, out_feat: usize) -> Result<()> {
    if rows.start > rows.end || rows.end > out_feat {
        return Err(QuantError::arg(format!(
            "rows {}..{}: expected start <= stop <= out_features={out_feat}",
            rows.start, rows.end
        )));
    }
    Ok(())
}
