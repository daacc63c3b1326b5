//! Block-quantized weight formats (GGUF layouts): reference dequantization, and an
//! "unpack" view used by the integer matmul: each 32-element chunk of a row becomes
//! 32 small integers `q` with `w[i] = scale(i) * q[i] - min`, where `scale` may differ
//! between the two 16-element halves (Q6_K). One kernel then serves every format.

mod dequant;
mod q8;
mod unpack;

pub use dequant::dequantize_row;
pub use q8::{quantize_row_q8, Q8Block};
pub use unpack::{unpack_row, UnpackedRow};

#[inline(always)]
pub(crate) fn f16_at(b: &[u8], i: usize) -> f32 {
    half::f16::from_bits(u16::from_le_bytes([b[i], b[i + 1]])).to_f32()
}

/// Scale and min of sub-block `j` (0..8) of a Q4_K/Q5_K block's packed 6-bit scales.
#[inline(always)]
pub(crate) fn scale_min_k4(j: usize, q: &[u8]) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        (
            (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4),
            (q[j + 4] >> 4) | ((q[j] >> 6) << 4),
        )
    }
}
