//! Block-quantized weight formats (GGUF layouts): reference dequantization, and an
//! "unpack" view used by the integer matmul: each 32-element chunk of a row becomes
//! 32 small integers `q` with `w[i] = scale(i) * q[i] - min`, where `scale` may differ
//! between the two 16-element halves (Q6_K). One kernel then serves every format.

mod dequant;
mod q8;
pub mod repack;
mod unpack;

pub use dequant::dequantize_row;
pub use q8::{quantize_row_q8, quantize_row_q8_bits8, Q8Block};
pub use unpack::{unpack_row, UnpackedRow};

#[inline(always)]
pub(crate) fn f16_at(b: &[u8], i: usize) -> f32 {
    f16_to_f32(u16::from_le_bytes([b[i], b[i + 1]]))
}

/// IEEE half to single, exactly (subnormals, infinities, NaN payloads kept, NaN
/// made quiet like F16C does). Inline bit arithmetic: `half`'s conversion is an
/// out-of-line call behind a run-time CPU check.
#[inline(always)]
pub fn f16_to_f32(h: u16) -> f32 {
    let sign = ((h & 0x8000) as u32) << 16;
    let exp = ((h >> 10) & 0x1F) as u32;
    let man = (h & 0x03FF) as u32;
    let bits = if exp == 0x1F {
        // Infinity, or NaN (quiet bit set).
        0x7F80_0000 | if man == 0 { 0 } else { 0x0040_0000 | (man << 13) }
    } else if exp != 0 {
        ((exp + 112) << 23) | (man << 13)
    } else {
        // Zero or subnormal: man * 2^-24, exact in f32.
        (man as f32 * f32::from_bits(0x3380_0000)).to_bits()
    };
    f32::from_bits(sign | bits)
}

/// Scale and min of sub-block `j` (0..8) of a Q4_K/Q5_K block's packed 6-bit scales.
#[inline(always)]
pub(crate) fn scale_min_k4(j: usize, q: &[u8]) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        ((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4), (q[j + 4] >> 4) | ((q[j] >> 6) << 4))
    }
}
