//! The CPU decode loop allocates nothing per layer or op: a warm decode step
//! of smollm2 (30 layers, ~210 ops) makes only the step's own few
//! allocations, counted by a global allocator across every thread, on one
//! thread and on several (the parallel loops' helpers included).
//!
//! Its own test binary: the counter sees this test alone.

mod common;
use common::*;

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

use ferrite_engine::{Logits, Sequence};

struct Counting;
static ALLOCATIONS: AtomicUsize = AtomicUsize::new(0);

// SAFETY: forwards to the system allocator; only counts.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        unsafe { System.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        unsafe { System.realloc(ptr, layout, new_size) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// The logits handed back each step, a block added to the sequence's table
/// now and then, and a helper thread's first use of its scratch buffers
/// (which helper runs which chunk varies, more so on a loaded machine).
/// Anything per layer or op would be 30 or more a step.
fn allowed(steps: usize, threads: usize) -> usize {
    steps + 2 + 2 * threads
}

#[test]
fn warm_decode_steps_allocate_almost_nothing() {
    model_path("smollm2.gguf");
    for threads in [1, 2, 3] {
        let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap();
        pool.install(|| {
            let mut runner = runner_for("smollm2", 256);
            let mut tokens = Vec::with_capacity(256);
            tokens.extend([1u32, 504, 3458, 314, 260, 1345, 28]);
            let mut seq = Sequence::new(tokens);
            let mut step = |seq: &mut Sequence| {
                let logits = runner.step(&mut [seq], 4096, Logits::Last).unwrap();
                seq.tokens.push(argmax(&logits) as u32);
            };
            step(&mut seq); // prefill
            for _ in 0..4 {
                step(&mut seq); // warm-up: buffers, pools, helper threads
            }
            const STEPS: usize = 16;
            let before = ALLOCATIONS.load(Ordering::SeqCst);
            for _ in 0..STEPS {
                step(&mut seq);
            }
            let made = ALLOCATIONS.load(Ordering::SeqCst) - before;
            assert!(
                made <= allowed(STEPS, threads),
                "{threads} threads: {made} allocations in {STEPS} warm decode steps (at most {} allowed)",
                allowed(STEPS, threads)
            );
            eprintln!("{threads} threads: {made} allocations in {STEPS} warm decode steps");
        });
    }
}
