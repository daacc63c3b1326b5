//! Allocator tuning for the forward passes.
//!
//! Every op returns a fresh activation buffer, often several megabytes (a
//! prefill chunk or an embedding batch). glibc serves blocks that large with
//! mmap and returns them on free, so each op would pay page faults and the
//! kernel's zeroing of every page again. Raising the mmap threshold keeps such
//! buffers in the heap, where freed memory is reused at once.

/// Call once, before any large allocation.
pub fn tune() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only changes allocator parameters; it is called before
    // any other thread exists.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 512 << 20);
        libc::mallopt(libc::M_TRIM_THRESHOLD, 1 << 30);
    }
}
