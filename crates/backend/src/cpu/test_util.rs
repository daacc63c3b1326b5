//! Random quantized weights and activations for the kernels' unit tests.

use crate::quant::{quantize_row_q8, Q8Block};

pub use crate::harness::{Rng, QUANT_TYPES};

impl Rng {
    /// `n` rows of `k` activations in [-1, 1], and their 16-bit blocks.
    pub fn acts(&mut self, n: usize, k: usize) -> (Vec<f32>, Vec<Q8Block>) {
        let x: Vec<f32> = (0..n * k).map(|_| (self.next_u64() % 2001) as f32 / 1000.0 - 1.0).collect();
        let mut xq = vec![Q8Block::default(); n * k / 32];
        for t in 0..n {
            quantize_row_q8(&x[t * k..(t + 1) * k], &mut xq[t * k / 32..(t + 1) * k / 32], 32);
        }
        (x, xq)
    }
}
