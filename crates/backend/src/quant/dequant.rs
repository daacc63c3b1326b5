//! Reference dequantization of every supported block type to f32.

use super::{f16_at, scale_min_k4};
use ferrite_core::{DType, Error, Result};

/// Dequantize `bytes` (a whole number of blocks) into `out` (one f32 per element).
pub fn dequantize_row(dtype: DType, bytes: &[u8], out: &mut [f32]) -> Result<()> {
    let bs = dtype.block_size();
    let bb = dtype.block_bytes();
    if !out.len().is_multiple_of(bs) || bytes.len() != out.len() / bs * bb {
        return Err(Error::Shape(format!("dequantize {dtype}: {} bytes for {} elements", bytes.len(), out.len())));
    }
    match dtype {
        DType::F32 => {
            for (o, c) in out.iter_mut().zip(bytes.chunks_exact(4)) {
                *o = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
            }
        }
        DType::F16 => {
            for (i, o) in out.iter_mut().enumerate() {
                *o = f16_at(bytes, 2 * i);
            }
        }
        DType::BF16 => {
            for (o, c) in out.iter_mut().zip(bytes.chunks_exact(2)) {
                *o = f32::from_bits((u16::from_le_bytes([c[0], c[1]]) as u32) << 16);
            }
        }
        _ => {
            for (b, o) in bytes.chunks_exact(bb).zip(out.chunks_exact_mut(bs)) {
                dequant_block(dtype, b, o);
            }
        }
    }
    Ok(())
}

fn dequant_block(dtype: DType, b: &[u8], y: &mut [f32]) {
    match dtype {
        DType::Q4_0 => {
            let d = f16_at(b, 0);
            let qs = &b[2..18];
            for j in 0..16 {
                y[j] = ((qs[j] & 0xF) as i32 - 8) as f32 * d;
                y[j + 16] = ((qs[j] >> 4) as i32 - 8) as f32 * d;
            }
        }
        DType::Q4_1 => {
            let (d, m) = (f16_at(b, 0), f16_at(b, 2));
            let qs = &b[4..20];
            for j in 0..16 {
                y[j] = (qs[j] & 0xF) as f32 * d + m;
                y[j + 16] = (qs[j] >> 4) as f32 * d + m;
            }
        }
        DType::Q5_0 => {
            let d = f16_at(b, 0);
            let qh = u32::from_le_bytes([b[2], b[3], b[4], b[5]]);
            let qs = &b[6..22];
            for j in 0..16 {
                let h0 = ((qh >> j) << 4) & 0x10;
                let h1 = (qh >> (j + 12)) & 0x10;
                y[j] = (((qs[j] & 0xF) as u32 | h0) as i32 - 16) as f32 * d;
                y[j + 16] = (((qs[j] >> 4) as u32 | h1) as i32 - 16) as f32 * d;
            }
        }
        DType::Q5_1 => {
            let (d, m) = (f16_at(b, 0), f16_at(b, 2));
            let qh = u32::from_le_bytes([b[4], b[5], b[6], b[7]]);
            let qs = &b[8..24];
            for j in 0..16 {
                let h0 = ((qh >> j) << 4) & 0x10;
                let h1 = (qh >> (j + 12)) & 0x10;
                y[j] = ((qs[j] & 0xF) as u32 | h0) as f32 * d + m;
                y[j + 16] = ((qs[j] >> 4) as u32 | h1) as f32 * d + m;
            }
        }
        DType::Q8_0 => {
            let d = f16_at(b, 0);
            for j in 0..32 {
                y[j] = b[2 + j] as i8 as f32 * d;
            }
        }
        DType::Q4K => {
            let (d, dmin) = (f16_at(b, 0), f16_at(b, 2));
            let scales = &b[4..16];
            let qs = &b[16..144];
            for j in 0..4 {
                let (sc1, m1) = scale_min_k4(2 * j, scales);
                let (sc2, m2) = scale_min_k4(2 * j + 1, scales);
                let q = &qs[32 * j..32 * j + 32];
                let y = &mut y[64 * j..64 * j + 64];
                for l in 0..32 {
                    y[l] = d * sc1 as f32 * (q[l] & 0xF) as f32 - dmin * m1 as f32;
                    y[l + 32] = d * sc2 as f32 * (q[l] >> 4) as f32 - dmin * m2 as f32;
                }
            }
        }
        DType::Q5K => {
            let (d, dmin) = (f16_at(b, 0), f16_at(b, 2));
            let scales = &b[4..16];
            let qh = &b[16..48];
            let qs = &b[48..176];
            for j in 0..4 {
                let (sc1, m1) = scale_min_k4(2 * j, scales);
                let (sc2, m2) = scale_min_k4(2 * j + 1, scales);
                let (u1, u2) = (1u8 << (2 * j), 2u8 << (2 * j));
                let q = &qs[32 * j..32 * j + 32];
                let y = &mut y[64 * j..64 * j + 64];
                for l in 0..32 {
                    let lo = (q[l] & 0xF) + if qh[l] & u1 != 0 { 16 } else { 0 };
                    let hi = (q[l] >> 4) + if qh[l] & u2 != 0 { 16 } else { 0 };
                    y[l] = d * sc1 as f32 * lo as f32 - dmin * m1 as f32;
                    y[l + 32] = d * sc2 as f32 * hi as f32 - dmin * m2 as f32;
                }
            }
        }
        DType::Q6K => {
            let ql = &b[0..128];
            let qh = &b[128..192];
            let sc = &b[192..208];
            let d = f16_at(b, 208);
            for n in 0..2 {
                let (ql, qh, sc) = (&ql[64 * n..], &qh[32 * n..], &sc[8 * n..]);
                let y = &mut y[128 * n..128 * n + 128];
                for l in 0..32 {
                    let is = l / 16;
                    let q1 = ((ql[l] & 0xF) | ((qh[l] & 3) << 4)) as i32 - 32;
                    let q2 = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) as i32 - 32;
                    let q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) as i32 - 32;
                    let q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) as i32 - 32;
                    y[l] = d * (sc[is] as i8) as f32 * q1 as f32;
                    y[l + 32] = d * (sc[is + 2] as i8) as f32 * q2 as f32;
                    y[l + 64] = d * (sc[is + 4] as i8) as f32 * q3 as f32;
                    y[l + 96] = d * (sc[is + 6] as i8) as f32 * q4 as f32;
                }
            }
        }
        DType::F32 | DType::F16 | DType::BF16 => unreachable!("dense types are handled by the caller"),
    }
}
