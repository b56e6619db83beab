//! The `QatOptimizer` surface on ndarray and `rand` (docs/rust.md):
//! `Array1` masters and gradients, and stochastic-rounding keys drawn from
//! the caller's [`Rng`]. The slice methods in `optimizer.rs` do the work.

use ndarray::Array1;
use rand::Rng;

use super::config::QatConfig;
use super::deploy::QatGrid;
use super::element::Master;
use super::optimizer::QatOptimizer;
use crate::error::{QuantError, Result};

fn slice_of<'a, T>(a: &'a Array1<T>, what: &str) -> Result<&'a [T]> {
    a.as_slice().ok_or_else(|| {
        QuantError::InvalidArgument(format!(
            "{what}: expected a contiguous array (standard layout), got strides {:?}",
            a.strides()
        ))
    })
}

impl<T: Master> QatOptimizer<T> {
    /// Create an optimizer for the given master weights; the initial
    /// quantized view is derived immediately from `master`.
    ///
    /// Draws one `u64` from `rng`: the key of the initial view's stochastic
    /// rounding (drawn whatever the rounding mode, so the stream a caller
    /// sees does not depend on it). The key is also recorded as the
    /// optimizer's [`seed`](Self::seed).
    ///
    /// # Errors
    ///
    /// [`QuantError::InvalidState`] for an empty master; invalid
    /// hyper-parameters, a non-finite or non-contiguous master, and
    /// calibration failures (an all-zero master has no integer scale).
    pub fn new(master: &Array1<T>, config: QatConfig, rng: &mut impl Rng) -> Result<Self> {
        let m = slice_of(master, "master")?;
        let mut drawn = 0;
        let mut opt = Self::with_key(m, config, QatGrid::PerTensor, 0, |_| {
            drawn = rng.next_u64();
            drawn
        })?;
        opt.seed = drawn;
        Ok(opt)
    }

    /// The current fake-quantized view of the master weights (what the
    /// forward pass uses).
    pub fn quantized_weights(&self) -> &Array1<T> {
        &self.quantized
    }

    /// One optimizer step: an AdamW update of `master` in place, then
    /// recalibration and a new quantized view. The master stays in full
    /// precision; only the view is rounded onto the grid.
    ///
    /// Draws exactly one `u64` from `rng` (the view's key) when the step
    /// succeeds, and none when it fails.
    ///
    /// # Errors
    ///
    /// [`QuantError::DimensionMismatch`] when `master` or `grad` disagree
    /// with the optimizer's length; a non-finite value, an overflowing
    /// update or a degenerate calibration. On error nothing changes.
    pub fn step(
        &mut self,
        master: &mut Array1<T>,
        grad: &Array1<T>,
        rng: &mut impl Rng,
    ) -> Result<()> {
        let g = slice_of(grad, "grad")?;
        let strides = master.strides().to_vec();
        let m = master.as_slice_mut().ok_or_else(|| {
            QuantError::InvalidArgument(format!(
                "master: expected a contiguous array (standard layout), got strides {strides:?}"
            ))
        })?;
        self.step_keyed(m, g, |_| rng.next_u64())
    }
}
