//! Unpacks one quantized weight row into small integers plus per-16 scales and
//! per-32 mins: `w[i] = scale[i / 16] * q[i] - min[i / 32]`. The matmul kernel
//! unpacks a row once and reuses it for every activation row of the batch.

use super::{f16_at, scale_min_k4};
use ferrite_core::DType;

#[derive(Default)]
pub struct UnpackedRow {
    pub q: Vec<i8>,
    pub scale: Vec<f32>,
    pub min: Vec<f32>,
}

impl UnpackedRow {
    fn resize(&mut self, k: usize) {
        self.q.resize(k, 0);
        self.scale.resize(k / 16, 0.0);
        self.min.resize(k / 32, 0.0);
    }
}

/// Unpack a row of `k` elements stored as `dtype` (a quantized type).
#[inline(always)]
pub fn unpack_row(dtype: DType, bytes: &[u8], k: usize, out: &mut UnpackedRow) {
    out.resize(k);
    let bb = dtype.block_bytes();
    let bs = dtype.block_size();
    for (bi, b) in bytes.chunks_exact(bb).enumerate() {
        let e0 = bi * bs;
        let q = &mut out.q[e0..e0 + bs];
        let sc = &mut out.scale[e0 / 16..(e0 + bs) / 16];
        let mn = &mut out.min[e0 / 32..(e0 + bs) / 32];
        unpack_block(dtype, b, q, sc, mn);
    }
}

#[inline(always)]
fn unpack_block(dtype: DType, b: &[u8], q: &mut [i8], sc: &mut [f32], mn: &mut [f32]) {
    // Fixed-size views let the compiler drop bounds checks and vectorize.
    if dtype.block_size() == 32 {
        let q: &mut [i8; 32] = q.try_into().expect("32-element block");
        let sc: &mut [f32; 2] = sc.try_into().expect("two scales");
        unpack_block32(dtype, b, q, sc, &mut mn[0]);
    } else {
        let q: &mut [i8; 256] = q.try_into().expect("256-element block");
        let sc: &mut [f32; 16] = sc.try_into().expect("16 scales");
        let mn: &mut [f32; 8] = mn.try_into().expect("8 mins");
        unpack_block256(dtype, b, q, sc, mn);
    }
}

#[inline(always)]
fn unpack_block32(dtype: DType, b: &[u8], q: &mut [i8; 32], sc: &mut [f32; 2], mn: &mut f32) {
    match dtype {
        DType::Q4_0 => {
            let b: &[u8; 18] = b.try_into().expect("Q4_0 block");
            let d = f16_at(b, 0);
            for j in 0..16 {
                q[j] = (b[2 + j] & 0xF) as i8 - 8;
                q[j + 16] = (b[2 + j] >> 4) as i8 - 8;
            }
            sc.fill(d);
            *mn = 0.0;
        }
        DType::Q4_1 => {
            let b: &[u8; 20] = b.try_into().expect("Q4_1 block");
            for j in 0..16 {
                q[j] = (b[4 + j] & 0xF) as i8;
                q[j + 16] = (b[4 + j] >> 4) as i8;
            }
            sc.fill(f16_at(b, 0));
            *mn = -f16_at(b, 2);
        }
        DType::Q5_0 | DType::Q5_1 => {
            let off = if dtype == DType::Q5_0 { 2 } else { 4 };
            let qh = u32::from_le_bytes([b[off], b[off + 1], b[off + 2], b[off + 3]]);
            let qs = &b[off + 4..off + 20];
            let bias = if dtype == DType::Q5_0 { 16 } else { 0 };
            for j in 0..16 {
                let h0 = (((qh >> j) << 4) & 0x10) as u8;
                let h1 = ((qh >> (j + 12)) & 0x10) as u8;
                q[j] = ((qs[j] & 0xF) | h0) as i8 - bias;
                q[j + 16] = ((qs[j] >> 4) | h1) as i8 - bias;
            }
            sc.fill(f16_at(b, 0));
            *mn = if dtype == DType::Q5_0 { 0.0 } else { -f16_at(b, 2) };
        }
        DType::Q8_0 => {
            let b: &[u8; 34] = b.try_into().expect("Q8_0 block");
            for j in 0..32 {
                q[j] = b[2 + j] as i8;
            }
            sc.fill(f16_at(b, 0));
            *mn = 0.0;
        }
        _ => unreachable!("32-element block types only"),
    }
}

#[inline(always)]
fn unpack_block256(dtype: DType, b: &[u8], q: &mut [i8; 256], sc: &mut [f32; 16], mn: &mut [f32; 8]) {
    match dtype {
        DType::Q4K | DType::Q5K => {
            let (d, dmin) = (f16_at(b, 0), f16_at(b, 2));
            let scales = &b[4..16];
            let five = dtype == DType::Q5K;
            let (qh, qs) = if five { (&b[16..48], &b[48..176]) } else { (&b[0..0], &b[16..144]) };
            for j in 0..4 {
                let (sc1, m1) = scale_min_k4(2 * j, scales);
                let (sc2, m2) = scale_min_k4(2 * j + 1, scales);
                let (u1, u2) = (1u8 << (2 * j), 2u8 << (2 * j));
                let src = &qs[32 * j..32 * j + 32];
                let dst = &mut q[64 * j..64 * j + 64];
                for l in 0..32 {
                    let (mut lo, mut hi) = (src[l] & 0xF, src[l] >> 4);
                    if five {
                        lo += if qh[l] & u1 != 0 { 16 } else { 0 };
                        hi += if qh[l] & u2 != 0 { 16 } else { 0 };
                    }
                    dst[l] = lo as i8;
                    dst[l + 32] = hi as i8;
                }
                sc[4 * j] = d * sc1 as f32;
                sc[4 * j + 1] = d * sc1 as f32;
                sc[4 * j + 2] = d * sc2 as f32;
                sc[4 * j + 3] = d * sc2 as f32;
                mn[2 * j] = dmin * m1 as f32;
                mn[2 * j + 1] = dmin * m2 as f32;
            }
        }
        DType::Q6K => {
            let d = f16_at(b, 208);
            for n in 0..2 {
                let ql = &b[64 * n..64 * n + 64];
                let qh = &b[128 + 32 * n..128 + 32 * n + 32];
                let s = &b[192 + 8 * n..192 + 8 * n + 8];
                let dst = &mut q[128 * n..128 * n + 128];
                for l in 0..32 {
                    dst[l] = ((ql[l] & 0xF) | ((qh[l] & 3) << 4)) as i8 - 32;
                    dst[l + 32] = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) as i8 - 32;
                    dst[l + 64] = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) as i8 - 32;
                    dst[l + 96] = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) as i8 - 32;
                }
                // Element group g (32 wide) of this half uses scales s[2g] and s[2g+1].
                for (i, v) in sc[8 * n..8 * n + 8].iter_mut().enumerate() {
                    let g = i / 2;
                    *v = d * s[(i % 2) + 2 * g] as i8 as f32;
                }
            }
            mn.fill(0.0);
        }
        _ => unreachable!("256-element block types only"),
    }
}
