//! Helpers that wait, spinning, for the next fork-join call once they have
//! finished their share of one (what an OpenMP runtime's threads do between
//! parallel regions).
//!
//! Why: a pool thread that goes to sleep between calls must be woken by the
//! next one, and on a virtual machine whose other CPU has gone idle that
//! takes from tens of microseconds to a millisecond (docs/benchmarks.md,
//! "Fork-join"): as long as a whole prefill call of a small layer, which then
//! ran on the calling thread alone. A helper that has finished a call
//! instead watches for the next one for [`linger_time`] before it goes back
//! to rayon, so the back-to-back calls of a forward pass find it awake.
//!
//! The handshake: a caller posts its job (a new epoch), then counts the
//! waiting helpers and asks rayon only for the rest; a waiting helper whose
//! time is up leaves the count, then looks at the epoch once more. Both
//! sides write, then read (all `SeqCst`), so either the caller counted the
//! helper and the helper sees the new epoch, or the caller did not count it
//! and spawned its own helpers.

use std::cell::Cell;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

use super::{thread_limit, Shared};

/// How long a helper waits for the next call unless `QUANTRS_SPIN_US` says
/// otherwise: not at all. On the loaded 2-vCPU Zen 3 host a wait of 500 us
/// (longer than the Python and attention work between two linear layers of
/// a prefill forward) sped small prefill calls up by 1.1-1.4x and slowed
/// others (docs/benchmarks.md, "Prefill", Zen 3), and a waiting thread takes
/// the core torch's own threads want between our calls, so the wait is
/// opt-in until a quiet host shows what it does to a whole model. The unit
/// tests run with it, so that the handshake is exercised.
const DEFAULT_LINGER_US: u64 = if cfg!(test) { 500 } else { 0 };

/// The epoch of the last job posted.
static EPOCH: AtomicU64 = AtomicU64::new(0);
/// The last job posted and its epoch, until its caller withdraws it.
static POSTED: Mutex<Option<(u64, Arc<Shared>)>> = Mutex::new(None);
/// Helpers waiting now.
static WAITING: AtomicUsize = AtomicUsize::new(0);

/// How long a helper waits: `QUANTRS_SPIN_US` microseconds (0: a helper
/// goes back to rayon as soon as its share is done), read once.
pub(super) fn linger_time() -> Duration {
    static TIME: OnceLock<Duration> = OnceLock::new();
    *TIME.get_or_init(|| {
        let us = std::env::var("QUANTRS_SPIN_US")
            .ok()
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(DEFAULT_LINGER_US);
        Duration::from_micros(us)
    })
}

fn posted() -> MutexGuard<'static, Option<(u64, Arc<Shared>)>> {
    // The slot holds no invariant a panic could break.
    POSTED.lock().unwrap_or_else(|e| e.into_inner())
}

/// Make `job` the one waiting helpers take; returns its epoch.
pub(super) fn post(job: &Arc<Shared>) -> u64 {
    let mut slot = posted();
    let epoch = EPOCH.fetch_add(1, SeqCst) + 1;
    *slot = Some((epoch, Arc::clone(job)));
    epoch
}

/// Helpers waiting now (read after [`post`]).
pub(super) fn count() -> usize {
    WAITING.load(SeqCst)
}

/// Take `job` back (its caller has closed it): the slot no longer keeps it.
pub(super) fn withdraw(job: &Arc<Shared>) {
    let mut slot = posted();
    if slot.as_ref().is_some_and(|(_, j)| Arc::ptr_eq(j, job)) {
        *slot = None;
    }
}

/// Count this helper in as waiting, unless enough are (one fewer than the
/// threads a call may use: the caller is the other).
fn enlist() -> bool {
    let most = thread_limit().saturating_sub(1);
    let mut now = WAITING.load(SeqCst);
    loop {
        if now >= most {
            return false;
        }
        match WAITING.compare_exchange_weak(now, now + 1, SeqCst, SeqCst) {
            Ok(_) => return true,
            Err(v) => now = v,
        }
    }
}

/// After helping with the job of epoch `seen`: wait for newer jobs and help
/// with each, until none comes for [`linger_time`].
pub(super) fn linger(seen: u64) {
    thread_local! {
        /// Whether this thread is lingering already (a job it runs from
        /// rayon's queue while waiting may be another call's helper).
        static LINGERING: Cell<bool> = const { Cell::new(false) };
    }
    let time = linger_time();
    if time.is_zero() || LINGERING.get() || !enlist() {
        return;
    }
    LINGERING.set(true);
    let _reset = Reset(&LINGERING);
    wait_for_calls(seen, time);
}

/// Clears a thread-local flag when dropped (a panic in a job run while
/// lingering included).
struct Reset(&'static std::thread::LocalKey<Cell<bool>>);

impl Drop for Reset {
    fn drop(&mut self) {
        self.0.set(false);
    }
}

/// The waiting of [`linger`], counted in [`WAITING`] on entry.
fn wait_for_calls(mut seen: u64, time: Duration) {
    let mut deadline = Instant::now() + time;
    let mut spins = 0u32;
    loop {
        let expired = EPOCH.load(SeqCst) == seen && {
            spins = spins.wrapping_add(1);
            spins.is_multiple_of(64) && Instant::now() >= deadline
        };
        if EPOCH.load(SeqCst) != seen || expired {
            // Not counted while working (a call posted meanwhile asks rayon
            // for its helpers) nor after leaving; then the second look of
            // the handshake (module docs).
            WAITING.fetch_sub(1, SeqCst);
            let epoch = EPOCH.load(SeqCst);
            if epoch == seen {
                return;
            }
            let job = posted()
                .as_ref()
                .filter(|(e, _)| *e != seen)
                .map(|(e, j)| (*e, Arc::clone(j)));
            match job {
                Some((e, job)) => {
                    seen = e;
                    job.help();
                }
                None => seen = epoch,
            }
            if !enlist() {
                return;
            }
            deadline = Instant::now() + time;
            continue;
        }
        std::hint::spin_loop();
        if spins.is_multiple_of(64) {
            // Other rayon work queued meanwhile (an optimizer's `par_iter`,
            // say) runs here rather than waiting for this thread to give up.
            rayon::yield_now();
        }
        if spins.is_multiple_of(1024) {
            // Let another thread that is ready on this core run.
            std::thread::yield_now();
        }
    }
}
