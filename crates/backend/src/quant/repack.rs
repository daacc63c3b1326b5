//! Load-time repacking of block formats whose unpacking costs more than the
//! extra bytes: Q5_0 becomes Q8_0, exactly (same f16 scale, the 5-bit value
//! minus 16 as an i8). Its kernels then skip the fifth-bit reassembly, the
//! most expensive unpack of all formats; the weights grow from 22 to 34 bytes
//! per 32 values, which pays where matmuls are compute-bound (prefill, and
//! decode on machines with bandwidth to spare). Where the CPU's interleaved
//! layout applies (`cpu::rows8`), Q5_0 keeps its own bytes instead.
//!
//! For the GPU, Q4_K, Q5_K and Q6_K blocks are regrouped in tiles of 16
//! rows for the tensor-core GEMV ([`q4_k_tiles`], [`q5_k_tiles`],
//! [`q6_k_tiles`]): the same bits, in the order a warp's loads read them;
//! so are the 32-value block types' rows of whole super-blocks, or padded
//! to them ([`block32_tiles`]).

use ferrite_core::DType;
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

/// Bytes of one super-block column of a tile in [`q6_k_tiles`]: 16 rows of
/// 210-byte Q6_K blocks.
pub const Q6K_TILE_BLOCK: usize = 16 * 210;

/// Where value `v` (0..256) of row `rr` (0..16) of a [`q6_k_tiles`] block
/// keeps its bits: the byte and shift of its low four bits, the byte and
/// shift of its two high bits. The layout is the tensor-core GEMV's
/// (kernels/gemv_tile.cu, `Q6kTile`): lane `4 (rr % 8) + (v % 16) / 4` holds
/// sub-block `v / 16`'s values `v % 16 / 4 * 4 ..+ 4` of rows `rr % 8` and
/// `rr % 8 + 8` as the bytes of one word of 4-bit values (low nibbles: the
/// first row, high: the second; its `v / 64`th 16-byte load) and of one word
/// of 2-bit values (four fields a byte: sub-blocks 2j and 2j + 1 by the
/// two rows; its `v / 128`th load).
pub fn q6_k_tile_bits(rr: usize, v: usize) -> (usize, u32, usize, u32) {
    let (g, u) = (rr % 8, rr / 8);
    let (s, i, e) = (v / 16, v % 16 / 4, v % 4);
    let lane = 4 * g + i;
    let lo = 16 * (32 * (s / 4) + lane) + 4 * (s % 4) + e;
    let hi = 2048 + 16 * (32 * (s / 8) + lane) + 4 * (s % 8 / 2) + e;
    (lo, 4 * u as u32, hi, 2 * (2 * (s % 2) + u) as u32)
}

/// Offsets in a [`q6_k_tiles`] block of row `rr`'s 16 scales (i8, by
/// sub-block) and of its d (f16): rows g and g + 8 side by side.
pub fn q6_k_tile_scales(rr: usize) -> (usize, usize) {
    (3072 + 16 * rr, 3328 + 2 * (2 * (rr % 8) + rr / 8))
}

/// Q6_K rows (blocks of 210 bytes: 128 of low 4 bits, 64 of high 2 bits, 16
/// i8 scales, f16 d) regrouped in tiles of 16 rows for the tensor-core GEMV,
/// as [`q4_k_tiles`] does Q4_K's: per tile, a 3,360-byte block per
/// super-block ([`Q6K_TILE_BLOCK`]) whose bytes a warp reads in order (its
/// 16-byte loads: 2,048 bytes of 4-bit values, 1,024 of 2-bit values, then
/// the 256 scales and 16 d). The 2-bit values are stored with their top bit
/// flipped, so that a byte `low << 2 | high << 6` is the value minus 32,
/// times 4, as an i8 (the kernel's operand); the last tile's missing rows
/// are zeros.
pub fn q6_k_tiles(src: &[u8], k: usize) -> Vec<u8> {
    regroup_in_tiles(src, k, 210, |blk, rr, b| {
        for v in 0..256 {
            let q = q6_k_value(b, v);
            let (lo, ls, hi, hs) = q6_k_tile_bits(rr, v);
            blk[lo] |= (q & 0xF) << ls;
            blk[hi] |= ((q >> 4) ^ 2) << hs;
        }
        let (sc, d) = q6_k_tile_scales(rr);
        blk[sc..sc + 16].copy_from_slice(&b[192..208]);
        blk[d..d + 2].copy_from_slice(&b[208..210]);
    })
}

/// Rows of k-quant super-blocks (`block` bytes per 256 values) regrouped in
/// tiles of 16 rows: per tile, its super-block columns in order, each
/// `16 * block` bytes that `place(column, row in the tile, the row's block)`
/// fills (from zeros; the last tile's missing rows stay zeros).
/// (`k` % 256 != 0, 32-value blocks only: a row's last column takes the
/// blocks left, `place` given fewer, and is zeros past them.)
fn regroup_in_tiles(src: &[u8], k: usize, block: usize, place: impl Fn(&mut [u8], usize, &[u8]) + Sync) -> Vec<u8> {
    let row_bytes = k * block / 256;
    let rows = src.len().checked_div(row_bytes).unwrap_or(0);
    let tile_bytes = 16 * k.div_ceil(256) * block;
    let mut out = vec![0u8; rows.div_ceil(16) * tile_bytes];
    out.par_chunks_mut(tile_bytes.max(1)).enumerate().for_each(|(t, tile)| {
        for (sb, column) in tile.chunks_exact_mut(16 * block).enumerate() {
            for rr in 0..16.min(rows - 16 * t) {
                let row = &src[(16 * t + rr) * row_bytes..][..row_bytes];
                place(column, rr, &row[block * sb..row_bytes.min(block * (sb + 1))]);
            }
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
    let lane = 4 * (rr % 8) + i;
    256 + 16 * (32 * pair + lane) + 4 * (2 * h + rr / 8)
}

/// Q4_K rows (blocks of 144 bytes: d, dmin, 12 scale bytes, 128 of 4-bit
/// values; `k` values a row) in the layout of the GPU's tensor-core decode
/// GEMV (kernels/gemv_tile.cu, `gemv_tile_body`): the same bytes, in tiles
/// of 16 rows (the last padded with zero rows). A tile is its super-block columns
/// in order, each 2,304 contiguous bytes, which one warp reads at once:
/// the 16 rows' heads (16 bytes each), then four units of 32 lanes x 16
/// bytes, unit `u` holding for lane (g, i) (g = lane / 4, i = lane % 4) the
/// words of sub-block pair `u` that lane's matrix fragment takes, in the
/// fragment's register order: word `i` of rows g and g + 8, then word
/// `4 + i` of both ([`q4_k_tile_word`]). Each of a warp's 16-byte loads then
/// reads 512 contiguous bytes, a whole fragment in a lane's registers, and a
/// warp walks its tile's bytes in order.
pub fn q4_k_tiles(src: &[u8], k: usize) -> Vec<u8> {
    regroup_in_tiles(src, k, 144, |blk, rr, b| place_q4_k(blk, rr, &b[..16], &b[16..]))
}

/// Row `rr`'s head (16 bytes) and 4-bit values (128) in a tile block of
/// Q4_K's layout ([`q4_k_tiles`]).
fn place_q4_k(blk: &mut [u8], rr: usize, head: &[u8], qs: &[u8]) {
    blk[16 * rr..16 * rr + 16].copy_from_slice(head);
    for w in 0..32 {
        let to = q4_k_tile_word(rr, w);
        blk[to..to + 4].copy_from_slice(&qs[4 * w..4 * w + 4]);
    }
}

/// Bytes of one super-block column of a tile in [`q5_k_tiles`]: 16 rows of
/// 176-byte Q5_K blocks.
pub const Q5K_TILE_BLOCK: usize = 16 * 176;

/// Where the fifth bit of value `v` (0..256) of row `rr` (0..16) of a
/// [`q5_k_tiles`] block is: its byte and bit. After Q4_K's layout of the
/// heads and the 4-bit values (2,304 bytes), lane (g, i)'s 16 bytes hold in
/// word j the fifth bits of sub-block pair j's values that its fragment
/// takes: of byte y of fragment register r (0..4, [`q4_k_tile_word`]'s order),
/// at bit r of byte y for sub-block 2j, at bit 4 + r for 2j + 1.
pub fn q5_k_tile_high(rr: usize, v: usize) -> (usize, u32) {
    fifth_bit_at(2304, rr, v)
}

/// Where a tile column keeps the fifth bit of value `v` (0..256: 32-value
/// group v / 32, each pair of groups one `m16n8k32` of 4-bit values, the
/// first in the low nibbles) of row `rr`, its fifth bits beginning at
/// `base`: lane (g, i)'s 16 bytes, word v / 64, byte y of the fragment's
/// register r at bit r (first group) or 4 + r (second).
fn fifth_bit_at(base: usize, rr: usize, v: usize) -> (usize, u32) {
    let (s, l) = (v / 32, v % 32);
    let (w, y) = (l / 4, l % 4);
    let lane = 4 * (rr % 8) + w % 4;
    let r = 2 * (w / 4) + rr / 8;
    (base + 16 * lane + 4 * (s / 2) + y, (4 * (s % 2) + r) as u32)
}

/// Q5_K rows (blocks of 176 bytes: d, dmin, 12 scale bytes, 32 of fifth
/// bits, 128 of 4-bit values) in tiles of 16 rows for the tensor-core GEMV
/// (kernels/gemv_tile.cu `Q5kTile`): per super-block column, Q4_K's layout
/// of the heads and the 4-bit values ([`q4_k_tiles`]), then 512 bytes of
/// fifth bits, a lane's 16 ([`q5_k_tile_high`]), so that each 4-bit word
/// the lane loads meets its fifth bits with one shift. 2,816 bytes, the
/// same as the file's; the last tile's missing rows are zeros.
pub fn q5_k_tiles(src: &[u8], k: usize) -> Vec<u8> {
    regroup_in_tiles(src, k, 176, |blk, rr, b| {
        place_q4_k(blk, rr, &b[..16], &b[48..]);
        for v in 0..256 {
            // Sub-block s's fifth bits: bit s of the 32 bytes after the head.
            let (at, bit) = q5_k_tile_high(rr, v);
            blk[at] |= (b[16 + v % 32] >> (v / 32) & 1) << bit;
        }
    })
}

/// Whether a GPU weight of 32-value blocks (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0)
/// with `k` values a row is stored in [`block32_tiles`]: rows of whole
/// super-blocks of 256 values, and with `pad` any others (their last
/// super-block padded with zero blocks); other rows keep the file's blocks
/// for the dp4a GEMVs.
pub fn block32_tiled(q: DType, k: usize, pad: bool) -> bool {
    matches!(q, DType::Q4_0 | DType::Q4_1 | DType::Q5_0 | DType::Q5_1 | DType::Q8_0) && (pad || k.is_multiple_of(256))
}

/// Whether a 32-value block type has fifth bits (Q5_0, Q5_1).
fn five_bits(q: DType) -> bool {
    matches!(q, DType::Q5_0 | DType::Q5_1)
}

/// Where value `v` (0..256) of row `rr` of a Q5_0 or Q5_1
/// [`block32_tiles`] column keeps its fifth bit: its byte and bit; after the
/// 4-bit values (2,048 bytes), a lane's 16 bytes as Q5_K's
/// ([`q5_k_tile_high`], blocks for sub-blocks).
pub fn block32_tile_high(rr: usize, v: usize) -> (usize, u32) {
    fifth_bit_at(2048, rr, v)
}

/// Bytes of one super-block column of a tile in [`block32_tiles`]: 16 rows
/// of eight blocks.
pub fn block32_tile_block(q: DType) -> usize {
    16 * 8 * q.block_bytes()
}

/// Where value `v` (0..256) of row `rr` (0..16) of a [`block32_tiles`]
/// column is: its byte and the shift of its bits (4-bit values: 0 or 4).
/// Lane `4 (rr % 8) + (v % 16) / 4` holds values `v % 16 / 4 * 4 ..+ 4` and
/// `+ 16` of rows `rr % 8` and `rr % 8 + 8` of one block (Q8_0) or of a pair
/// of blocks (the 4-bit types: block 2j in the low nibbles, 2j + 1 in the
/// high), in the register order of an `m16n8k32` fragment, one 16-byte
/// load a lane and 512 contiguous bytes a warp per block or pair.
pub fn block32_tile_value(q: DType, rr: usize, v: usize) -> (usize, u32) {
    let (b, l) = (v / 32, v % 32);
    let lane = 4 * (rr % 8) + l % 16 / 4;
    let at = 16 * lane + 4 * (2 * (l / 16) + rr / 8) + l % 4;
    match q {
        DType::Q8_0 => (512 * b + at, 0),
        _ => (512 * (b / 2) + at, 4 * (b % 2) as u32),
    }
}

/// Offset in a [`block32_tiles`] column of the f16 d of block `b` (0..8) of
/// row `rr`; Q4_1's and Q5_1's m is 8 bytes after it. After the values
/// (and fifth bits), lane (g, i)'s 8 (16) bytes: blocks 2i and 2i + 1 of
/// rows g, then of g + 8 (then their m), the scales its sums take at batch 1.
pub fn block32_tile_head(q: DType, rr: usize, b: usize) -> usize {
    let values = match q {
        DType::Q8_0 => 4096,
        _ if five_bits(q) => 2560,
        _ => 2048,
    };
    let stride = if matches!(q, DType::Q4_1 | DType::Q5_1) { 16 } else { 8 };
    values + stride * (4 * (rr % 8) + b / 2) + 2 * (2 * (rr / 8) + b % 2)
}

/// Q4_0, Q4_1, Q5_0, Q5_1 or Q8_0 rows of `k` values (k % 32 == 0; a row's
/// last 256 padded with zero blocks) regrouped in tiles of 16 rows for the
/// tensor-core GEMV (kernels/gemv_tile_b32.cu, `B32Tile`), as [`q4_k_tiles`]
/// does Q4_K's: per tile, a column of [`block32_tile_block`] bytes per 256
/// values, the values ([`block32_tile_value`]; the 5-bit types' low 4 bits),
/// the fifth bits ([`block32_tile_high`]), then the scales
/// ([`block32_tile_head`]); the last tile's missing rows are zeros.
pub fn block32_tiles(q: DType, src: &[u8], k: usize) -> Vec<u8> {
    let bb = q.block_bytes();
    let with_m = matches!(q, DType::Q4_1 | DType::Q5_1);
    regroup_in_tiles(src, k, 8 * bb, |blk, rr, blocks| {
        for (b, block) in blocks.chunks_exact(bb).enumerate() {
            let d = block32_tile_head(q, rr, b);
            blk[d..d + 2].copy_from_slice(&block[..2]);
            if with_m {
                blk[d + 8..d + 10].copy_from_slice(&block[2..4]);
            }
            if five_bits(q) {
                let at = if with_m { 4 } else { 2 };
                let qh = u32::from_le_bytes([block[at], block[at + 1], block[at + 2], block[at + 3]]);
                for l in 0..32 {
                    let (at, bit) = block32_tile_high(rr, 32 * b + l);
                    blk[at] |= ((qh >> l & 1) as u8) << bit;
                }
            }
            for l in 0..32 {
                let (at, shift) = block32_tile_value(q, rr, 32 * b + l);
                blk[at] |= match q {
                    DType::Q8_0 => block[2 + l],
                    _ => {
                        let qs = &block[bb - 16..];
                        (qs[l % 16] >> (4 * (l / 16)) & 0xF) << shift
                    }
                };
            }
        }
    })
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
    fn q4_k_tile_words_are_in_the_fragments_register_order() {
        // Lane (g, i)'s 16 bytes of pair j: word i of rows g and g + 8, then word 4 + i of both.
        for (g, i, j) in (0..8).flat_map(|g| (0..4).flat_map(move |i| (0..4).map(move |j| (g, i, j)))) {
            let at = 256 + 16 * (32 * j + 4 * g + i);
            let words = [(g, 8 * j + i), (g + 8, 8 * j + i), (g, 8 * j + 4 + i), (g + 8, 8 * j + 4 + i)];
            for (r, (rr, w)) in words.into_iter().enumerate() {
                assert_eq!(super::q4_k_tile_word(rr, w), at + 4 * r, "row {rr} word {w}");
            }
        }
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

    #[test]
    fn q5_k_tiles_hold_every_block_bit_once() {
        // Every fifth bit has its own place after Q4_K's layout, and every byte is used.
        let mut seen = vec![0u8; super::Q5K_TILE_BLOCK];
        seen[..super::Q4K_TILE_BLOCK].fill(0xFF);
        for rr in 0..16 {
            for v in 0..256 {
                let (at, bit) = super::q5_k_tile_high(rr, v);
                assert_eq!(seen[at] >> bit & 1, 0, "row {rr} value {v}");
                seen[at] |= 1 << bit;
            }
        }
        assert!(seen.iter().all(|&b| b == 0xFF));
        // 21 rows of 512 values: each row's blocks read back from the tiles
        // are the file's, byte for byte; the missing rows are zeros.
        let (k, rows) = (512, 21);
        let bytes = random_bytes(rows * 2 * 176);
        let out = super::q5_k_tiles(&bytes, k);
        assert_eq!(out.len(), 2 * 16 * 2 * 176);
        for r in 0..32 {
            for sb in 0..2 {
                let blk = &out[((r / 16) * 2 + sb) * super::Q5K_TILE_BLOCK..][..super::Q5K_TILE_BLOCK];
                let rr = r % 16;
                let mut back = [0u8; 176];
                back[..16].copy_from_slice(&blk[16 * rr..16 * rr + 16]);
                for w in 0..32 {
                    let at = super::q4_k_tile_word(rr, w);
                    back[48 + 4 * w..52 + 4 * w].copy_from_slice(&blk[at..at + 4]);
                }
                for v in 0..256 {
                    let (at, bit) = super::q5_k_tile_high(rr, v);
                    back[16 + v % 32] |= (blk[at] >> bit & 1) << (v / 32);
                }
                let want = if r < rows { &bytes[r * 352 + 176 * sb..][..176] } else { &[0u8; 176][..] };
                assert_eq!(back[..], want[..], "row {r} super-block {sb}");
            }
        }
    }

    #[test]
    fn q6_k_tiles_hold_every_value_once() {
        // Every (row, value) has its own bits; with the scales and d, every byte is used.
        let mut seen = vec![0u8; super::Q6K_TILE_BLOCK];
        for rr in 0..16 {
            for v in 0..256 {
                let (lo, ls, hi, hs) = super::q6_k_tile_bits(rr, v);
                assert_eq!(seen[lo] & (0xF << ls), 0);
                assert_eq!(seen[hi] & (3 << hs), 0);
                seen[lo] |= 0xF << ls;
                seen[hi] |= 3 << hs;
            }
            let (sc, d) = super::q6_k_tile_scales(rr);
            seen[sc..sc + 16].fill(0xFF);
            seen[d..d + 2].fill(0xFF);
        }
        assert!(seen.iter().all(|&b| b == 0xFF));
        // 21 rows of 512 values: two tiles, the second padded with zeros.
        let (k, rows) = (512, 21);
        let mut bytes = random_bytes(rows * 2 * 210);
        for b in bytes.chunks_mut(210) {
            b[208..210].copy_from_slice(&half::f16::from_f32(0.011).to_le_bytes());
        }
        let out = super::q6_k_tiles(&bytes, k);
        assert_eq!(out.len(), 2 * 16 * 2 * 210);
        for r in 0..32 {
            let mut want = vec![0f32; k];
            if r < rows {
                dequantize_row(DType::Q6K, &bytes[r * 420..(r + 1) * 420], &mut want).unwrap();
            }
            for (v, w) in want.iter().enumerate() {
                let blk = &out[((r / 16) * 2 + v / 256) * super::Q6K_TILE_BLOCK..][..super::Q6K_TILE_BLOCK];
                let (rr, v) = (r % 16, v % 256);
                let (lo, ls, hi, hs) = super::q6_k_tile_bits(rr, v);
                // The kernel's operand: 4 (q - 32) as an i8.
                let op = ((blk[lo] >> ls & 0xF) << 2 | (blk[hi] >> hs & 3) << 6) as i8;
                let (sc, d) = super::q6_k_tile_scales(rr);
                let d = half::f16::from_le_bytes([blk[d], blk[d + 1]]).to_f32();
                let got = d * blk[sc + v / 16] as i8 as f32 * op as f32 / 4.0;
                if r < rows {
                    assert_eq!(got, *w, "row {r} value {v}");
                } else {
                    assert_eq!((blk[lo] >> ls & 0xF, blk[hi] >> hs & 3, d), (0, 0, 0.0));
                }
            }
        }
    }

    #[test]
    fn block32_tiles_hold_every_value_once() {
        for q in [DType::Q4_0, DType::Q4_1, DType::Q5_0, DType::Q5_1, DType::Q8_0] {
            let size = super::block32_tile_block(q);
            let (five, with_m) = (super::five_bits(q), matches!(q, DType::Q4_1 | DType::Q5_1));
            // Every (row, value) has its own bits; with the heads, every byte is used.
            let mut seen = vec![0u8; size];
            let bits = if q == DType::Q8_0 { 0xFF } else { 0xF };
            for rr in 0..16 {
                for v in 0..256 {
                    let (at, shift) = super::block32_tile_value(q, rr, v);
                    assert_eq!(seen[at] & (bits << shift), 0, "{q} row {rr} value {v}");
                    seen[at] |= bits << shift;
                    if five {
                        let (at, bit) = super::block32_tile_high(rr, v);
                        assert_eq!(seen[at] >> bit & 1, 0, "{q} row {rr} value {v}: fifth bit");
                        seen[at] |= 1 << bit;
                    }
                }
                for b in 0..8 {
                    let d = super::block32_tile_head(q, rr, b);
                    let heads = if with_m { [d, d + 8].to_vec() } else { vec![d] };
                    for h in heads {
                        assert!(seen[h..h + 2].iter().all(|&s| s == 0));
                        seen[h..h + 2].fill(0xFF);
                    }
                }
            }
            assert!(seen.iter().all(|&b| b == 0xFF), "{q}");
            // 21 rows of 512 values: two tiles, the second padded with zero
            // rows; of 576: three columns, the last padded with zero blocks.
            for k in [512, 576] {
                check_block32_tiles(q, k, 21);
            }
        }
    }

    /// `block32_tiles` of `rows` random rows of `k` values against their
    /// dequantized values, its padding (rows, blocks) zeros.
    fn check_block32_tiles(q: DType, k: usize, rows: usize) {
        let (bb, size) = (q.block_bytes(), super::block32_tile_block(q));
        let five = super::five_bits(q);
        let row_bytes = k / 32 * bb;
        let mut bytes = random_bytes(rows * row_bytes);
        for b in bytes.chunks_mut(bb) {
            b[0..2].copy_from_slice(&half::f16::from_f32(0.013).to_le_bytes());
            if matches!(q, DType::Q4_1 | DType::Q5_1) {
                b[2..4].copy_from_slice(&half::f16::from_f32(-0.07).to_le_bytes());
            }
        }
        let (tiles, columns) = (rows.div_ceil(16), k.div_ceil(256));
        let out = super::block32_tiles(q, &bytes, k);
        assert_eq!(out.len(), tiles * columns * size);
        for r in 0..16 * tiles {
            let mut want = vec![0f32; k];
            if r < rows {
                dequantize_row(q, &bytes[r * row_bytes..][..row_bytes], &mut want).unwrap();
            }
            for v in 0..256 * columns {
                let col = &out[((r / 16) * columns + v / 256) * size..][..size];
                let (rr, vc) = (r % 16, v % 256);
                let (at, shift) = super::block32_tile_value(q, rr, vc);
                let h = super::block32_tile_head(q, rr, vc / 32);
                let f16 = |o: usize| half::f16::from_le_bytes([col[o], col[o + 1]]).to_f32();
                let (hi, hb) = super::block32_tile_high(rr, vc);
                let fifth = if five { col[hi] >> hb & 1 } else { 0 };
                let q5 = (col[at] >> shift & 0xF | fifth << 4) as f32;
                let got = match q {
                    DType::Q8_0 => f16(h) * col[at] as i8 as f32,
                    DType::Q4_0 => f16(h) * ((col[at] >> shift & 0xF) as f32 - 8.0),
                    DType::Q4_1 => f16(h) * (col[at] >> shift & 0xF) as f32 + f16(h + 8),
                    DType::Q5_0 => f16(h) * (q5 - 16.0),
                    _ => f16(h) * q5 + f16(h + 8),
                };
                if r < rows && v < k {
                    assert_eq!(got, want[v], "{q} k {k} row {r} value {v}");
                } else {
                    let bits = if q == DType::Q8_0 { 0xFF } else { 0xF };
                    assert_eq!((col[at] >> shift & bits, f16(h), fifth), (0, 0.0, 0), "{q} k {k} row {r} value {v}");
                }
            }
        }
    }
}
