//! Random quantized weights and activations for the kernels' unit tests.

use crate::quant::{quantize_row_q8, Q8Block};
use ferrite_core::DType;

pub const QUANT_TYPES: [DType; 8] =
    [DType::Q4_0, DType::Q4_1, DType::Q5_0, DType::Q5_1, DType::Q8_0, DType::Q4K, DType::Q5K, DType::Q6K];

/// xorshift64: deterministic test data.
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    /// `m` rows of `k` random `dtype` values whose f16 scales are small and sane.
    pub fn weight(&mut self, dtype: DType, m: usize, k: usize) -> Vec<u8> {
        let bb = dtype.block_bytes();
        let mut bytes: Vec<u8> = (0..m * k / dtype.block_size() * bb).map(|_| self.next() as u8).collect();
        let scales: &[usize] = match dtype {
            DType::Q6K => &[208],
            DType::Q4_0 | DType::Q5_0 | DType::Q8_0 => &[0],
            _ => &[0, 2],
        };
        for b in bytes.chunks_mut(bb) {
            for &o in scales {
                let s = 0.01 + (self.next() % 64) as f32 / 2000.0;
                b[o..o + 2].copy_from_slice(&half::f16::from_f32(s).to_le_bytes());
            }
        }
        bytes
    }

    /// `n` rows of `k` activations in [-1, 1], and their 16-bit blocks.
    pub fn acts(&mut self, n: usize, k: usize) -> (Vec<f32>, Vec<Q8Block>) {
        let x: Vec<f32> = (0..n * k).map(|_| (self.next() % 2001) as f32 / 1000.0 - 1.0).collect();
        let mut xq = vec![Q8Block::default(); n * k / 32];
        for t in 0..n {
            quantize_row_q8(&x[t * k..(t + 1) * k], &mut xq[t * k / 32..(t + 1) * k / 32], 32);
        }
        (x, xq)
    }
}
