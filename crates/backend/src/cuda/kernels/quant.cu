// GGUF quantized weights read in place: the kernels here see a weight as
// its stored blocks (but for tiles, below). The unit of work is a chunk of
// 32 consecutive values of a row (one Q4_0..Q8_0 block, or one eighth of a
// k-quant super-block), each with its own scale, so a warp's lanes take
// adjacent chunks and together read whole contiguous blocks (the decode
// GEMV's k-quant unit is a "piece" instead, see below).
//
// Type codes match `quant_code` on the host. Blocks of 18, 22 and 34 bytes
// are only 2-byte aligned: the 32-value blocks' multi-byte fields are read
// as halves (`blk_halves`) or, in the dp4a GEMVs, as the aligned words
// around them, shifted (`blk_words`). The k-quants' rows, and the 32-value
// blocks' rows of whole super-blocks, are regrouped at upload in tiles of
// 16 (quant/repack.rs `q4_k_tiles`, `q5_k_tiles`, `q6_k_tiles`,
// `block32_tiles`; read here by `q4k_sub`, `q5k_tsub`, `q6k_sub`,
// `dq32_tiled`, `dequant_tiled`, `dequant_ktiled`) for the
// tensor-core GEMVs (kernels/gemv_tile.cu and gemv_tile_b32.cu, compiled
// after this file).

typedef unsigned char u8;

#define T_Q4_0 0
#define T_Q4_1 1
#define T_Q5_0 2
#define T_Q5_1 3
#define T_Q8_0 4
#define T_Q4_K 5
#define T_Q5_K 6
#define T_Q6_K 7
// Tiled 32-value blocks (`dq32_tiled`) and tiled Q5_K (`q5k_tsub`): their
// code plus this (weight.rs `CudaWeight::code`).
#define T_TILED 8
#define T_Q5_K_TILED (T_TILED + T_Q5_K)

__device__ __forceinline__ float ld_f16(const u8* p) { return f16_to_f32(__ldg((const u16*)p)); }
__device__ __forceinline__ float half_lo(u32 w) { return f16_to_f32((u16)(w & 0xffffu)); }
__device__ __forceinline__ float half_hi(u32 w) { return f16_to_f32((u16)(w >> 16)); }

// Bytes [p, p + 4 N) of a block (p 2-byte aligned: blocks of 18, 22 and 34
// bytes are no more) as N little-endian words, loaded as 16-bit halves.
// The prefill's dequantization (`dq32`, a thread a block) reads them so:
// `blk_words` made it 2% slower there.
template <int N>
__device__ __forceinline__ void blk_halves(const u8* p, u32 (&w)[N]) {
#pragma unroll
    for (int i = 0; i < N; i++) {
        const u16* h = (const u16*)(p + 4 * i);
        w[i] = (u32)__ldg(h) | ((u32)__ldg(h + 1) << 16);
    }
}

// The same for the dp4a GEMVs (`load_chunk`, every 32-value block type), as
// the aligned words around the run, shifted into place where the run is
// not 4-byte aligned: half the loads of `blk_halves` made batch-1
// decode 1.10x faster for Q8_0, 1.09x for Q4_0, 1.06x for Q4_1, 1.01-1.03x
// for Q5_0 and Q5_1, and Q8_0 at batch 4 1.13x (H100, random Llama-3.1-8B;
// `-D DP4A_HALVES` restores the halves for an A/B). Measured and dropped
// (docs/cuda-journal.md, sixtieth session): 8-byte words (1.00x), the
// blocks loaded as "last use", as the tile GEMVs' are (2-6 times slower),
// and each row's values stored ahead of its heads for 16-byte loads
// (0.91-0.95x for Q8_0, Q4_0 and Q4_1, 0.99-1.00x for Q5_0 and Q5_1). No
// load reaches past the aligned word that holds the run's last byte (the
// host pads a tensor to whole words: `weight::device_bytes`).
template <int N>
__device__ __forceinline__ void blk_words(const u8* p, u32 (&w)[N]) {
#ifdef DP4A_HALVES
    blk_halves(p, w);
#else
    const u32* a = (const u32*)((u64)p & ~3ull);
    const u32 sh = ((u32)(u64)p & 2u) * 8u;
    u32 r[N + 1];
#pragma unroll
    for (int i = 0; i < N; i++) r[i] = __ldg(a + i);
    r[N] = sh ? __ldg(a + N) : 0u;  // the word past the run only where it is shifted in
#pragma unroll
    for (int i = 0; i < N; i++) asm("shf.r.clamp.b32 %0, %1, %2, %3;" : "=r"(w[i]) : "r"(r[i]), "r"(r[i + 1]), "r"(sh));
#endif
}
__device__ __forceinline__ void ld32_16(const u8* p, u32* q) {
    const uint4 a = __ldg((const uint4*)p), b = __ldg((const uint4*)p + 1);
    q[0] = a.x, q[1] = a.y, q[2] = a.z, q[3] = a.w, q[4] = b.x, q[5] = b.y, q[6] = b.z, q[7] = b.w;
}
// Byte j of a little-endian word array.
__device__ __forceinline__ u32 byte_at(const u32* q, int j) { return (q[j >> 2] >> (8 * (j & 3))) & 0xffu; }

// k-quant 6-bit scale and min of sub-block j (0..7) from the 12 scale bytes
// (as three words).
__device__ __forceinline__ void scale_min_k4(int j, const u32* s, float& sc, float& m) {
    if (j < 4) {
        sc = (float)(byte_at(s, j) & 63);
        m = (float)(byte_at(s, j + 4) & 63);
    } else {
        sc = (float)((byte_at(s, j + 4) & 0xf) | ((byte_at(s, j - 4) >> 6) << 4));
        m = (float)((byte_at(s, j + 4) >> 4) | ((byte_at(s, j) >> 6) << 4));
    }
}

// Sub-block j's scale d * sc and min dmin * m from a Q4_K / Q5_K head (d,
// dmin, 12 scale bytes; 16-byte aligned).
__device__ __forceinline__ void k_scale_min(const u8* head_at, int j, float& d, float& m) {
    const uint4 head = __ldg((const uint4*)head_at);
    const u32 scales[3] = {head.y, head.z, head.w};
    float sc, mn;
    scale_min_k4(j, scales, sc, mn);
    d = f16_to_f32((u16)(head.x & 0xffff)) * sc;
    m = f16_to_f32((u16)(head.x >> 16)) * mn;
}

// Sub-block c & 7 of the Q5_K block that holds 32-chunk c of a row: its
// scale d and min m (value = d * q - m) and the 32 bytes whose low (even
// sub-blocks) or high (odd) nibbles are its low 4 bits. Returns the block.
// (Q4_K, and Q5_K by default, are read from tiles: `q4k_sub`, `q5k_tsub`.)
__device__ __forceinline__ const u8* q5k_sub(const u8* row, u32 c, float& d, float& m, u32 (&q)[8]) {
    const int j = c & 7;
    const u8* b = row + (u64)(c >> 3) * 176;
    // Blocks of 176 bytes keep 16-byte alignment.
    k_scale_min(b, j, d, m);
    ld32_16(b + 48 + 32 * (j >> 1), q);
    return b;
}

// The same for Q4_K in its tiles (quant/repack.rs, `q4_k_tiles`): row r's
// super-block sb is in the 2,304-byte block of tile r / 16's column sb, its
// head at 16 (r % 16), its words 8 pair + 4 h + i at `q4_k_tile_word`.
// (Q5_K's tiles, `BLOCK` 2,816, begin so too.) Returns the block.
template <u32 BLOCK = 2304>
__device__ __forceinline__ const u8* q4k_sub(const u8* w, u64 r, u32 nsb, u32 c, float& d, float& m, u32 (&q)[8]) {
    const int j = c & 7, pair = j >> 1;
    const u32 rr = r & 15;
    const u8* blk = w + ((r >> 4) * nsb + (c >> 3)) * BLOCK;
    k_scale_min(blk + 16 * rr, j, d, m);
    const u32* p = (const u32*)(blk + 256 + 16 * (32 * pair + 4 * (rr & 7))) + (rr >> 3);
#pragma unroll
    for (int i = 0; i < 4; i++) q[i] = __ldg(p + 4 * i), q[4 + i] = __ldg(p + 4 * i + 2);
    return blk;
}

// Q5_K in its tiles (quant/repack.rs `q5_k_tiles`): Q4_K's layout
// (`q4k_sub`), then lane 4 (r % 8) + i's fifth bits at 2,304 + 16 lane,
// word `pair`: value l (0..32) of sub-block 2 pair + h at bit 4 h + 2 (l /
// 16) + r / 8 % 2 of byte l % 4 of its word of lane i = l / 4 % 4.
__device__ __forceinline__ void q5k_tsub(const u8* w, u64 r, u32 nsb, u32 c, float* out) {
    float d, m;
    u32 q[8];
    const u8* blk = q4k_sub<2816>(w, r, nsb, c, d, m, q);
    const u32 rr = r & 15, h = c & 1;
    u32 hb[4];
#pragma unroll
    for (int i = 0; i < 4; i++) hb[i] = __ldg((const u32*)(blk + 2304 + 16 * (4 * (rr & 7) + i) + 4 * ((c & 7) >> 1)));
#pragma unroll
    for (int l = 0; l < 32; l++) {
        const u32 fifth = (hb[(l >> 2) & 3] >> (8 * (l & 3) + 4 * h + 2 * (l >> 4) + (rr >> 3))) & 1;
        out[l] = d * (float)(((byte_at(q, l) >> (4 * h)) & 0xf) | (fifth << 4)) - m;
    }
}

// Q6_K in its tiles (quant/repack.rs, `q6_k_tiles`): row r's super-block
// sb is in the 3,360-byte block of tile r / 16's column sb. Values 32 (c & 7)
// .. + 31 of it, sub-blocks s = 2 (c & 7) + h: for lane 4 (r % 8) + i of the
// tile's GEMV, a word of 4-bit values (nibble r / 8 % 2) and one of 2-bit
// values (field 2 h + r / 8 % 2, its top bit flipped) each.
__device__ __forceinline__ void q6k_sub(const u8* w, u64 r, u32 nsb, u32 c, float* out) {
    const u32 rr = r & 15, g = rr & 7, u = rr >> 3;
    const u8* blk = w + ((r >> 4) * nsb + (c >> 3)) * 3360;
    const float d = ld_f16(blk + 3328 + 2 * (2 * g + u));
#pragma unroll
    for (int h = 0; h < 2; h++) {
        const u32 s = 2 * (c & 7) + h, f = 2 * h + u;
        const float ds = d * (float)(signed char)blk[3072 + 16 * rr + s];
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const u32 lane = 4 * g + i;
            const u32 lo = __ldg((const u32*)(blk + 16 * (32 * (s >> 2) + lane) + 4 * (s & 3)));
            const u32 hi = __ldg((const u32*)(blk + 2048 + 16 * (32 * (s >> 3) + lane) + 4 * ((s & 7) >> 1)));
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const u32 q = ((lo >> (8 * e + 4 * u)) & 15) | ((((hi >> (8 * e + 2 * f)) & 3) ^ 2) << 4);
                out[16 * h + 4 * i + e] = ds * (float)((int)q - 32);
            }
        }
    }
}

// Q4_0, Q4_1, Q5_0, Q5_1 or Q8_0 rows of whole super-blocks (or padded to
// them), stored in tiles of 16 rows (quant/repack.rs `block32_tiles`; read
// here by `dq32_tiled` and `dequant_tiled`, by the GEMVs in
// kernels/gemv_tile_b32.cu): per tile, a column of `block` bytes per
// super-block. In a column, row rr's word i of
// block b (or of its pair, the 4-bit types: block 2j in the low nibbles,
// 2j + 1 in the high) is in unit b (b / 2), lane 4 (rr % 8) + i % 4's 16
// bytes, word 2 (i / 4) + rr / 8; after the values, lane 4 (rr % 8) + b / 2's
// scales of its blocks 2 (b / 2) and 2 (b / 2) + 1 (`b32_head`).
// Q5_0 and Q5_1 as the 4-bit types, their fifth bits after the values: a
// lane's 16 bytes, word j for pair j (`with_fifth`).
template <int T>
struct B32Layout {
    static constexpr bool five = T == T_Q5_0 || T == T_Q5_1;
    static constexpr bool has_m = T == T_Q4_1 || T == T_Q5_1;
    static constexpr u32 units = T == T_Q8_0 ? 8 : 4;           // 16-byte loads of values a lane
    static constexpr u32 fifth = 512 * units;                   // where the fifth bits are
    static constexpr u32 values = fifth + (five ? 512 : 0);     // bytes before the scales
    static constexpr u32 stride = has_m ? 16 : 8;               // bytes of scales a lane
    static constexpr u32 block = values + 32 * stride;          // bytes a tile column
};
// Fragment register r (0..4) of the first (h 0: low nibbles) or second (h
// 1: high) of a pair of 32-value groups (Q5_K's sub-blocks, Q5_0's and
// Q5_1's blocks): its 4-bit values q with their fifth bits f (the lane's
// word for the pair: bit r of each byte for the first group, 4 + r for the
// second; quant/repack.rs `fifth_bit_at`) as bytes of 0..31.
__device__ __forceinline__ u32 with_fifth(u32 q, u32 f, int r, int h) {
    return h ? ((q >> 4) & 0x0f0f0f0fu) | ((f >> r) & 0x10101010u)
             : (q & 0x0f0f0f0fu) | ((f << (4 - r)) & 0x10101010u);
}
// Block b's d (f16) of row g + 8 u in tile column `col`; an m 8 bytes on.
template <int T>
__device__ __forceinline__ const u8* b32_head(const u8* col, u32 g, u32 u, u32 b) {
    using L = B32Layout<T>;
    return col + L::values + L::stride * (4 * g + (b >> 1)) + 2 * (2 * u + (b & 1));
}
// Byte v of a tile's values as the weight (4-bit types: the nibble at
// shift; 5-bit types: v with its fifth bit, `with_fifth`, shift 0).
template <int T>
__device__ __forceinline__ float b32_value(u32 v, u32 shift, float d, float m) {
    if (T == T_Q8_0) return (float)(signed char)v * d;
    return (float)((v >> shift) & (B32Layout<T>::five ? 0x1fu : 0xfu)) * d + m;
}
// d and the offset (Q4_0: -8 d; Q5_0: -16 d; Q4_1, Q5_1: m) of a block whose d is at h.
template <int T>
__device__ __forceinline__ float2 b32_scale(const u8* h) {
    const float d = ld_f16(h);
    const float m = T == T_Q4_0 ? -8.f * d : T == T_Q5_0 ? -16.f * d : B32Layout<T>::has_m ? ld_f16(h + 8) : 0.f;
    return make_float2(d, m);
}
// Lane `lane`'s fifth bits of pair j in a tile column (0: the types without).
template <int T>
__device__ __forceinline__ u32 b32_fifth(const u8* col, u32 lane, u32 j) {
    if constexpr (B32Layout<T>::five) return __ldg((const u32*)(col + B32Layout<T>::fifth + 16 * lane) + j);
    return 0;
}
// The 4-bit word `word` of fragment register r of block b (in the low or
// high nibbles: b % 2) with its fifth bits f (`b32_fifth`) where the type
// has them, and the shift of block b's values in it.
template <int T>
__device__ __forceinline__ u32 b32_word(u32 word, u32 f, u32 r, u32 b, u32& shift) {
    if constexpr (B32Layout<T>::five) {
        shift = 0;
        return with_fifth(word, f, r, b & 1);
    }
    shift = T == T_Q8_0 ? 0 : 4 * (b & 1);
    return word;
}

// Block c of row r of tiled rows.
template <int T>
__device__ __forceinline__ void dq32_tiled(const u8* base, u64 r, u64 row_bytes, u32 c, float* w) {
    const u8* col = base + (r >> 4) * 16 * row_bytes + (u64)(c >> 3) * B32Layout<T>::block;
    const u32 g = r & 7, u = (r >> 3) & 1, b = c & 7;
    const float2 s = b32_scale<T>(b32_head<T>(col, g, u, b));
    const u8* unit = col + 512 * (T == T_Q8_0 ? b : b >> 1);
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const u32 lane = 4 * g + i, f = b32_fifth<T>(col, lane, b >> 1);
#pragma unroll
        for (int half = 0; half < 2; half++) {
            const u32 reg = 2 * half + u;
            u32 shift;
            const u32 word = b32_word<T>(__ldg((const u32*)(unit + 16 * lane + 4 * reg)), f, reg, b, shift);
#pragma unroll
            for (int e = 0; e < 4; e++)
                w[16 * half + 4 * i + e] = b32_value<T>((word >> (8 * e)) & 0xffu, shift, s.x, s.y);
        }
    }
}

// Values c*32 .. c*32+31 of row r of weight `base` (rows of `row_bytes`;
// k-quants: of `nsb` super-blocks).
template <int T>
__device__ __forceinline__ void dq32(const u8* base, u64 r, u64 row_bytes, u32 nsb, u32 c, float* w) {
    const u8* row = base + r * row_bytes;
    if constexpr (T == T_Q5_K_TILED) {
        q5k_tsub(base, r, nsb, c, w);
    } else if constexpr (T >= T_TILED) {
        dq32_tiled<T - T_TILED>(base, r, row_bytes, c, w);
    } else if (T == T_Q4_0 || T == T_Q4_1) {
        const u8* b = row + (u64)c * (T == T_Q4_0 ? 18 : 20);
        const float d = ld_f16(b);
        const float m = T == T_Q4_0 ? -8.f * d : ld_f16(b + 2);
        u32 q[4];
        blk_halves(b + (T == T_Q4_0 ? 2 : 4), q);
#pragma unroll
        for (int j = 0; j < 16; j++) {
            const u32 v = byte_at(q, j);
            w[j] = (float)(v & 0xf) * d + m;
            w[j + 16] = (float)(v >> 4) * d + m;
        }
    } else if (T == T_Q5_0 || T == T_Q5_1) {
        const u8* b = row + (u64)c * (T == T_Q5_0 ? 22 : 24);
        const float d = ld_f16(b);
        const float m = T == T_Q5_0 ? -16.f * d : ld_f16(b + 2);
        u32 q[5];  // the fifth bits (qh), then the nibbles
        blk_halves(b + (T == T_Q5_0 ? 2 : 4), q);
#pragma unroll
        for (int j = 0; j < 16; j++) {
            const u32 v = byte_at(q + 1, j);
            w[j] = (float)((v & 0xf) | (((q[0] >> j) & 1) << 4)) * d + m;
            w[j + 16] = (float)((v >> 4) | (((q[0] >> (j + 16)) & 1) << 4)) * d + m;
        }
    } else if (T == T_Q8_0) {
        const u8* b = row + (u64)c * 34;
        const float d = ld_f16(b);
        u32 q[8];
        blk_halves(b + 2, q);
#pragma unroll
        for (int j = 0; j < 32; j++) w[j] = (float)(signed char)byte_at(q, j) * d;
    } else if (T == T_Q4_K || T == T_Q5_K) {
        const int j = c & 7;
        float d, m;
        u32 q[8];
        const int shift = (j & 1) * 4;
        if (T == T_Q4_K) {
            q4k_sub(base, r, nsb, c, d, m, q);
#pragma unroll
            for (int l = 0; l < 32; l++) w[l] = d * (float)((byte_at(q, l) >> shift) & 0xf) - m;
        } else {
            const u8* b = q5k_sub(row, c, d, m, q);
            u32 h[8];
            ld32_16(b + 16, h);
#pragma unroll
            for (int l = 0; l < 32; l++) {
                const u32 v = ((byte_at(q, l) >> shift) & 0xf) | (((byte_at(h, l) >> j) & 1) << 4);
                w[l] = d * (float)v - m;
            }
        }
    } else {
        q6k_sub(base, r, nsb, c, w);
    }
}

// Runtime type dispatch, for the kernels that are not on the hot path.
__device__ __forceinline__ void dq32_any(int t, const u8* base, u64 r, u64 rb, u32 nsb, u32 c, float* w) {
    switch (t) {
        case T_Q4_0: dq32<T_Q4_0>(base, r, rb, nsb, c, w); break;
        case T_Q4_1: dq32<T_Q4_1>(base, r, rb, nsb, c, w); break;
        case T_Q5_0: dq32<T_Q5_0>(base, r, rb, nsb, c, w); break;
        case T_Q5_1: dq32<T_Q5_1>(base, r, rb, nsb, c, w); break;
        case T_Q8_0: dq32<T_Q8_0>(base, r, rb, nsb, c, w); break;
        case T_TILED + T_Q4_0: dq32<T_TILED + T_Q4_0>(base, r, rb, nsb, c, w); break;
        case T_TILED + T_Q4_1: dq32<T_TILED + T_Q4_1>(base, r, rb, nsb, c, w); break;
        case T_TILED + T_Q5_0: dq32<T_TILED + T_Q5_0>(base, r, rb, nsb, c, w); break;
        case T_TILED + T_Q5_1: dq32<T_TILED + T_Q5_1>(base, r, rb, nsb, c, w); break;
        case T_TILED + T_Q8_0: dq32<T_TILED + T_Q8_0>(base, r, rb, nsb, c, w); break;
        case T_Q4_K: dq32<T_Q4_K>(base, r, rb, nsb, c, w); break;
        case T_Q5_K: dq32<T_Q5_K>(base, r, rb, nsb, c, w); break;
        case T_Q5_K_TILED: dq32<T_Q5_K_TILED>(base, r, rb, nsb, c, w); break;
        default: dq32<T_Q6_K>(base, r, rb, nsb, c, w); break;
    }
}

// Rows r0 .. of a weight to f16 [rows, k] (prefill: a tile of the weight
// for the tensor-core GEMM). Block row y is weight row r0 + y; one thread per
// chunk.
template <int T>
__device__ void dequant_tile(const u8* w, u16* out, u64 row_bytes, u32 k, u32 r0) {
    const u32 c = blockIdx.x * blockDim.x + threadIdx.x, r = blockIdx.y;
    if (c >= k / 32) return;
    float v[32];
    dq32<T>(w, (u64)(r0 + r), row_bytes, k / 256, c, v);
    uint4* o = (uint4*)(out + (u64)r * k + 32 * c);
#pragma unroll
    for (int q = 0; q < 4; q++) {
        u32 p[4];
#pragma unroll
        for (int e = 0; e < 4; e++)
            p[e] = (u32)f32_to_f16(v[8 * q + 2 * e]) | ((u32)f32_to_f16(v[8 * q + 2 * e + 1]) << 16);
        o[q] = make_uint4(p[0], p[1], p[2], p[3]);
    }
}

extern "C" __global__ void dequant_f16(const u8* w, u16* out, int t, u64 row_bytes, u32 k, u32 r0) {
    pdl_trigger();
    pdl_wait();
    switch (t) {
        case T_Q4_0: dequant_tile<T_Q4_0>(w, out, row_bytes, k, r0); break;
        case T_Q4_1: dequant_tile<T_Q4_1>(w, out, row_bytes, k, r0); break;
        case T_Q5_0: dequant_tile<T_Q5_0>(w, out, row_bytes, k, r0); break;
        case T_Q5_1: dequant_tile<T_Q5_1>(w, out, row_bytes, k, r0); break;
        case T_Q8_0: dequant_tile<T_Q8_0>(w, out, row_bytes, k, r0); break;
        // (Tiles a block a thread: `dequant_f16_tiled` reads them coalesced.)
        case T_TILED + T_Q4_0: dequant_tile<T_TILED + T_Q4_0>(w, out, row_bytes, k, r0); break;
        case T_TILED + T_Q4_1: dequant_tile<T_TILED + T_Q4_1>(w, out, row_bytes, k, r0); break;
        case T_TILED + T_Q5_0: dequant_tile<T_TILED + T_Q5_0>(w, out, row_bytes, k, r0); break;
        case T_TILED + T_Q5_1: dequant_tile<T_TILED + T_Q5_1>(w, out, row_bytes, k, r0); break;
        case T_TILED + T_Q8_0: dequant_tile<T_TILED + T_Q8_0>(w, out, row_bytes, k, r0); break;
        case T_Q4_K: dequant_tile<T_Q4_K>(w, out, row_bytes, k, r0); break;
        case T_Q5_K: dequant_tile<T_Q5_K>(w, out, row_bytes, k, r0); break;
        case T_Q5_K_TILED: dequant_tile<T_Q5_K_TILED>(w, out, row_bytes, k, r0); break;
        default: dequant_tile<T_Q6_K>(w, out, row_bytes, k, r0); break;
    }
}

// Rows r0 .. r0 + rows of tiled 32-value block rows (`dq32_tiled`'s
// layout; t: the type's T code) to f16 [rows, k], as `dequant_f16` does
// others: a warp per tile column, each lane's 16-byte loads (coalesced, as
// the GEMV's) giving 8 values (16 for the 4-bit types) of rows g and g + 8.
// (`dq32_tiled`, a thread a block, read half of each sector it touched:
// prefill 4-9% slower than from the file's blocks on an H100; this kernel
// 8-13% faster than them on the H200.)
// The warp's tile column in a dequantization of rows r0 .. r0 + rows a warp
// a column (`dequant_tiled`, `dequant_ktiled`): its tile and super-block,
// false where it has none. (A row's last column may be part padding: k %
// 256 != 0.)
__device__ __forceinline__ bool column_job(u32 k, u32 r0, u32 rows, u64& tile, u64& sb) {
    const u32 nsb = (k + 255) / 256;
    const u64 job = ((u64)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    tile = r0 / 16 + job / nsb, sb = job % nsb;
    return tile * 16 < (u64)r0 + rows;
}
// Whether row r of a tile is among rows r0 .. r0 + rows.
__device__ __forceinline__ bool row_in(u64 r, u32 r0, u32 rows) { return r >= r0 && r < (u64)r0 + rows; }

template <int T>
__device__ void dequant_tiled(const u8* w, u16* out, u64 row_bytes, u32 k, u32 r0, u32 rows) {
    using L = B32Layout<T>;
    const u32 lane = threadIdx.x & 31, g = lane >> 2, i = lane & 3;
    u64 tile, sb;
    if (!column_job(k, r0, rows, tile, sb)) return;
    const u8* col = w + tile * 16 * row_bytes + sb * L::block;
#pragma unroll
    for (u32 j = 0; j < L::units; j++) {
        const uint4 v = __ldg((const uint4*)(col + 512 * j) + lane);
        const u32 words[4] = {v.x, v.y, v.z, v.w};  // row g, row g + 8 (values 4i..), then both at 16 + 4i..
        const u32 f = b32_fifth<T>(col, lane, j);
#pragma unroll
        for (u32 u = 0; u < 2; u++) {
            const u64 r = tile * 16 + g + 8 * u;
            if (!row_in(r, r0, rows)) continue;
#pragma unroll
            for (u32 h = 0; h < (T == T_Q8_0 ? 1u : 2u); h++) {  // the 4-bit types: block 2j, then 2j + 1
                const u32 b = T == T_Q8_0 ? j : 2 * j + h;
                if (256 * sb + 32 * b >= k) continue;  // the padding
                const float2 s = b32_scale<T>(b32_head<T>(col, g, u, b));
                u16* o = out + (r - r0) * k + 256 * sb + 32 * b + 4 * i;
#pragma unroll
                for (u32 half = 0; half < 2; half++) {
                    u32 shift;
                    const u32 word = b32_word<T>(words[2 * half + u], f, 2 * half + u, b, shift);
                    u32 p[2];
#pragma unroll
                    for (u32 e = 0; e < 4; e += 2) {
                        const float f0 = b32_value<T>((word >> (8 * e)) & 0xffu, shift, s.x, s.y);
                        const float f1 = b32_value<T>((word >> (8 * e + 8)) & 0xffu, shift, s.x, s.y);
                        p[e / 2] = (u32)f32_to_f16(f0) | ((u32)f32_to_f16(f1) << 16);
                    }
                    *(uint2*)(o + 16 * half) = make_uint2(p[0], p[1]);
                }
            }
        }
    }
}

// The same for Q4_K or Q5_K tiles (`q4k_sub`, `q5k_tsub`): a warp per tile
// column, lane (g, i)'s 16-byte loads of each sub-block pair (and Q5_K's
// fifth bits) as the GEMV's, 4 values of rows g and g + 8 a sub-block and
// half each. (H100, pp512: Q4_K_M 1.14x of `q4k_sub`'s thread a 32-value
// chunk; Q5_K_M 1.03x of its file blocks, where `q5k_tsub`'s thread a chunk
// was 0.86x; sixty-second session. `FERRITE_CUDA_DEQUANT_KTILED=0` goes
// back to them.)
template <int T>
__device__ void dequant_ktiled(const u8* w, u16* out, u64 row_bytes, u32 k, u32 r0, u32 rows) {
    constexpr bool five = T == T_Q5_K;
    const u32 lane = threadIdx.x & 31, g = lane >> 2, i = lane & 3;
    u64 tile, sb;
    if (!column_job(k, r0, rows, tile, sb)) return;
    const u8* col = w + tile * 16 * row_bytes + sb * (five ? 2816 : 2304);
    const uint4 f4 = five ? __ldg((const uint4*)(col + 2304) + lane) : make_uint4(0, 0, 0, 0);
    const u32 f[4] = {f4.x, f4.y, f4.z, f4.w};
#pragma unroll
    for (u32 j = 0; j < 4; j++) {  // sub-block pair j
        const uint4 v = __ldg((const uint4*)(col + 256) + 32 * j + lane);
        const u32 words[4] = {v.x, v.y, v.z, v.w};  // row g, row g + 8 (values 4i..), then both at 16 + 4i..
#pragma unroll
        for (u32 u = 0; u < 2; u++) {
            const u64 r = tile * 16 + g + 8 * u;
            if (!row_in(r, r0, rows)) continue;
#pragma unroll
            for (u32 h = 0; h < 2; h++) {  // sub-block 2j (low nibbles), 2j + 1 (high)
                float d, m;
                k_scale_min(col + 16 * (g + 8 * u), 2 * j + h, d, m);
                u16* o = out + (r - r0) * k + 256 * sb + 32 * (2 * j + h) + 4 * i;
#pragma unroll
                for (u32 half = 0; half < 2; half++) {
                    const u32 reg = 2 * half + u;
                    const u32 q = five ? with_fifth(words[reg], f[j], reg, h) : (words[reg] >> (4 * h)) & 0x0f0f0f0fu;
                    u32 p[2];
#pragma unroll
                    for (u32 e = 0; e < 4; e += 2) {
                        const float f0 = d * (float)((q >> (8 * e)) & 0xffu) - m;
                        const float f1 = d * (float)((q >> (8 * e + 8)) & 0xffu) - m;
                        p[e / 2] = (u32)f32_to_f16(f0) | ((u32)f32_to_f16(f1) << 16);
                    }
                    *(uint2*)(o + 16 * half) = make_uint2(p[0], p[1]);
                }
            }
        }
    }
}

extern "C" __global__ void dequant_f16_tiled(const u8* w, u16* out, int t, u64 row_bytes, u32 k, u32 r0, u32 rows) {
    pdl_trigger();
    pdl_wait();
    switch (t) {
        case T_Q4_K: dequant_ktiled<T_Q4_K>(w, out, row_bytes, k, r0, rows); break;
        case T_Q5_K_TILED: dequant_ktiled<T_Q5_K>(w, out, row_bytes, k, r0, rows); break;
        case T_TILED + T_Q4_0: dequant_tiled<T_Q4_0>(w, out, row_bytes, k, r0, rows); break;
        case T_TILED + T_Q4_1: dequant_tiled<T_Q4_1>(w, out, row_bytes, k, r0, rows); break;
        case T_TILED + T_Q5_0: dequant_tiled<T_Q5_0>(w, out, row_bytes, k, r0, rows); break;
        case T_TILED + T_Q5_1: dequant_tiled<T_Q5_1>(w, out, row_bytes, k, r0, rows); break;
        default: dequant_tiled<T_Q8_0>(w, out, row_bytes, k, r0, rows); break;
    }
}

// Embedding rows of a quantized table: block per id, thread per chunk.
extern "C" __global__ void embedding_q(const u8* w, const u32* ids, const u32* picks, float* out, int t,
                                       u64 row_bytes, u32 k) {
    pdl_trigger();
    pdl_wait();
    const u64 r = token_id(ids[blockIdx.x], picks);
    float* dst = out + (u64)blockIdx.x * k;
    for (u32 c = threadIdx.x; c < k / 32; c += blockDim.x) {
        float v[32];
        dq32_any(t, w, r, row_bytes, k / 256, c, v);
#pragma unroll
        for (int j = 0; j < 32; j++) dst[32 * c + j] = v[j];
    }
}

// ---------------------------------------------------------------- decode GEMV
// Decode matmul y[n, m] = x[n, k] · W[m, k]^T for n <= 8 straight from the
// blocks. Converting every weight to float would make the kernel bound by
// conversions, not memory; instead the input is quantized once per call to
// 8 bits per group of 32 (`quantize_x8`, as llama.cpp's GPU kernels do; the
// CPU keeps 16) and each group's dot product runs on integers with dp4a (four
// 8-bit products per instruction), scaled once per half group (k-quants:
// once per group).
//   sum_i x_i (d_w q_i - m_w) = d_x (d_w sum_i xq_i q_i - m_w sum_i xq_i)
// (q_i offset by 8/16/32 for the symmetric types folds into the same sums).
//
// A lane's unit of work is 32 weight values with their 32 inputs. For the
// 32-value block types it is a block. For Q5_K it is a "piece": 16
// bytes of a super-block's 4-bit values, whose low and high nibbles are 16
// values each of two sub-blocks (values 64p + 16h + e and 64p + 32 + 16h + e
// of piece 2p + h, e < 16). One 16-byte load per lane then brings a warp 512
// weight bytes, contiguous per super-block, each read once (a sub-block per
// lane read every byte twice and kept L1 busy). The input is quantized in piece order for
// it (`kperm`), so a lane's 32 inputs are contiguous as well. (Tiled
// weights have tensor-core kernels of their own, kernels/gemv_tile.cu and
// gemv_tile_b32.cu.)

// The input (`quantize_group`, kernels/quantize_x8.cuh), a warp per group.
// Launched with programmatic dependent launch: it lets the GEMV after it in
// (to prefetch its weights) before waiting for the kernel that made x.
extern "C" __global__ void quantize_x8(const float* x, signed char* xq, uint2* meta, u64 groups, int kperm,
                                       const float* nw, u32 k, float* ss, const float* up, int act) {
    pdl_trigger();
    pdl_wait();
    const u32 lane = threadIdx.x & 31;
    for (u64 g = (blockIdx.x * (u64)blockDim.x + threadIdx.x) >> 5; g < groups;
         g += ((u64)gridDim.x * blockDim.x) >> 5)
        quantize_group(g, lane, x, xq, meta, kperm, nw, k, ss, up, act);
}

// Four signed 8-bit inputs (a) times four weight bytes (b) added to c; `_s`:
// signed weight bytes, else unsigned.
#define DP4A(NAME, OP)                                                  \
    __device__ __forceinline__ int NAME(u32 a, u32 b, int c) {          \
        int d;                                                          \
        asm(OP " %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c)); \
        return d;                                                       \
    }
DP4A(dp4a_u, "dp4a.s32.u32")
DP4A(dp4a_s, "dp4a.s32.s32")

// Four bits (b & 15) to bit 4 of each byte.
__device__ __forceinline__ u32 spread4(u32 b) {
    return ((b & 1u) << 4) | ((b & 2u) << 11) | ((b & 4u) << 18) | ((b & 8u) << 25);
}

// An integer of magnitude below 2^22 as a float, with two full-rate
// instructions instead of a conversion (a quarter of the rate or less).
__device__ __forceinline__ float i2f(int v) { return __int_as_float(0x4B400000 + v) - 12582912.f; }

// The 6-bit scales and mins of k-quant sub-blocks 2p and 2p + 1 (packed in
// the 12 bytes after d and dmin, as `scale_min_k4` reads them), a byte each,
// without branches: sub-blocks 0..3 keep them in the low six bits of bytes
// j and j + 4; 4..7 in the nibbles of byte j + 4 and the top two bits of
// bytes j - 4 and j.
__device__ __forceinline__ void scale_min_pair(u32 p, uint4 head, u32& sc, u32& mn) {
    const u32 sh = (p & 1) * 16;
    const u32 a = (head.y >> sh) & 0xffff, b = (head.z >> sh) & 0xffff, c = (head.w >> sh) & 0xffff;
    const bool low = p < 2;
    sc = low ? a & 0x3f3f : (c & 0x0f0f) | ((a >> 2) & 0x3030);
    mn = low ? b & 0x3f3f : ((c >> 4) & 0x0f0f) | ((b >> 2) & 0x3030);
}

// 32 weight values as integers: byte e of word t is value 4t + e (signed for
// Q8_0, else unsigned), with
//   value_i = da * (q_i - off) + ma for i < 16, db * (q_i - off) + mb for i >= 16.
// The k-quants keep their scales as integers (isa, isb; Q5_K its
// 6-bit mins too, ima, imb) with da = d (and ma = -dmin), and sum on
// integers.
struct Chunk {
    u32 w[8];
    float da, db, ma, mb;
    int off;
    int isa, isb, ima, imb;
};

// Unit of work c of a row of `nsb` super-blocks: a block, or a k-quant piece.
template <int T>
__device__ __forceinline__ void load_chunk(const u8* row, u32 nsb, u32 c, Chunk& k) {
    k.ma = k.mb = 0.f;
    k.off = 0;
    if (T == T_Q4_0) {
        const u8* b = row + (u64)c * 18;
        k.da = k.db = ld_f16(b);
        k.off = 8;
        u32 q[4];
        blk_words(b + 2, q);
#pragma unroll
        for (int t = 0; t < 4; t++) k.w[t] = q[t] & 0x0f0f0f0fu, k.w[4 + t] = (q[t] >> 4) & 0x0f0f0f0fu;
    } else if (T == T_Q4_1) {  // 20 bytes: d and m in word 0
        u32 q[5];
        blk_words(row + (u64)c * 20, q);
        k.da = k.db = half_lo(q[0]), k.ma = k.mb = half_hi(q[0]);
#pragma unroll
        for (int t = 0; t < 4; t++) k.w[t] = q[1 + t] & 0x0f0f0f0fu, k.w[4 + t] = (q[1 + t] >> 4) & 0x0f0f0f0fu;
    } else if (T == T_Q5_0 || T == T_Q5_1) {
        // Q5_0: d, then the fifth bits (qh) and the nibbles from byte 2;
        // Q5_1: d and m in word 0, then qh and the nibbles.
        const u8* b = row + (u64)c * (T == T_Q5_0 ? 22 : 24);
        u32 q[T == T_Q5_0 ? 5 : 6];
        if constexpr (T == T_Q5_0) {  // (constexpr: the other run would read past a Q5_1 block)
            k.da = k.db = ld_f16(b);
            k.off = 16;
            blk_words(b + 2, q);
        } else {
            blk_words(b, q);
            k.da = k.db = half_lo(q[0]), k.ma = k.mb = half_hi(q[0]);
        }
        const int o = T == T_Q5_0 ? 0 : 1;
        const u32 qh = q[o];
#pragma unroll
        for (int t = 0; t < 4; t++) {
            const u32 v = q[o + 1 + t];
            k.w[t] = (v & 0x0f0f0f0fu) | spread4(qh >> (4 * t));
            k.w[4 + t] = ((v >> 4) & 0x0f0f0f0fu) | spread4(qh >> (16 + 4 * t));
        }
    } else if (T == T_Q8_0) {
        const u8* b = row + (u64)c * 34;
        k.da = k.db = ld_f16(b);
        blk_words(b + 2, k.w);
    } else if (T == T_Q5_K) {  // piece c: sub-blocks 2p (low nibbles), 2p + 1
        const u32 pc = c & 7, p = pc >> 1;
        const u8* b = row + (c >> 3) * 176u;
        // Blocks of 176 bytes keep 16-byte alignment.
        const uint4 head = __ldg((const uint4*)b);
        const uint4 qs = __ldg((const uint4*)(b + 48 + 16 * pc));
        u32 sc, mn;
        scale_min_pair(p, head, sc, mn);
        k.da = f16_to_f32((u16)(head.x & 0xffff)), k.ma = -f16_to_f32((u16)(head.x >> 16));
        k.isa = sc & 0xff, k.isb = sc >> 8, k.ima = mn & 0xff, k.imb = mn >> 8;
        const u32 q[4] = {qs.x, qs.y, qs.z, qs.w};
#pragma unroll
        for (int t = 0; t < 4; t++) {
            k.w[t] = q[t] & 0x0f0f0f0fu;
            k.w[4 + t] = (q[t] >> 4) & 0x0f0f0f0fu;
        }
        {  // bit j of byte l: the fifth bit of sub-block j's value l
            const uint4 qh = __ldg((const uint4*)(b + 16 + 16 * (pc & 1)));
            const u32 h[4] = {qh.x, qh.y, qh.z, qh.w};
#pragma unroll
            for (int t = 0; t < 4; t++) {
                k.w[t] |= ((h[t] >> (2 * p)) & 0x01010101u) << 4;
                k.w[4 + t] |= ((h[t] >> (2 * p + 1)) & 0x01010101u) << 4;
            }
        }
    }
}

// acc plus the chunk times its 32 quantized inputs (8 words of four values,
// in two uint4) and their group's metadata (its float arithmetic spelled
// out: common.cuh `scaled_pair`).
template <int T>
__device__ __forceinline__ float chunk_dot_add(const Chunk& k, uint4 x0, uint4 x1, uint2 meta, float acc) {
    const u32 xw[8] = {x0.x, x0.y, x0.z, x0.w, x1.x, x1.y, x1.z, x1.w};
    int lo = 0, hi = 0;
#pragma unroll
    for (int t = 0; t < 4; t++) {
        if (T == T_Q8_0) {
            lo = dp4a_s(xw[t], k.w[t], lo);
            hi = dp4a_s(xw[4 + t], k.w[4 + t], hi);
        } else {
            lo = dp4a_u(xw[t], k.w[t], lo);
            hi = dp4a_u(xw[4 + t], k.w[4 + t], hi);
        }
    }
    const int slo = (int)(meta.y << 16) >> 16, shi = (int)meta.y >> 16;
    if (T == T_Q5_K) {
        const int dot = k.isa * lo + k.isb * hi, mins = k.ima * slo + k.imb * shi;
        // (|dot| may reach 2^22: a conversion.)
        return __fmaf_rn(__uint_as_float(meta.x), scaled_pair(k.ma, i2f(mins), k.da, __int2float_rn(dot)), acc);
    }
    // |values| < 2^22: 16 products of at most 127 * 128, offsets of at most 16 * 16 * 127.
    const float v = scaled_pair(k.da, i2f(lo - k.off * slo), k.db, i2f(hi - k.off * shi));
    const float s = __fmaf_rn(k.mb, i2f(shi), __fmaf_rn(k.ma, i2f(slo), v));
    return __fmaf_rn(__uint_as_float(meta.x), s, acc);
}

// One warp per weight row, up to three weights of one type sharing the input
// (see pick_weight); U units of work per lane in flight. (Two or four rows
// per warp, each input load serving all, measured slower on the H200, as
// did U = 4: fewer warps, or more registers, hide less latency.)
// `ss`: the input's squares per group from quantize_x8 (null: no input norm),
// with the norm's `eps`; `add`: the sums added to y (`start_values`).
// `row`: the warp's index in the launch (the first row it takes).
template <int T, int N, int U>
__device__ void gemv_q_body(u32 row, const u8* w0, const u8* w1, const u8* w2, float* y0, float* y1, float* y2,
                            u32 m0, u32 m1, u32 m2, const signed char* xq, const uint2* meta, u32 k, u64 row_bytes,
                            u32 pf, const float* ss, float eps, int add) {
    const u32 lane = threadIdx.x & 31;
    const u8* w = w0;
    float* y = y0;
    u32 m = m0;
    if (!pick_weight(row, w, y, m, w1, w2, y1, y2, m1, m2)) return;
    const u8* wr = w + (u64)row * row_bytes;
    // As in gemv.cu: the row into L2 before waiting for the input.
    if (lane == 0) prefetch_l2(wr, (u32)min(row_bytes, (u64)pf));
    pdl_wait();
    const u32 chunks = k / 32, nsb = k / 256;
    // y's values early at N = 1 only: at N > 1 their registers, live through
    // the loop, made the kernel spill under its 64-register bound (batch 4
    // 15% slower); there they are read at the end.
    float acc[N], base[N];
    start_values<N>(base, y, m, row, add && N == 1, lane);
    // Likewise the norm's squares (k up to 4,096 here, the rest after).
    float sq_early[4] = {0.f, 0.f, 0.f, 0.f};
    if (N == 1 && ss) {
#pragma unroll
        for (u32 j = 0; j < 4; j++)
            if (lane + 32 * j < chunks) sq_early[j] = ss[lane + 32 * j];
    }
#pragma unroll
    for (int n = 0; n < N; n++) acc[n] = 0.f;
    // (A pair of pieces per lane, sharing their head and scales, ran 7% slower
    // at N = 1 and 30% at N = 4 despite a third fewer instructions: each
    // warp-wide load then spans twice the cache lines.)
#pragma unroll(U)
    for (u32 c = lane; c < chunks; c += 32) {
        Chunk ch;
        load_chunk<T>(wr, nsb, c, ch);
#pragma unroll
        for (int n = 0; n < N; n++) {
            const uint4* xr = (const uint4*)(xq + (u64)n * k + 32 * c);
            acc[n] = chunk_dot_add<T>(ch, xr[0], xr[1], meta[(u64)n * chunks + c], acc[n]);
        }
    }
    pdl_trigger();
#pragma unroll
    for (int n = 0; n < N; n++) {
        float s = warp_sum(acc[n]);
        if (ss) {
            float sq = 0.f;
            u32 c = lane;
            if (N == 1) sq = (sq_early[0] + sq_early[1]) + (sq_early[2] + sq_early[3]), c += 128;
            for (; c < chunks; c += 32) sq += ss[(u64)n * chunks + c];
            s *= rsqrtf(warp_sum(sq) / k + eps);
        }
        if (lane == 0) y[(u64)n * m + row] = (N == 1 ? base[n] : add ? y[(u64)n * m + row] : 0.f) + s;
    }
}

#define GEMVQ_ARGS                                                                                          \
    const u8 *w0, const u8 *w1, const u8 *w2, float *y0, float *y1, float *y2, u32 m0, u32 m1, u32 m2, \
        const signed char *xq, const uint2 *meta, u32 k, u64 row_bytes, u32 pf, const float *ss, float eps, int add
// At most 64 registers, four blocks per SM: for N > 1, 15% faster at N = 4
// and 5% at N = 8 than the compiler's choice (up to 90), despite small
// spills at N = 8; 1% at N = 1. (At N = 1, fewer registers were slower.)
#define GEMVQ(NAME, T, N)                                                                        \
    extern "C" __global__ void __launch_bounds__(256, 4) gemv_##NAME##_##N(GEMVQ_ARGS) {         \
        gemv_q_body<T, N, 2>((blockIdx.x * blockDim.x + threadIdx.x) >> 5, w0, w1, w2, y0, y1, y2, m0, m1, m2, xq, \
                             meta, k, row_bytes, pf, ss, eps, add);                                        \
    }
// A GEMV kernel macro K(NAME, T, N) for every input-row count N (1..8).
#define FOR_EACH_N(K, NAME, T) \
    K(NAME, T, 1)              \
    K(NAME, T, 2)              \
    K(NAME, T, 3)              \
    K(NAME, T, 4)              \
    K(NAME, T, 5)              \
    K(NAME, T, 6)              \
    K(NAME, T, 7)              \
    K(NAME, T, 8)
#define GEMVQ_ALL(NAME, T) FOR_EACH_N(GEMVQ, NAME, T)
GEMVQ_ALL(q4_0, T_Q4_0)
GEMVQ_ALL(q4_1, T_Q4_1)
GEMVQ_ALL(q5_0, T_Q5_0)
GEMVQ_ALL(q5_1, T_Q5_1)
GEMVQ_ALL(q8_0, T_Q8_0)
GEMVQ_ALL(q5_k, T_Q5_K)

// ------------------------------------------------- the tensor-core GEMVs' input
// (kernels/gemv_tile.cu): `quantize_sb` (kernels/quantize_x8.cuh) over a
// whole input.
extern "C" __global__ void quantize_x8_sb(const float* x, signed char* xq, u32* meta, u64 groups, const float* nw,
                                          u32 k, float* ss, const float* up, int act) {
    pdl_trigger();
    pdl_wait();
#ifdef SKIP_QUANT  // (measurement aid: the step without its input quantizations; outputs wrong)
    return;
#endif
    const u32 lane = threadIdx.x & 31;
    for (u64 g = (blockIdx.x * (u64)blockDim.x + threadIdx.x) >> 5; g < groups;
         g += ((u64)gridDim.x * blockDim.x) >> 5)
        quantize_sb(g, lane, x, xq, meta, nw, k, ss, up, act);
    trace_mark("quant.end");
}

// Both inputs of a matmul group that mixes the tensor-core GEMVs' types with
// Q5_K (Q5_K_M's q/k/v where the value projection is Q6_K), in one launch: the
// super-blocks of `quantize_x8_sb` (warps 0 .. sb_groups; xs, ms, sss),
// then the groups of 32 in piece order of `quantize_x8` (8 per super-block;
// xp, mp, ssp). Warps take one or the other whole.
extern "C" __global__ void quantize_x8_dual(const float* x, signed char* xs, u32* ms, float* sss, signed char* xp,
                                            uint2* mp, float* ssp, u64 sb_groups, const float* nw, u32 k) {
    pdl_trigger();
    pdl_wait();
    const u32 lane = threadIdx.x & 31;
    for (u64 g = (blockIdx.x * (u64)blockDim.x + threadIdx.x) >> 5; g < 9 * sb_groups;
         g += ((u64)gridDim.x * blockDim.x) >> 5) {
        if (g < sb_groups) quantize_sb(g, lane, x, xs, ms, nw, k, sss, nullptr, 0);
        else quantize_group(g - sb_groups, lane, x, xp, mp, 1, nw, k, ssp, nullptr, 0);
    }
}
