//! Reused tensor buffers: a dropped tensor's values go to a small per-thread
//! free list, and the next op's output of a size that fits takes them, so
//! decode steps (the same shapes every token) do not allocate their ops'
//! outputs once warm. Large buffers (prefill activations, all-position
//! logits) are freed, not kept.

use std::cell::RefCell;

/// Buffers kept at most per thread (a decoder layer's live tensors and some),
/// and the largest one kept (a decode step's logits over a 262,144-token
/// vocabulary take 1 MiB).
const KEEP: usize = 64;
const KEEP_FLOATS: usize = 1 << 20;

thread_local! {
    static FREE: RefCell<Vec<Vec<f32>>> = const { RefCell::new(Vec::new()) };
}

/// `n` zeros, in a returned buffer whose capacity fits (at most twice `n`,
/// so a large buffer does not serve a small tensor), else a new one.
pub fn zeroed(n: usize) -> Vec<f32> {
    let reused = FREE.with_borrow_mut(|free| {
        let i = free.iter().position(|v| v.capacity() >= n && v.capacity() <= 2 * n.max(16))?;
        Some(free.swap_remove(i))
    });
    match reused {
        Some(mut v) => {
            v.clear();
            v.resize(n, 0.0);
            v
        }
        None => vec![0f32; n],
    }
}

/// Keeps `v` for a later `zeroed` (or frees it when the list is full).
pub fn give_back(v: Vec<f32>) {
    if v.capacity() == 0 || v.capacity() > KEEP_FLOATS {
        return;
    }
    // `try_with`: a tensor dropped while the thread exits just frees its buffer.
    let _ = FREE.try_with(|free| {
        if let Ok(mut free) = free.try_borrow_mut() {
            if free.len() < KEEP {
                free.push(v);
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buffers_come_back_zeroed_and_sized() {
        let mut a = zeroed(100);
        a.iter_mut().for_each(|x| *x = 7.0);
        let ptr = a.as_ptr();
        give_back(a);
        let b = zeroed(90);
        assert_eq!(b.as_ptr(), ptr, "the returned buffer is reused");
        assert!(b.len() == 90 && b.iter().all(|&x| x == 0.0));
        // Too large a buffer does not serve a much smaller tensor.
        give_back(b);
        let small = zeroed(10);
        assert_ne!(small.as_ptr(), ptr);
        // Nor is a very large one kept.
        let kept = || FREE.with_borrow(|free| free.len());
        let before = kept();
        give_back(zeroed(KEEP_FLOATS + 1));
        assert_eq!(kept(), before);
    }
}
