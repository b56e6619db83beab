//! imatrix tracking: the per-input-channel mean of `x_i^2` over every row a
//! layer's `forward` sees between `begin_track_stats` and `end_track_stats`
//! (llama.cpp's importance matrix, used to weight INT4 scale search).

use std::sync::Mutex;

use crate::error::{QuantError, Result};

/// Running sums behind a mutex, so `forward(&self)` can update them.
#[derive(Debug, Default)]
pub(crate) struct Stats {
    inner: Mutex<Option<(Vec<f64>, u64)>>,
}

impl Clone for Stats {
    /// A clone of a layer does not inherit an ongoing tracking session.
    fn clone(&self) -> Self {
        Stats::default()
    }
}

impl Stats {
    pub fn begin(&self, in_feat: usize) {
        *self.lock() = Some((vec![0.0; in_feat], 0));
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<(Vec<f64>, u64)>> {
        // A panic while holding the lock cannot leave the sums half-updated
        // in a way that matters more than losing the session: recover.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Add the rows of `x` (`[rows, in]`) when tracking.
    pub fn observe(&self, x: &[f32], in_feat: usize) {
        let mut g = self.lock();
        if let Some((sums, count)) = g.as_mut() {
            for row in x.chunks_exact(in_feat) {
                for (s, &v) in sums.iter_mut().zip(row) {
                    *s += (v as f64) * (v as f64);
                }
                *count += 1;
            }
        }
    }

    /// The mean of `x_i^2`; tracking stops.
    pub fn end(&self) -> Result<Vec<f32>> {
        match self.lock().take() {
            None => Err(QuantError::InvalidState(
                "end_track_stats called without begin_track_stats".into(),
            )),
            Some((_, 0)) => Err(QuantError::InvalidState(
                "no rows went through forward since begin_track_stats".into(),
            )),
            Some((sums, n)) => Ok(sums.iter().map(|s| (s / n as f64) as f32).collect()),
        }
    }
}
