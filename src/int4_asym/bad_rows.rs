//! The float quantizers' check of `w` inside their row-parallel loop: each
//! row is checked ([`checks::weight_row`]) right before it is quantized,
//! while it is in cache, instead of in a pass of its own over `w`; the
//! error names the lowest bad row whatever the number of threads.

use std::sync::atomic::{AtomicUsize, Ordering};

use super::checks;
use crate::error::Result;

/// The lowest bad row seen so far by the rows of one parallel loop.
pub(crate) struct LowestBadRow(AtomicUsize);

impl LowestBadRow {
    /// No bad row seen.
    pub(crate) fn new() -> Self {
        LowestBadRow(AtomicUsize::new(usize::MAX))
    }

    /// Whether row `r` (its values `row`: all of them, or the piece about
    /// to be quantized) is to be quantized: not when a lower row is already
    /// known bad (the call fails; its work is wasted), nor when `row`
    /// itself is bad (recorded). The lowest bad row
    /// is never skipped (only a lower bad row could skip it), so it is
    /// always the one recorded, on any thread count and in any order.
    pub(crate) fn admits(&self, r: usize, row: &[f32]) -> bool {
        if r > self.0.load(Ordering::Relaxed) {
            return false;
        }
        if checks::weight_row(r, row).is_ok() {
            return true;
        }
        self.0.fetch_min(r, Ordering::Relaxed);
        false
    }

    /// After the loop over `w` (`[_, in_feat]`): the error of the lowest
    /// bad row ([`checks::weight_row`]'s, rebuilt from that one row rather
    /// than carried out of the loop), or `Ok` when every row passed.
    pub(crate) fn finish(self, w: &[f32], in_feat: usize) -> Result<()> {
        match self.0.into_inner() {
            usize::MAX => Ok(()),
            r => checks::weight_row(r, &w[r * in_feat..(r + 1) * in_feat]),
        }
    }
}
