//! Load-time repacking of block formats whose unpacking costs more than the
//! extra bytes: Q5_0 becomes Q8_0, exactly (same f16 scale, the 5-bit value
//! minus 16 as an i8). Its kernels then skip the fifth-bit reassembly, the
//! most expensive unpack of all formats; the weights grow from 22 to 34 bytes
//! per 32 values, which pays where matmuls are compute-bound (prefill, and
//! decode on machines with bandwidth to spare). Where the CPU's interleaved
//! layout applies (`cpu::rows8`), Q5_0 keeps its own bytes instead.

/// Q5_0 blocks (22 bytes: d, qh, qs) as Q8_0 blocks (34 bytes: d, 32 x i8).
pub fn q5_0_to_q8_0(src: &[u8]) -> Vec<u8> {
    debug_assert_eq!(src.len() % 22, 0);
    let mut out = Vec::with_capacity(src.len() / 22 * 34);
    for b in src.chunks_exact(22) {
        out.extend_from_slice(&b[0..2]);
        let qh = u32::from_le_bytes([b[2], b[3], b[4], b[5]]);
        let qs = &b[6..22];
        let mut q = [0u8; 32];
        for j in 0..16 {
            let h0 = ((qh >> j) << 4) & 0x10;
            let h1 = (qh >> (j + 12)) & 0x10;
            q[j] = ((((qs[j] & 0xF) as u32 | h0) as i32 - 16) as i8) as u8;
            q[j + 16] = ((((qs[j] >> 4) as u32 | h1) as i32 - 16) as i8) as u8;
        }
        out.extend_from_slice(&q);
    }
    out
}

#[cfg(test)]
mod tests {
    use crate::quant::dequantize_row;
    use ferrite_core::DType;

    #[test]
    fn q5_0_repacks_exactly() {
        let mut s = 0x1234_5678_9abc_def1u64;
        let mut bytes: Vec<u8> = (0..22 * 9)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                s as u8
            })
            .collect();
        for b in bytes.chunks_mut(22) {
            b[0..2].copy_from_slice(&half::f16::from_f32(0.037).to_le_bytes());
        }
        let q8 = super::q5_0_to_q8_0(&bytes);
        let (mut a, mut b) = (vec![0f32; 9 * 32], vec![0f32; 9 * 32]);
        dequantize_row(DType::Q5_0, &bytes, &mut a).unwrap();
        dequantize_row(DType::Q8_0, &q8, &mut b).unwrap();
        assert_eq!(a, b);
    }
}
