// The decode GEMVs on tensor cores for Q4_0, Q4_1, Q5_0, Q5_1 and Q8_0 rows of
// whole super-blocks (others padded to them: `FERRITE_CUDA_PAD_TILES=1`),
// regrouped in tiles of 16 rows at upload (quant/repack.rs `block32_tiles`,
// kernels/quant.cu `B32Layout`); compiled after gemv_tile.cu, whose body
// (`gemv_tile_body`), batch-1 lane constants (`BdLane`) and mma they use, with
// the same input (`quantize_x8_sb`). As for Q4_K, one mma.sync m16n8k32
// multiplies 16 rows by 32 values: one block for Q8_0 (s8), a pair of blocks
// for the 4-bit types (u8: block 2j in the low nibbles, 2j + 1 in the high, as
// Q4_K's sub-block pairs; the 5-bit types join their fifth bits to them, as
// Q5_K: `with_fifth`). Each block's sums are then scaled in float by its own
// f16 d (less 8 d, or 16 d, or plus the block's m, times the input's sums). The
// dp4a GEMVs (quant.cu), which other rows keep, read the input once per weight
// row and spend an instruction per four values; here a warp's input serves 16
// rows.

// c plus 16 weight rows x 32 values (s8) times 32 inputs x 8 columns (s8), exact.
__device__ __forceinline__ void mma_s8s8_acc(u32 a0, u32 a1, u32 a2, u32 a3, u32 b0, u32 b1, int (&c)[4]) {
    asm("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};"
        : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// A lane's weights of one tile column: its values (word i of rows g and
// g + 8, then word 4 + i of both, per block or pair) and scales. At batch 1
// (SPLIT) its own: blocks 2i and 2i + 1 of rows g (h[0].x: two f16) and
// g + 8 (.y), Q4_1's m in .z and .w. Else its quad's, all eight blocks of
// both rows: lane 4g + j's words in turn.
// The 5-bit types: f, the fifth bits of its values (word j: pair j's).
template <int T, bool SPLIT>
struct B32W {
    uint4 p[B32Layout<T>::units];
    uint4 h[SPLIT ? 1 : B32Layout<T>::has_m ? 4 : 2];
    uint4 f;
};
template <int T, bool SPLIT>
__device__ __forceinline__ B32W<T, SPLIT> b32_fetch(const u8* col, u32 lane) {
    using L = B32Layout<T>;
    B32W<T, SPLIT> w;
#pragma unroll
    for (u32 j = 0; j < L::units; j++) w.p[j] = load_blocks((const uint4*)col + 32 * j + lane);
    if constexpr (L::five) w.f = load_blocks((const uint4*)(col + L::fifth) + lane);
    const u8* heads = col + L::values;
    if constexpr (SPLIT && L::has_m) {
        w.h[0] = __ldg((const uint4*)heads + lane);
    } else if constexpr (SPLIT) {
        const uint2 h = __ldg((const uint2*)heads + lane);
        w.h[0] = make_uint4(h.x, h.y, 0, 0);
    } else {
        const uint4* quad = (const uint4*)(heads + 4 * L::stride * (lane >> 2));
#pragma unroll
        for (int q = 0; q < (L::has_m ? 4 : 2); q++) w.h[q] = __ldg(quad + q);
    }
    return w;
}

// Word n of a lane's quad scales (compile-time n).
template <int H>
__device__ __forceinline__ u32 word_of(const uint4 (&h)[H], int n) {
    const uint4 v = h[n >> 2];
    return (n & 3) == 0 ? v.x : (n & 3) == 1 ? v.y : (n & 3) == 2 ? v.z : v.w;
}

// part plus block s's sums for a row (dot, of values times 8-bit inputs;
// the input's shift t applied) scaled by that row's d (and m; bsum: the
// input's sum, shifted), for the super-block's step to multiply (spelled
// out: common.cuh `scaled_pair`).
template <int T>
__device__ __forceinline__ float b32_add(float part, int dot, int t, int bsum, float d, float m) {
    const int v = dot << t;
    if (T == T_Q8_0) return __fmaf_rn(d, __int2float_rn(v), part);
    if (T == T_Q4_0) return __fmaf_rn(d, __int2float_rn(v - 8 * bsum), part);
    if (T == T_Q5_0) return __fmaf_rn(d, __int2float_rn(v - 16 * bsum), part);
    return __fmaf_rn(m, __int2float_rn(bsum), __fmaf_rn(d, __int2float_rn(v), part));
}

// Batch 1, a block a column (as `q4k_step_bd`): column g of each mma takes
// block g's input, so the sums of every block stay apart and lane (g, i)
// scales blocks 2i and 2i + 1 of rows g and g + 8 only. xg: the lane's 8
// input bytes of block g; h0: the super-block's step and shifts; bs: the
// input's sums of blocks 2i, 2i + 1 (two i16).
template <int T>
__device__ __forceinline__ void b32_step_bd(const B32W<T, true>& w, uint2 xg, uint4 h0, u32 bs, const BdLane& l,
                                            float (&acc)[4]) {
    int dot[4] = {0, 0, 0, 0};
    if constexpr (T == T_Q8_0) {
#pragma unroll
        for (int j = 0; j < 8; j++)
            mma_s8s8_acc(w.p[j].x, w.p[j].y, w.p[j].z, w.p[j].w, xg.x & l.col[j], xg.y & l.col[j], dot);
    } else if constexpr (B32Layout<T>::five) {
        // Block 2j's sums in columns 2i of the first mma's sums, 2j + 1's in
        // columns 2i + 1 of the second's (as `q5k_step_bd`).
        const u32 f[4] = {w.f.x, w.f.y, w.f.z, w.f.w};
        int odd[4] = {0, 0, 0, 0};
#pragma unroll
        for (int j = 0; j < 4; j++) {
            const uint4 p = w.p[j];
            const u32 b0 = xg.x & l.here[j], b1 = xg.y & l.here[j];
            mma_u8s8_acc(with_fifth(p.x, f[j], 0, 0), with_fifth(p.y, f[j], 1, 0), with_fifth(p.z, f[j], 2, 0),
                         with_fifth(p.w, f[j], 3, 0), b0, b1, dot);
            mma_u8s8_acc(with_fifth(p.x, f[j], 0, 1), with_fifth(p.y, f[j], 1, 1), with_fifth(p.z, f[j], 2, 1),
                         with_fifth(p.w, f[j], 3, 1), b0, b1, odd);
        }
        dot[1] = odd[1], dot[3] = odd[3];
    } else {
        // The whole bytes (value + 16 times the high one) and the high
        // nibbles alone (16 times): block 2j's sums are their difference.
        int high[4] = {0, 0, 0, 0};
        const u32 m = 0xf0f0f0f0u;
#pragma unroll
        for (int j = 0; j < 4; j++) {
            const u32 a0 = w.p[j].x, a1 = w.p[j].y, a2 = w.p[j].z, a3 = w.p[j].w;
            const u32 b0 = xg.x & l.here[j], b1 = xg.y & l.here[j];
            mma_u8s8_acc(a0, a1, a2, a3, b0, b1, dot);
            mma_u8s8_acc(a0 & m, a1 & m, a2 & m, a3 & m, b0, b1, high);
        }
#pragma unroll
        for (int r = 0; r < 4; r += 2) dot[r] -= high[r], dot[r + 1] = high[r + 1] >> 4;
    }
    const u32 shifts = l.second ? h0.z : h0.y;
    const int t0 = __byte_perm(shifts, 0, l.sel0), t1 = __byte_perm(shifts, 0, l.sel1);
    const int s0 = (int)(short)(bs & 0xffffu), s1 = (int)bs >> 16;
    const float step = __uint_as_float(h0.x);
#pragma unroll
    for (int r = 0; r < 2; r++) {
        const u32 d = r ? w.h[0].y : w.h[0].x, m = r ? w.h[0].w : w.h[0].z;
        const bool has_m = B32Layout<T>::has_m;
        const float ma = has_m ? half_lo(m) : 0.f, mb = has_m ? half_hi(m) : 0.f;
        const float s = b32_add<T>(b32_add<T>(0.f, dot[2 * r], t0, s0, half_lo(d), ma), dot[2 * r + 1], t1, s1,
                                   half_hi(d), mb);
        acc[2 * r] = __fmaf_rn(step, s, acc[2 * r]);
    }
}

// Up to 8 input rows (N): column n takes input row n in every mma; each
// block's products are scaled as they come (`b32_add`). x: the lane's 64
// input bytes (block s: x[s / 2].xy or .zw); h/s: each column's step and
// shifts, sums.
template <int T, int N>
__device__ __forceinline__ void b32_step(const B32W<T, false>& w, const uint4 (&x)[4], uint4 h0, uint4 s0, uint4 h1,
                                         uint4 s1, float (&acc)[4]) {
    constexpr int sw = B32Layout<T>::stride / 4;  // words of scales a lane
    float part[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
    for (int s = 0; s < 8; s++) {
        const u32 xa = s & 1 ? x[s >> 1].z : x[s >> 1].x, xb = s & 1 ? x[s >> 1].w : x[s >> 1].y;
        int c[4] = {0, 0, 0, 0};
        if constexpr (T == T_Q8_0) {
            mma_s8s8_acc(w.p[s].x, w.p[s].y, w.p[s].z, w.p[s].w, xa, xb, c);
        } else if constexpr (B32Layout<T>::five) {
            const uint4 p = w.p[s >> 1];
            const u32 f = s < 4 ? (s < 2 ? w.f.x : w.f.y) : (s < 6 ? w.f.z : w.f.w);
            mma_u8s8_acc(with_fifth(p.x, f, 0, s & 1), with_fifth(p.y, f, 1, s & 1), with_fifth(p.z, f, 2, s & 1),
                         with_fifth(p.w, f, 3, s & 1), xa, xb, c);
        } else {
            const uint4 p = w.p[s >> 1];
            const u32 mask = s & 1 ? 0xf0f0f0f0u : 0x0f0f0f0fu;
            mma_u8s8_acc(p.x & mask, p.y & mask, p.z & mask, p.w & mask, xa, xb, c);
            if (s & 1) {  // the high nibbles' products: 16 times theirs
#pragma unroll
                for (int q = 0; q < 4; q++) c[q] >>= 4;
            }
        }
        const int t[2] = {byte_of(s < 4 ? h0.y : h0.z, s & 3), byte_of(s < 4 ? h1.y : h1.z, s & 3)};
        const u32 sums[2] = {s & 2 ? (s < 4 ? s0.y : s0.w) : (s < 4 ? s0.x : s0.z),
                             s & 2 ? (s < 4 ? s1.y : s1.w) : (s < 4 ? s1.x : s1.z)};
        const int bsum[2] = {s & 1 ? (int)sums[0] >> 16 : (int)(short)(sums[0] & 0xffffu),
                             s & 1 ? (int)sums[1] >> 16 : (int)(short)(sums[1] & 0xffffu)};
#pragma unroll
        for (int q = 0; q < 4; q++) {
            if (N == 1 && (q & 1)) continue;
            const int row = q >> 1, col = q & 1;
            const u32 dw = word_of(w.h, sw * (s >> 1) + row);
            const u32 mw = B32Layout<T>::has_m ? word_of(w.h, sw * (s >> 1) + 2 + row) : 0u;
            const float d = s & 1 ? half_hi(dw) : half_lo(dw), m = s & 1 ? half_hi(mw) : half_lo(mw);
            part[q] = b32_add<T>(part[q], c[q], t[col], bsum[col], d, m);
        }
    }
#pragma unroll
    for (int q = 0; q < 4; q++) {
        if (N == 1 && (q & 1)) continue;
        acc[q] = __fmaf_rn(__uint_as_float(q & 1 ? h1.x : h0.x), part[q], acc[q]);
    }
}

// The weight type for `gemv_tile_body` (as `Q4kTile`): SPLIT at batch 1.
template <int T, bool SPLIT>
struct B32Tile {
    static constexpr u32 block = B32Layout<T>::block;
    static constexpr bool sums = T != T_Q8_0;
    static constexpr bool split = SPLIT;
    using W = B32W<T, SPLIT>;
    static __device__ __forceinline__ W fetch(const u8* t, u32 sb, u32 lane) {
        return b32_fetch<T, SPLIT>(t + (u64)block * sb, lane);
    }
    static __device__ __forceinline__ void step_split(const W& w, const signed char* x, const uint4* m, u32 g, u32 i,
                                                      const BdLane& l, float (&acc)[4]) {
        if constexpr (SPLIT) b32_step_bd<T>(w, ((const uint2*)x)[g], m[0], ((const u32*)(m + 1))[i], l, acc);
    }
    template <int N>
    static __device__ __forceinline__ void step(const W& w, const uint4 (&x)[4], uint4 h0, uint4 s0, uint4 h1,
                                                uint4 s1, float (&acc)[4]) {
        if constexpr (!SPLIT) b32_step<T, N>(w, x, h0, s0, h1, s1, acc);
    }
};

// gemv_q4_0t_N etc.: batch 1 a block a column, more rows (and the
// batch-invariant mode's `_whole_1`) a row a column.
#define GEMV_B32(STEM, T, N)                                                                                   \
    extern "C" __global__ void __launch_bounds__(512) gemv_##STEM##_##N(GEMVQ_ARGS) {                         \
        gemv_tile_body<B32Tile<T, N == 1>, N>(blockIdx.x, w0, w1, w2, y0, y1, y2, m0, m1, m2, xq,              \
                                               (const u32*)meta, k, row_bytes, ss, eps, add);                  \
    }
#define GEMV_B32_WHOLE(STEM, T)                                                                                \
    extern "C" __global__ void __launch_bounds__(512) gemv_##STEM##_whole_1(GEMVQ_ARGS) {                      \
        gemv_tile_body<B32Tile<T, false>, 1, false, false>(blockIdx.x, w0, w1, w2, y0, y1, y2, m0, m1, m2, xq, \
                                                           (const u32*)meta, k, row_bytes, ss, eps, add);      \
    }
FOR_EACH_N(GEMV_B32, q4_0t, T_Q4_0)
FOR_EACH_N(GEMV_B32, q4_1t, T_Q4_1)
FOR_EACH_N(GEMV_B32, q5_0t, T_Q5_0)
FOR_EACH_N(GEMV_B32, q5_1t, T_Q5_1)
FOR_EACH_N(GEMV_B32, q8_0t, T_Q8_0)
GEMV_B32_WHOLE(q4_0t, T_Q4_0)
GEMV_B32_WHOLE(q4_1t, T_Q4_1)
GEMV_B32_WHOLE(q5_0t, T_Q5_0)
GEMV_B32_WHOLE(q5_1t, T_Q5_1)
GEMV_B32_WHOLE(q8_0t, T_Q8_0)
