//! A parallel loop in which the calling thread takes part.
//!
//! A rayon parallel iterator started from a thread outside the pool (the engine's
//! thread) hands the whole job over and puts the caller to sleep until it is done:
//! two thread wake-ups per call, tens of microseconds on a busy or virtualized
//! machine, against a decode matmul that itself takes tens of microseconds. Here
//! the caller works through chunks itself while up to `threads - 1` pool workers
//! join in (one `rayon::spawn` each, no waiting on their start), and it spins
//! only for chunks still running on a worker when it runs out of chunks.

use std::ops::Range;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

/// The shared state of one loop. `f` borrows the caller's stack: it is only
/// called after a chunk was claimed, and the caller does not return before every
/// claimed chunk has finished, so the borrow is live whenever it is used.
struct Shared {
    next: AtomicUsize,
    done: AtomicUsize,
    panicked: AtomicBool,
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
    fn work(&self) {
        loop {
            let c = self.next.fetch_add(1, Ordering::Relaxed);
            if c >= self.chunks {
                return;
            }
            let range = c * self.chunk..((c + 1) * self.chunk).min(self.total);
            // SAFETY: chunk `c` was claimed, so the caller is still waiting and
            // the closure is alive (see `Shared`).
            let f = unsafe { &*self.f };
            if catch_unwind(AssertUnwindSafe(|| f(range))).is_err() {
                self.panicked.store(true, Ordering::Relaxed);
            }
            self.done.fetch_add(1, Ordering::Release);
        }
    }
}

/// Calls `f` on consecutive ranges of at most `chunk` items covering `0..total`,
/// on this thread and on up to `rayon::current_num_threads() - 1` pool workers.
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
    // SAFETY: only the lifetime is erased; see `Shared` for why uses stay
    // within it.
    let f: *const (dyn Fn(Range<usize>) + Sync + 'static) = unsafe { std::mem::transmute(f) };
    let shared = Arc::new(Shared {
        next: AtomicUsize::new(0),
        done: AtomicUsize::new(0),
        panicked: AtomicBool::new(false),
        chunks,
        chunk,
        total,
        f,
    });
    for _ in 0..helpers {
        let s = Arc::clone(&shared);
        rayon::spawn(move || s.work());
    }
    shared.work();
    let mut spins = 0u32;
    while shared.done.load(Ordering::Acquire) < chunks {
        if spins < 2000 {
            std::hint::spin_loop();
            spins += 1;
        } else {
            // A worker was descheduled mid-chunk: let it run.
            std::thread::yield_now();
        }
    }
    if shared.panicked.load(Ordering::Relaxed) {
        panic!("a parallel matmul chunk panicked");
    }
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
