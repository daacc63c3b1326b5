//! Load-time repacking of block formats whose unpacking costs more than the
//! extra bytes: Q5_0 becomes Q8_0, exactly (same f16 scale, the 5-bit value
//! minus 16 as an i8). Its kernels then skip the fifth-bit reassembly, the
//! most expensive unpack of all formats; the weights grow from 22 to 34 bytes
//! per 32 values, which pays where matmuls are compute-bound (prefill, and
//! decode on machines with bandwidth to spare). Where the CPU's interleaved
//! layout applies (`cpu::rows8`), Q5_0 keeps its own bytes instead.
//!
//! For the GPU, Q6_K rows become planes its vector loads can read
//! ([`q6_k_planar`]): the same bits regrouped, the same size but for
//! alignment padding; Q4_K blocks are regrouped in tiles of 16 rows for the
//! tensor-core GEMV ([`q4_k_tiles`]).

use rayon::prelude::*;

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

/// Bytes of a Q6_K row of `k` values repacked by [`q6_k_planar`]: its 210
/// bytes per 256 values, padded to 16-byte alignment.
pub fn q6_k_planar_row_bytes(k: usize) -> usize {
    (k / 256 * 210).next_multiple_of(16)
}

/// Q6_K rows (blocks of 210 bytes: 128 of low 4 bits, 64 of high 2 bits, 16
/// i8 scales, f16 d) in the layout of the GPU's decode kernels, which a
/// 2-byte aligned 210-byte block does not allow vector loads of. A row of
/// `nsb` super-blocks becomes four planes, each indexed by super-block:
/// 4-bit values (128 bytes), 2-bit values (64), scales (16) and d (2), then
/// zeros up to [`q6_k_planar_row_bytes`].
///
/// The values are regrouped in "pieces" (kernels/quant.cu): piece
/// `pc = 2p + h` (p < 4, h < 2) of a super-block holds, for e < 16, value
/// `v(s, e) = 64p + 32s + 16h + e` for s = 0 (low nibble of its byte e) and
/// s = 1 (high nibble); its two bits above those sit at bit
/// `8 (e % 4) + 2 (e / 4)` of its word s (8 bytes per piece); its scales are
/// those of values v(0, 0) and v(1, 0) (2 bytes per piece).
pub fn q6_k_planar(src: &[u8], k: usize) -> Vec<u8> {
    let (nsb, row_in) = (k / 256, k / 256 * 210);
    let row_out = q6_k_planar_row_bytes(k);
    let rows = src.len().checked_div(row_in).unwrap_or(0);
    let mut out = vec![0u8; rows * row_out];
    out.par_chunks_mut(row_out.max(1)).zip(src.par_chunks(row_in.max(1))).for_each(|(o, r)| {
        let (ql, rest) = o.split_at_mut(128 * nsb);
        let (qh, rest) = rest.split_at_mut(64 * nsb);
        let (sc, d) = rest.split_at_mut(16 * nsb);
        for (sb, b) in r.chunks_exact(210).enumerate() {
            for pc in 0..8 {
                let (p, h) = (pc / 2, pc % 2);
                let mut words = [0u32; 2];
                for s in 0..2 {
                    for e in 0..16 {
                        let q = q6_k_value(b, 64 * p + 32 * s + 16 * h + e);
                        ql[128 * sb + 16 * pc + e] |= (q & 0xF) << (4 * s);
                        words[s] |= ((q >> 4) as u32) << (8 * (e % 4) + 2 * (e / 4));
                    }
                    sc[16 * sb + 2 * pc + s] = b[192 + 4 * p + 2 * s + h];
                }
                qh[64 * sb + 8 * pc..][..4].copy_from_slice(&words[0].to_le_bytes());
                qh[64 * sb + 8 * pc + 4..][..4].copy_from_slice(&words[1].to_le_bytes());
            }
            d[2 * sb..2 * sb + 2].copy_from_slice(&b[208..210]);
        }
    });
    out
}

/// Bytes of one super-block column of a tile in [`q4_k_tiles`]: 16 rows of
/// 144-byte Q4_K blocks.
pub const Q4K_TILE_BLOCK: usize = 16 * 144;

/// Offset in a [`q4_k_tiles`] block of the 4-byte word `w` (0..32, in the
/// GGUF block's order) of the 4-bit values of the tile's row `rr` (0..16).
pub fn q4_k_tile_word(rr: usize, w: usize) -> usize {
    let (pair, h, i) = (w / 8, w / 4 % 2, w % 4);
    let unit = 2 * (rr / 8) + pair / 2;
    let lane = 4 * (rr % 8) + i;
    256 + 16 * (32 * unit + lane) + 4 * (2 * (pair % 2) + h)
}

/// Q4_K rows (blocks of 144 bytes: d, dmin, 12 scale bytes, 128 of 4-bit
/// values; `k` values a row) in the layout of the GPU's tensor-core decode
/// GEMV (kernels/quant.cu, `gemv_q4k_body`): the same bytes, in tiles of 16
/// rows (the last padded with zero rows). A tile is its super-block columns
/// in order, each 2,304 contiguous bytes, which one warp reads at once:
/// the 16 rows' heads (16 bytes each), then four units of 32 lanes x 16
/// bytes, unit `u` holding for lane (g, i) (g = lane / 4, i = lane % 4) the
/// words of row g + 8 (u / 2) that lane's matrix fragments take: word `i`
/// and `4 + i` of sub-block pairs 2 (u % 2) and 2 (u % 2) + 1
/// ([`q4_k_tile_word`]). Each of a warp's 16-byte loads then reads 512
/// contiguous bytes, and a warp walks its tile's bytes in order.
pub fn q4_k_tiles(src: &[u8], k: usize) -> Vec<u8> {
    let row_bytes = k / 256 * 144;
    let rows = src.len().checked_div(row_bytes).unwrap_or(0);
    let tile_bytes = 16 * row_bytes;
    let mut out = vec![0u8; rows.div_ceil(16) * tile_bytes];
    out.par_chunks_mut(tile_bytes.max(1)).enumerate().for_each(|(t, tile)| {
        for (sb, blk) in tile.chunks_exact_mut(Q4K_TILE_BLOCK).enumerate() {
            for rr in 0..16.min(rows - 16 * t) {
                let b = &src[(16 * t + rr) * row_bytes + 144 * sb..][..144];
                blk[16 * rr..16 * rr + 16].copy_from_slice(&b[..16]);
                for w in 0..32 {
                    let to = q4_k_tile_word(rr, w);
                    blk[to..to + 4].copy_from_slice(&b[16 + 4 * w..20 + 4 * w]);
                }
            }
        }
    });
    out
}

/// The 6-bit value (0..63, before subtracting 32) of value `v` of a Q6_K block.
fn q6_k_value(b: &[u8], v: usize) -> u8 {
    let (n, r, l) = (v / 128, v % 128 / 32, v % 32);
    let ql = b[64 * n + l + 32 * (r % 2)] >> (4 * (r / 2)) & 0xF;
    let qh = b[128 + 32 * n + l] >> (2 * r) & 3;
    ql | qh << 4
}

#[cfg(test)]
mod tests {
    use crate::quant::dequantize_row;
    use ferrite_core::DType;

    fn random_bytes(n: usize) -> Vec<u8> {
        let mut s = 0x1234_5678_9abc_def1u64;
        (0..n)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                s as u8
            })
            .collect()
    }

    #[test]
    fn q5_0_repacks_exactly() {
        let mut bytes = random_bytes(22 * 9);
        for b in bytes.chunks_mut(22) {
            b[0..2].copy_from_slice(&half::f16::from_f32(0.037).to_le_bytes());
        }
        let q8 = super::q5_0_to_q8_0(&bytes);
        let (mut a, mut b) = (vec![0f32; 9 * 32], vec![0f32; 9 * 32]);
        dequantize_row(DType::Q5_0, &bytes, &mut a).unwrap();
        dequantize_row(DType::Q8_0, &q8, &mut b).unwrap();
        assert_eq!(a, b);
    }

    #[test]
    fn q4_k_tiles_hold_every_byte_once() {
        // Every (row, word) of a tile block has its own 4 bytes after the heads.
        let mut seen = vec![false; super::Q4K_TILE_BLOCK];
        for rr in 0..16 {
            seen[16 * rr..16 * rr + 16].iter_mut().for_each(|s| *s = true);
            for w in 0..32 {
                let at = super::q4_k_tile_word(rr, w);
                assert!(seen[at..at + 4].iter().all(|s| !s));
                seen[at..at + 4].iter_mut().for_each(|s| *s = true);
            }
        }
        assert!(seen.iter().all(|&s| s));
        // 21 rows of 512 values: two tiles, the second padded with zeros.
        let k = 512;
        let bytes = random_bytes(21 * 2 * 144);
        let out = super::q4_k_tiles(&bytes, k);
        assert_eq!(out.len(), 2 * 16 * 2 * 144);
        for r in 0..32 {
            for sb in 0..2 {
                let blk = &out[((r / 16) * 2 + sb) * super::Q4K_TILE_BLOCK..][..super::Q4K_TILE_BLOCK];
                let (rr, zero) = (r % 16, [0u8; 144]);
                let want = if r < 21 { &bytes[r * 288 + 144 * sb..][..144] } else { &zero[..] };
                assert_eq!(blk[16 * rr..16 * rr + 16], want[..16]);
                for w in 0..32 {
                    let at = super::q4_k_tile_word(rr, w);
                    assert_eq!(blk[at..at + 4], want[16 + 4 * w..20 + 4 * w]);
                }
            }
        }
    }

    /// Value `v` of super-block `sb` read from the planes as their doc says.
    fn planar_value(row: &[u8], nsb: usize, sb: usize, v: usize) -> f32 {
        let (p, s, h, e) = (v % 256 / 64, v % 64 / 32, v % 32 / 16, v % 16);
        let pc = 2 * p + h;
        let lo = row[128 * sb + 16 * pc + e] >> (4 * s) & 0xF;
        let at = 128 * nsb + 64 * sb + 8 * pc + 4 * s;
        let word = u32::from_le_bytes(row[at..at + 4].try_into().unwrap());
        let hi = (word >> (8 * (e % 4) + 2 * (e / 4))) & 3;
        let scale = row[192 * nsb + 16 * sb + 2 * pc + s] as i8;
        let d = half::f16::from_le_bytes([row[208 * nsb + 2 * sb], row[208 * nsb + 2 * sb + 1]]).to_f32();
        d * scale as f32 * ((lo as u32 | hi << 4) as i32 - 32) as f32
    }

    #[test]
    fn q6_k_planes_hold_every_value() {
        // Three super-blocks per row (padded), four rows.
        let (k, rows) = (768, 4);
        let mut bytes = random_bytes(210 * 3 * rows);
        for b in bytes.chunks_mut(210) {
            b[208..210].copy_from_slice(&half::f16::from_f32(0.011).to_le_bytes());
        }
        let planar = super::q6_k_planar(&bytes, k);
        let row_bytes = super::q6_k_planar_row_bytes(k);
        assert_eq!((row_bytes % 16, planar.len()), (0, rows * row_bytes));
        for r in 0..rows {
            let mut want = vec![0f32; k];
            dequantize_row(DType::Q6K, &bytes[r * 630..(r + 1) * 630], &mut want).unwrap();
            let row = &planar[r * row_bytes..(r + 1) * row_bytes];
            for (v, w) in want.iter().enumerate() {
                assert_eq!(planar_value(row, 3, v / 256, v), *w, "row {r} value {v}");
            }
            assert!(row[630..].iter().all(|&b| b == 0));
        }
    }
}
