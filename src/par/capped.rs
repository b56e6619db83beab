//! Rayon work (a quantizer's `par_chunks` over rows) under the thread cap
//! of [`super::set_thread_limit`], which otherwise only the fork-join
//! kernels of this module read: `quantrs.threads(1)` must keep every
//! quantrs call on one thread, the whole-matrix quantizers included.
//!
//! Rayon's global pool cannot be resized once built, so a capped call runs
//! in a pool of its own with the cap's threads, built on the first capped
//! call and kept (with its size) for the next ones; without a cap, or with
//! a cap no smaller than the global pool, the work runs on the global pool
//! as before.

// Its one caller is the Python bindings' quantizers.
#![cfg_attr(not(feature = "python"), allow(dead_code))]

use std::sync::{Arc, Mutex, OnceLock};

use rayon::{ThreadPool, ThreadPoolBuilder};

/// Run `f` (which may use rayon's parallel iterators) on at most
/// [`super::thread_limit`] threads: in the global pool when the cap allows
/// all of it, else in a pool of the cap's size (one thread for a cap of 1:
/// a parallel iterator called outside any pool would go to the global
/// one). What `f` computes must not depend on the thread count (rows
/// quantized independently), only how long it takes.
pub fn run_capped<R: Send>(f: impl FnOnce() -> R + Send) -> R {
    run_on(super::thread_limit(), f)
}

/// [`run_capped`] under the cap `limit` (at least 1).
fn run_on<R: Send>(limit: usize, f: impl FnOnce() -> R + Send) -> R {
    if limit >= rayon::current_num_threads() {
        return f();
    }
    match pool_of(limit) {
        Some(pool) => pool.install(f),
        // The OS refused the threads: run, uncapped, rather than fail.
        None => f(),
    }
}

/// The capped pool of `threads` threads (rebuilt when the cap changes).
fn pool_of(threads: usize) -> Option<Arc<ThreadPool>> {
    static POOL: OnceLock<Mutex<Option<Arc<ThreadPool>>>> = OnceLock::new();
    let mut slot = POOL
        .get_or_init(|| Mutex::new(None))
        .lock()
        .unwrap_or_else(|e| e.into_inner());
    if let Some(p) = slot.as_ref().filter(|p| p.current_num_threads() == threads) {
        return Some(Arc::clone(p));
    }
    let pool = ThreadPoolBuilder::new()
        .num_threads(threads)
        // Linux keeps 15 bytes of a thread's name.
        .thread_name(|i| format!("quantrs-cap-{i}"))
        .build()
        .ok()
        .map(Arc::new)?;
    *slot = Some(Arc::clone(&pool));
    Some(pool)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rayon::prelude::*;
    use std::collections::HashSet;
    use std::thread::ThreadId;

    /// The distinct threads that run the items of a parallel iterator
    /// under the cap `limit` (items that sleep a little, so that an idle
    /// pool thread would steal some).
    fn threads_used(limit: usize) -> HashSet<ThreadId> {
        run_on(limit, || {
            (0..64)
                .into_par_iter()
                .map(|_| {
                    std::thread::sleep(std::time::Duration::from_micros(200));
                    std::thread::current().id()
                })
                .collect()
        })
    }

    #[test]
    fn a_cap_bounds_the_threads_that_run_parallel_iterators() {
        let pool = rayon::current_num_threads();
        for limit in 1..pool {
            let used = threads_used(limit);
            assert!(
                !used.is_empty() && used.len() <= limit,
                "{limit}: {}",
                used.len()
            );
            assert!(!used.contains(&std::thread::current().id()));
        }
        // Under no cap (or one above the pool) the global pool runs it.
        assert!(threads_used(pool).len() <= pool);
        assert_eq!(run_on(1, rayon::current_num_threads), 1);
        assert_eq!(run_on(pool + 1, rayon::current_num_threads), pool);
    }
}
