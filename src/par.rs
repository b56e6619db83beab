//! Fork-join over numbered blocks with the calling thread working too.
//!
//! Why not a plain rayon `par_iter`: called from a thread outside the pool
//! (Python's, say), rayon queues the whole job, puts the caller to sleep and
//! wakes it when the pool is done, and on a virtual machine a wake-up is a
//! large share of a millisecond-long matvec (figures in docs/benchmarks.md).
//! [`for_each_block`] instead starts working on the
//! calling thread at once, hands blocks out one at a time from a shared
//! counter, and asks the pool for helpers that join whenever they wake; a
//! helper that wakes after the work is gone leaves without touching it, so
//! the caller never waits for a wake-up, only for blocks already started.
//! A helper that has done its share waits a little for the next call
//! ([`waiting`]), so that back-to-back calls find it awake.
//!
//! The blocks a thread runs depend on timing, so callers that need results
//! independent of the thread count give each block its own output (and
//! combine the outputs in block order afterwards).

use std::any::Any;
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

mod capped;
mod waiting;

#[cfg(feature = "python")]
pub use capped::run_capped;

/// Run `f(b)` once for every `b` in `0..count`, on the calling thread and on
/// pool threads, at most one fewer than the cores at once (see
/// `Shared::enter`). Returns when every block has finished.
///
/// Every pool thread is asked to help, not one fewer than the cores (the
/// caller being the other): a pool that has gone to sleep wakes one thread
/// per queued job, slowly, so asking all lets the first one awake join; one
/// that finds no block left, or the cores all busy, leaves.
pub fn for_each_block<F: Fn(usize) + Sync>(count: usize, f: F) {
    let helpers = rayon::current_num_threads().min(count.saturating_sub(1));
    let max_inside = helpers.min(thread_limit().saturating_sub(1));
    if max_inside == 0 {
        (0..count).for_each(f);
        return;
    }
    let job: &(dyn Fn(usize) + Sync) = &f;
    // SAFETY: the lifetime is erased so that helpers (which rayon requires to
    // be 'static) can hold the pointer; they only dereference it after
    // entering (see `Shared::enter`), and this function does not return
    // while any helper is entered, nor lets one enter after it has closed.
    let job: *const (dyn Fn(usize) + Sync + 'static) = unsafe { std::mem::transmute(job) };
    let shared = Arc::new(Shared {
        next: AtomicUsize::new(0),
        count,
        max_inside,
        state: AtomicUsize::new(0),
        job: JobPtr(job),
        panic: Mutex::new(None),
    });
    {
        // Closes the job and waits for the helpers inside it when this
        // scope ends, normally or by a panic in `f` on this thread: either
        // way no helper may still be using `f` (or what it borrows) after
        // we leave. Made before any helper exists.
        let _close = CloseAndWait(&shared);
        // Helpers still waiting after an earlier call take this one as soon
        // as it is posted; rayon is asked only for the rest.
        let epoch = waiting::post(&shared);
        let ready = waiting::count();
        // Enough waiting helpers: none asked of rayon (a woken thread that
        // finds the job full would only take a core from those working).
        // Otherwise every pool thread, as explained above.
        let spawn = if ready >= max_inside { 0 } else { helpers };
        for _ in 0..spawn {
            let s = Arc::clone(&shared);
            rayon::spawn(move || {
                s.help();
                waiting::linger(epoch);
            });
        }
        shared.run(&f);
    }
    waiting::withdraw(&shared);
    // Every helper has left (`_close`); a panic in one of them surfaces here.
    let caught = shared
        .panic
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .take();
    if let Some(p) = caught {
        resume_unwind(p);
    }
}

/// Most threads (the caller included) a [`for_each_block`] call runs on at
/// once; 0 means "every core" (see [`set_thread_limit`]).
static THREAD_LIMIT: AtomicUsize = AtomicUsize::new(0);

/// Cap the threads (the caller included) that the batch-1 and small-batch
/// kernels (the fork-join of this module) work on at once, process-wide;
/// `None` lifts the cap (every core). Returns the previous cap. A cap of 1
/// runs every block on the calling thread: the choice for a loop whose other
/// library (OpenBLAS, OpenMP) keeps threads spinning on the other cores
/// between our calls (docs/int4.md, "Threads"). Python's `quantrs.threads`.
pub fn set_thread_limit(limit: Option<usize>) -> Option<usize> {
    let prev = THREAD_LIMIT.swap(limit.map_or(0, |n| n.max(1)), Ordering::Relaxed);
    (prev != 0).then_some(prev)
}

/// The cap set by [`set_thread_limit`], `None` when there is none.
pub fn thread_cap() -> Option<usize> {
    match THREAD_LIMIT.load(Ordering::Relaxed) {
        0 => None,
        n => Some(n),
    }
}

/// Threads a [`for_each_block`] call may use at once: the cores, or fewer
/// under a cap.
pub fn thread_limit() -> usize {
    thread_cap().map_or(cores(), |n| n.min(cores()))
}

/// The CPUs this process may run on (detected once).
fn cores() -> usize {
    static CORES: OnceLock<usize> = OnceLock::new();
    *CORES.get_or_init(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
}

/// See `for_each_block`.
struct CloseAndWait<'a>(&'a Shared);

impl Drop for CloseAndWait<'_> {
    fn drop(&mut self) {
        // No block is handed out from now on (after a normal return none
        // is left anyway), no helper may enter; wait for those working.
        self.0.next.fetch_max(self.0.count, Ordering::Relaxed);
        let state = &self.0.state;
        state.fetch_or(CLOSED, Ordering::AcqRel);
        let mut spins = 0u32;
        while state.load(Ordering::Acquire) & !CLOSED != 0 {
            spins += 1;
            if spins < 1 << 12 {
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
        }
    }
}

/// `state` bit set once the caller has finished its share; the other bits
/// count the helpers inside the job.
const CLOSED: usize = 1 << (usize::BITS - 1);

struct Shared {
    next: AtomicUsize,
    count: usize,
    /// Most helpers working at once: one fewer than the cores, the caller
    /// being the other (see `enter`).
    max_inside: usize,
    state: AtomicUsize,
    job: JobPtr,
    /// The first panic of a helper's block, rethrown on the calling thread.
    panic: Mutex<Option<Box<dyn Any + Send>>>,
}

/// The caller's closure, lifetime erased (see `for_each_block`).
struct JobPtr(*const (dyn Fn(usize) + Sync + 'static));

// SAFETY: the pointee is `Sync` (shared calls from several threads are what
// it is for), and the entry protocol keeps it alive while it is used.
unsafe impl Send for JobPtr {}
// SAFETY: as above.
unsafe impl Sync for JobPtr {}

impl Shared {
    /// Count this helper in, unless the caller has closed the job or
    /// enough helpers are already inside. Every pool thread is asked (the
    /// first awake should join), but a block of a helper that shares a core
    /// with the caller or another helper runs at a fraction of the speed and
    /// the call would wait for it at the end.
    fn enter(&self) -> bool {
        let mut s = self.state.load(Ordering::Acquire);
        loop {
            if s & CLOSED != 0 || s >= self.max_inside {
                return false;
            }
            match self
                .state
                .compare_exchange_weak(s, s + 1, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => return true,
                Err(now) => s = now,
            }
        }
    }

    /// A helper's share: enter, run blocks until none is left, leave.
    fn help(&self) {
        if self.enter() {
            let _leave = Leave(&self.state);
            // SAFETY: entered, so the caller is still inside
            // `for_each_block` and `f` is alive (see there).
            let f = unsafe { &*self.job.0 };
            // A panic must not reach rayon (which aborts on a panicking
            // `spawn`): keep it for the caller to rethrow, and hand out no
            // more blocks.
            if let Err(p) = catch_unwind(AssertUnwindSafe(|| self.run(f))) {
                self.next.fetch_max(self.count, Ordering::Relaxed);
                let mut slot = self.panic.lock().unwrap_or_else(|e| e.into_inner());
                slot.get_or_insert(p);
            }
        }
    }

    fn run(&self, f: &(dyn Fn(usize) + Sync)) {
        loop {
            let b = self.next.fetch_add(1, Ordering::Relaxed);
            if b >= self.count {
                return;
            }
            f(b);
        }
    }
}

/// Counts a helper out when it finishes (or unwinds), publishing its writes.
struct Leave<'a>(&'a AtomicUsize);

impl Drop for Leave<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    #[test]
    fn every_block_runs_exactly_once() {
        for count in [0, 1, 2, 3, 17, 1000] {
            let hits: Vec<AtomicUsize> = (0..count).map(|_| AtomicUsize::new(0)).collect();
            for_each_block(count, |b| {
                hits[b].fetch_add(1, Ordering::Relaxed);
            });
            assert!(
                hits.iter().all(|h| h.load(Ordering::Relaxed) == 1),
                "count {count}"
            );
        }
    }

    #[test]
    fn writes_are_visible_to_the_caller_and_borrows_end_on_return() {
        for round in 0..200 {
            let mut out = vec![0usize; 64];
            {
                let slots: Vec<Mutex<&mut usize>> = out.iter_mut().map(Mutex::new).collect();
                for_each_block(slots.len(), |b| {
                    // A little work so that helpers get a share.
                    let v = (0..200).fold(b, |a, i| a.wrapping_mul(31).wrapping_add(i));
                    **slots[b].lock().unwrap() = v ^ round;
                });
            }
            for (b, &v) in out.iter().enumerate() {
                let want = (0..200).fold(b, |a, i| a.wrapping_mul(31).wrapping_add(i)) ^ round;
                assert_eq!(v, want);
            }
        }
    }

    #[test]
    fn a_panic_in_any_block_reaches_the_caller_after_the_helpers_stop() {
        for bad in [0usize, 1, 7, 63] {
            let done = AtomicUsize::new(0);
            let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                for_each_block(64, |b| {
                    if b == bad {
                        panic!("block {b}");
                    }
                    std::thread::sleep(std::time::Duration::from_micros(200));
                    done.fetch_add(1, Ordering::Relaxed);
                });
            }));
            let msg = r.expect_err("the panic must reach the caller");
            assert_eq!(
                msg.downcast_ref::<String>().map(String::as_str),
                Some(&*format!("block {bad}"))
            );
            // Every block a helper started had finished before the unwind
            // left `for_each_block`: the count no longer moves.
            let seen = done.load(Ordering::Relaxed);
            std::thread::sleep(std::time::Duration::from_millis(5));
            assert_eq!(done.load(Ordering::Relaxed), seen);
        }
    }

    #[test]
    fn no_more_threads_work_at_once_than_there_are_cores() {
        // Without the cap every pool thread that wakes joins the caller, one
        // more than the cores; a block sharing a core then holds up the end.
        let (active, most) = (AtomicUsize::new(0), AtomicUsize::new(0));
        for _ in 0..20 {
            for_each_block(32, |_| {
                let now = active.fetch_add(1, Ordering::SeqCst) + 1;
                most.fetch_max(now, Ordering::SeqCst);
                std::thread::sleep(std::time::Duration::from_micros(100));
                active.fetch_sub(1, Ordering::SeqCst);
            });
        }
        let most = most.load(Ordering::SeqCst);
        assert!(
            most >= 1 && most <= cores(),
            "{most} threads at once, {} cores",
            cores()
        );
    }

    #[test]
    fn a_cap_of_one_runs_every_block_on_the_caller() {
        // Process-wide state: restore it even if an assertion fails, and keep
        // the capped section short (other tests run in parallel).
        struct Restore(Option<usize>);
        impl Drop for Restore {
            fn drop(&mut self) {
                set_thread_limit(self.0);
            }
        }
        let _restore = Restore(set_thread_limit(Some(1)));
        assert_eq!(thread_cap(), Some(1));
        assert_eq!(thread_limit(), 1);
        let me = std::thread::current().id();
        let others = AtomicUsize::new(0);
        for_each_block(64, |_| {
            if std::thread::current().id() != me {
                others.fetch_add(1, Ordering::Relaxed);
            }
        });
        assert_eq!(others.load(Ordering::Relaxed), 0);
        assert_eq!(set_thread_limit(Some(0)), Some(1), "0 is raised to 1");
        assert_eq!(thread_limit(), 1);
    }

    #[test]
    fn nested_calls_from_pool_threads_finish() {
        let total = AtomicUsize::new(0);
        for_each_block(8, |_| {
            for_each_block(8, |_| {
                total.fetch_add(1, Ordering::Relaxed);
            });
        });
        assert_eq!(total.load(Ordering::Relaxed), 64);
    }
}
