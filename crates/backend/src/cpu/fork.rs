//! A parallel loop in which the calling thread takes part, on a persistent
//! pool of helper threads.
//!
//! A rayon parallel iterator started from a thread outside the pool (the engine's
//! thread) hands the whole job over and puts the caller to sleep until it is done:
//! two thread wake-ups per call, tens of microseconds on a busy or virtualized
//! machine, against a decode matmul that itself takes tens of microseconds. Here
//! the caller publishes the loop (on its own stack: nothing is allocated) and
//! works through chunks itself while up to `threads - 1` helpers join in. The
//! helpers spin for a while after each loop, so the next one, microseconds later
//! in a decode step, starts without a wake-up, then sleep on a condition
//! variable. One caller uses the helpers at a time; a loop started while they
//! are taken (another thread's, or one nested in a chunk) hands its extra
//! chunks to rayon workers instead.

use std::ops::Range;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::ptr;
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicUsize, Ordering::*};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

/// The shared state of one loop. `f` borrows the caller's stack: it is only
/// called after a chunk was claimed, and the caller does not return before every
/// claimed chunk has finished, so the borrow is live whenever it is used.
struct Shared {
    next: AtomicUsize,
    done: AtomicUsize,
    panicked: AtomicBool,
    /// Helpers that joined (at most `helpers` work).
    joined: AtomicUsize,
    helpers: usize,
    chunks: usize,
    chunk: usize,
    total: usize,
    f: *const (dyn Fn(Range<usize>) + Sync),
}

// SAFETY: `f` points at a `Sync` closure that outlives every use (see above);
// the rest is atomics and plain integers.
unsafe impl Send for Shared {}
unsafe impl Sync for Shared {}

impl Shared {
    fn new(total: usize, chunk: usize, helpers: usize, f: &(dyn Fn(Range<usize>) + Sync)) -> Shared {
        Shared {
            next: AtomicUsize::new(0),
            done: AtomicUsize::new(0),
            panicked: AtomicBool::new(false),
            joined: AtomicUsize::new(0),
            helpers,
            chunks: total.div_ceil(chunk),
            chunk,
            total,
            // SAFETY: only the lifetime is erased; see `Shared` for why uses
            // stay within it.
            f: unsafe { std::mem::transmute::<&(dyn Fn(Range<usize>) + Sync), _>(f) },
        }
    }

    fn work(&self) {
        loop {
            let c = self.next.fetch_add(1, Relaxed);
            if c >= self.chunks {
                return;
            }
            let range = c * self.chunk..((c + 1) * self.chunk).min(self.total);
            // SAFETY: chunk `c` was claimed, so the caller is still waiting and
            // the closure is alive (see `Shared`).
            let f = unsafe { &*self.f };
            if catch_unwind(AssertUnwindSafe(|| f(range))).is_err() {
                self.panicked.store(true, Relaxed);
            }
            self.done.fetch_add(1, Release);
        }
    }

    /// Waits (spinning, then yielding) until every chunk has finished.
    fn wait_done(&self) {
        let mut spins = 0u32;
        while self.done.load(Acquire) < self.chunks {
            if spins < 2000 {
                std::hint::spin_loop();
                spins += 1;
            } else {
                // A helper was descheduled mid-chunk: let it run.
                std::thread::yield_now();
            }
        }
        if self.panicked.load(Relaxed) {
            panic!("a parallel loop's chunk panicked");
        }
    }
}

/// How long helpers spin for the next loop before they sleep: longer than
/// the gaps between the loops of a decode step and between steps.
const SPIN: Duration = Duration::from_millis(2);

/// The helpers' shared state (one per process).
struct Helpers {
    /// Set while a caller uses the helpers.
    taken: AtomicBool,
    /// The running loop, or null.
    job: AtomicPtr<Shared>,
    /// Counts published loops; helpers wait for it to move.
    epoch: AtomicUsize,
    /// Helpers between reading `job` and leaving it: the caller waits for
    /// none before its `Shared` goes out of scope.
    inside: AtomicUsize,
    /// Helper threads started (grows to the most a loop asked for).
    started: AtomicUsize,
    sleepers: AtomicUsize,
    lock: Mutex<()>,
    wake: Condvar,
}

static HELPERS: Helpers = Helpers {
    taken: AtomicBool::new(false),
    job: AtomicPtr::new(ptr::null_mut()),
    epoch: AtomicUsize::new(0),
    inside: AtomicUsize::new(0),
    started: AtomicUsize::new(0),
    sleepers: AtomicUsize::new(0),
    lock: Mutex::new(()),
    wake: Condvar::new(),
};

impl Helpers {
    /// A helper thread's life: wait for a loop, join it, repeat.
    fn serve(&self) {
        let mut seen = self.epoch.load(SeqCst);
        loop {
            seen = self.next_epoch(seen);
            self.inside.fetch_add(1, SeqCst);
            let job = self.job.load(SeqCst);
            if !job.is_null() {
                // SAFETY: `job` was read while this helper is counted in
                // `inside`, which its caller waits to fall to zero after
                // clearing `job` and before the `Shared` goes away.
                let s = unsafe { &*job };
                if s.joined.fetch_add(1, Relaxed) < s.helpers {
                    s.work();
                }
            }
            self.inside.fetch_sub(1, SeqCst);
        }
    }

    /// Spins, then sleeps, until `epoch` differs from `seen`; returns it.
    fn next_epoch(&self, seen: usize) -> usize {
        let start = Instant::now();
        let mut spins = 0u32;
        loop {
            let e = self.epoch.load(SeqCst);
            if e != seen {
                return e;
            }
            std::hint::spin_loop();
            spins = spins.wrapping_add(1);
            if spins.is_multiple_of(256) && start.elapsed() > SPIN {
                break;
            }
        }
        let mut guard = self.lock.lock().unwrap_or_else(|e| e.into_inner());
        self.sleepers.fetch_add(1, SeqCst);
        let mut e = self.epoch.load(SeqCst);
        while e == seen {
            guard = self.wake.wait(guard).unwrap_or_else(|e| e.into_inner());
            e = self.epoch.load(SeqCst);
        }
        self.sleepers.fetch_sub(1, SeqCst);
        e
    }

    /// Starts helper threads up to `n`; false if the system refused one.
    fn ensure(&'static self, n: usize) -> bool {
        while self.started.load(Relaxed) < n {
            let i = self.started.load(Relaxed);
            let spawned = std::thread::Builder::new().name(format!("ferrite-cpu-{i}")).spawn(move || self.serve());
            if spawned.is_err() {
                return false;
            }
            self.started.fetch_add(1, Relaxed);
        }
        true
    }

    /// Runs `s` on the caller and the helpers (the caller holds `taken`).
    fn run(&self, s: &Shared) {
        self.job.store(s as *const Shared as *mut Shared, SeqCst);
        self.epoch.fetch_add(1, SeqCst);
        if self.sleepers.load(SeqCst) > 0 {
            let _guard = self.lock.lock().unwrap_or_else(|e| e.into_inner());
            self.wake.notify_all();
        }
        let result = catch_unwind(AssertUnwindSafe(|| {
            s.work();
            s.wait_done();
        }));
        self.job.store(ptr::null_mut(), SeqCst);
        while self.inside.load(SeqCst) > 0 {
            std::hint::spin_loop();
        }
        self.taken.store(false, Release);
        if let Err(e) = result {
            std::panic::resume_unwind(e);
        }
    }
}

/// Calls `f` on consecutive ranges of at most `chunk` items covering `0..total`,
/// on this thread and on up to `rayon::current_num_threads() - 1` helpers.
/// Which thread runs a range varies from call to call, so `f`'s results must not
/// depend on it.
pub fn for_each_chunk(total: usize, chunk: usize, f: &(dyn Fn(Range<usize>) + Sync)) {
    let chunk = chunk.max(1);
    let chunks = total.div_ceil(chunk);
    let helpers = rayon::current_num_threads().saturating_sub(1).min(chunks.saturating_sub(1));
    if helpers == 0 {
        if total > 0 {
            f(0..total);
        }
        return;
    }
    let h = &HELPERS;
    if h.taken.compare_exchange(false, true, Acquire, Relaxed).is_ok() {
        if h.ensure(helpers) {
            h.run(&Shared::new(total, chunk, helpers, f));
            return;
        }
        h.taken.store(false, Release);
    }
    // The helpers are taken: rayon workers join instead (one job each).
    let shared = Arc::new(Shared::new(total, chunk, helpers, f));
    for _ in 0..helpers {
        let s = Arc::clone(&shared);
        rayon::spawn(move || s.work());
    }
    shared.work();
    shared.wait_done();
}

/// A raw pointer to a buffer that the chunks of one parallel loop write, each
/// a disjoint set of elements (the users' SAFETY comments say which).
pub struct SendPtr<T>(pub *mut T);
impl<T> Clone for SendPtr<T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T> Copy for SendPtr<T> {}
// SAFETY: every user writes disjoint elements from its chunks, and the buffer
// outlives the parallel loop that uses the pointer.
unsafe impl<T> Send for SendPtr<T> {}
unsafe impl<T> Sync for SendPtr<T> {}

impl<T> SendPtr<T> {
    /// The pointer (a method, so closures capture the whole `Send` wrapper).
    #[inline(always)]
    pub fn get(self) -> *mut T {
        self.0
    }
}

/// `out` is `unit`-sized items; calls `f(first_item, items)` on consecutive runs
/// of at most `items_per_chunk` items, in parallel like `for_each_chunk`.
pub fn for_each_chunk_mut<T: Send>(
    out: &mut [T],
    unit: usize,
    items_per_chunk: usize,
    f: &(dyn Fn(usize, &mut [T]) + Sync),
) {
    let unit = unit.max(1);
    let items = out.len() / unit;
    let ptr = SendPtr(out.as_mut_ptr());
    for_each_chunk(items, items_per_chunk, &|r: Range<usize>| {
        let p = &ptr;
        // SAFETY: `for_each_chunk` hands out disjoint item ranges within
        // `0..items`, so these slices of `out` never overlap, and `out` stays
        // borrowed mutably until every chunk has finished.
        let s = unsafe { std::slice::from_raw_parts_mut(p.get().add(r.start * unit), r.len() * unit) };
        f(r.start, s)
    });
}
