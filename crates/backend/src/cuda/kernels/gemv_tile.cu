// The decode GEMVs on tensor cores, for Q4_K, Q5_K and Q6_K weights
// regrouped in tiles of 16 rows at upload (quant/repack.rs `q4_k_tiles`,
// `q5_k_tiles`, `q6_k_tiles`);
// compiled after quant.cu, whose types, loaders and input quantization
// (`quantize_x8_sb`) they use.

// ------------------------------------------------- Q4_K decode GEMV on tensor cores
// One mma.sync m16n8k32 multiplies 16 weight rows by a sub-block of 32
// inputs for up to 8 input rows (columns) at once: the 4-bit values as u8
// (high nibbles left in place: 16 times the value, divided out at the end),
// the inputs as s8. The dp4a kernels (quant.cu) read each input byte once
// per weight row, more bytes than the weights themselves, and spent three
// times the instructions per value; here a warp's inputs serve 16 rows.

// c plus 16 weight rows x 32 values (u8) times 32 inputs x 8 columns (s8), exact.
__device__ __forceinline__ void mma_u8s8_acc(u32 a0, u32 a1, u32 a2, u32 a3, u32 b0, u32 b1, int (&c)[4]) {
    asm("mma.sync.aligned.m16n8k32.row.col.s32.u8.s8.s32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};"
        : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}
__device__ __forceinline__ void mma_u8s8(u32 a0, u32 a1, u32 a2, u32 a3, u32 b0, u32 b1, int (&c)[4]) {
    c[0] = c[1] = c[2] = c[3] = 0;
    mma_u8s8_acc(a0, a1, a2, a3, b0, b1, c);
}
// c plus two signed 16-bit values (a) times bytes 0 and 1 (lo) or 2 and 3 (hi) of b.
__device__ __forceinline__ int dp2a_lo(u32 a, u32 b, int c) {
    int d;
    asm("dp2a.lo.s32.u32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
    return d;
}
__device__ __forceinline__ int dp2a_hi(u32 a, u32 b, int c) {
    int d;
    asm("dp2a.hi.s32.u32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
    return d;
}
// Byte b of w (one PRMT).
__device__ __forceinline__ int byte_of(u32 w, int b) { return (int)__byte_perm(w, 0, 0x4440 | b); }

// A Q4_K super-block's head (d, dmin, 12 scale bytes) as its eight 6-bit
// scales and mins, a byte each (sub-blocks 0..3 in word 0, 4..7 in word 1;
// `scale_min_k4` for all eight at once), and d, dmin.
struct Q4kHead {
    u32 sc[2], mn[2];
    float d, dmin;
};
__device__ __forceinline__ Q4kHead q4k_head(uint4 h) {
    Q4kHead r;
    r.sc[0] = h.y & 0x3f3f3f3fu;
    r.sc[1] = (h.w & 0x0f0f0f0fu) | ((h.y >> 2) & 0x30303030u);
    r.mn[0] = h.z & 0x3f3f3f3fu;
    r.mn[1] = ((h.w >> 4) & 0x0f0f0f0fu) | ((h.z >> 2) & 0x30303030u);
    r.d = f16_to_f32((u16)(h.x & 0xffff)), r.dmin = f16_to_f32((u16)(h.x >> 16));
    return r;
}

// A lane's weights of one super-block: rows g (a) and g + 8 (b) of its
// warp's tile, their heads and, for each sub-block pair j, the 16 bytes of
// 4-bit values its matrix fragment takes, in register order (`q4_k_tiles`:
// each load of the warp reads 512 contiguous bytes, the heads 256): words
// i of rows g and g + 8, then words 4 + i.
struct Q4kW {
    uint4 ha, hb, p[4];
};
// (`BLOCK`: bytes a tile super-block; Q5_K's begin with Q4_K's layout.)
template <u32 BLOCK = 2304>
__device__ __forceinline__ Q4kW q4k_fetch(const u8* tile, u32 sb, u32 lane) {
    const uint4* blk = (const uint4*)(tile + BLOCK * (u64)sb);
    Q4kW w;
    w.ha = load_blocks(blk + (lane >> 2)), w.hb = load_blocks(blk + 8 + (lane >> 2));
#pragma unroll
    for (int j = 0; j < 4; j++) w.p[j] = load_blocks(blk + 16 + 32 * j + lane);
    return w;
}

// Sub-block s's products c (rows a, b by columns n0, n1) into the sums,
// times the rows' scales and the columns' input shifts (h0, h1).
template <int N>
__device__ __forceinline__ void k_sub_add(const Q4kHead& ha, const Q4kHead& hb, int s, const int (&c)[4], uint4 h0,
                                          uint4 h1, int (&sum)[4]) {
    const int sa = byte_of(ha.sc[s >> 2], s & 3), sb = byte_of(hb.sc[s >> 2], s & 3);
    const int t0 = byte_of(s < 4 ? h0.y : h0.z, s & 3);
    sum[0] += sa * (c[0] << t0);
    sum[2] += sb * (c[2] << t0);
    if (N > 1) {
        const int t1 = byte_of(s < 4 ? h1.y : h1.z, s & 3);
        sum[1] += sa * (c[1] << t1);
        sum[3] += sb * (c[3] << t1);
    }
}

// A super-block's integer sums (dot) into the lane's float ones: d dot less
// dmin times the mins by the input's sub-block sums (s0, s1), by the input's step.
template <int N>
__device__ __forceinline__ void k_finish(const Q4kHead& ha, const Q4kHead& hb, const int (&dot)[4], uint4 h0,
                                         uint4 s0, uint4 h1, uint4 s1, float (&acc)[4]) {
#pragma unroll
    for (int q = 0; q < 4; q++) {
        if (N == 1 && (q & 1)) continue;
        const Q4kHead& hd = q < 2 ? ha : hb;
        const uint4 bs = q & 1 ? s1 : s0;
        const float step = __uint_as_float(q & 1 ? h1.x : h0.x);
        int mins = dp2a_lo(bs.x, hd.mn[0], 0);
        mins = dp2a_hi(bs.y, hd.mn[0], mins);
        mins = dp2a_lo(bs.z, hd.mn[1], mins);
        mins = dp2a_hi(bs.w, hd.mn[1], mins);
        const float s = scaled_pair(hd.d, __int2float_rn(dot[q]), -hd.dmin, __int2float_rn(mins));
        acc[q] = __fmaf_rn(step, s, acc[q]);
    }
}

// One super-block into the lane's four sums: rows a, b by columns n0, n1
// (acc[2 row + column]); x: its 64 input bytes (column g of the quad), h/s:
// the super-block's step, shifts (h) and bsums (s) of columns n0 and n1.
template <int N>
__device__ __forceinline__ void q4k_step(const Q4kW& w, const uint4 (&x)[4], uint4 h0, uint4 s0, uint4 h1,
                                         uint4 s1, float (&acc)[4]) {
    const Q4kHead ha = q4k_head(w.ha), hb = q4k_head(w.hb);
    int lo[4] = {0, 0, 0, 0}, hi[4] = {0, 0, 0, 0};
#pragma unroll
    for (int j = 0; j < 4; j++) {  // sub-block pair j: sub-blocks 2j (low nibbles), 2j + 1 (high)
        const u32 a0 = w.p[j].x, a1 = w.p[j].y, a2 = w.p[j].z, a3 = w.p[j].w;
#pragma unroll
        for (int hs = 0; hs < 2; hs++) {
            const int s = 2 * j + hs;
            const u32 mask = hs ? 0xf0f0f0f0u : 0x0f0f0f0fu;
            int c[4];
            mma_u8s8(a0 & mask, a1 & mask, a2 & mask, a3 & mask, hs ? x[j].z : x[j].x, hs ? x[j].w : x[j].y, c);
            k_sub_add<N>(ha, hb, s, c, h0, h1, hs ? hi : lo);
        }
    }
    // |lo| < 4 * 63 * 15 * 127 * 32 * 8 and |hi| < 16 times that: within 2^31.
    int dot[4];
#pragma unroll
    for (int q = 0; q < 4; q++) dot[q] = lo[q] + (hi[q] >> 4);
    k_finish<N>(ha, hb, dot, h0, s0, h1, s1, acc);
}

// Batch 1, a sub-block a column: the mma's 8 columns take the input's 8
// sub-blocks, one each: lane group g gives column g its
// sub-block g's bytes in the mma of that sub-block's pair and zeros in the
// others, so the accumulators keep every sub-block's sums apart through
// the super-block and lane (g, i) scales only sub-blocks 2i and 2i + 1 of
// its rows g and g + 8 (`q4k_step` has each lane scale all eight, three
// quarters of it for columns a batch of 1 does not have). The low
// nibbles need no mask: the whole bytes (value + 16 high) go to both
// columns of the pair (the odd one's sums unused), and the high nibbles'
// products (16 times theirs, masked) to both too, to be taken off the
// even one. The quad's lanes sum their
// parts after the loop. (H100, random Llama-3.1-8B Q4_K_M: 1.006-1.012 of
// `q4k_step` in one column, which `Q4K_ONE_COLUMN` restores; 130
// instructions a super-block in the loop against 172, fifty-sixth session.
// Its float sums round otherwise than a batch's rows: the batch-invariant
// mode takes `gemv_q4_k_whole_1`.)
// The lane's constants for `q4k_step_bd` (and `q6k_step_bd`): masks keeping
// its input bytes in pair j's mmas only (column j's), and where its two
// sub-blocks' bytes sit in the words of scales, mins and shifts.
struct BdLane {
    u32 here[4], col[8];
    u32 sel0, sel1, down;  // byte_of's selectors of the lane's two bytes (kept: one instruction a loop fewer)
    bool second;
};
__device__ __forceinline__ BdLane bd_lane(u32 g, u32 i) {
    BdLane l;
#pragma unroll
    for (u32 j = 0; j < 4; j++) l.here[j] = (g >> 1) == j ? ~0u : 0u;
#pragma unroll
    for (u32 j = 0; j < 8; j++) l.col[j] = g == j ? ~0u : 0u;
    l.sel0 = 0x4440 | (2 * (i & 1)), l.sel1 = l.sel0 + 1, l.down = 16 * (i & 1);
    l.second = i >= 2;
    return l;
}
// xg: the lane's 8 input bytes of sub-block g (its column), h0: the
// super-block's step and shifts, bs: the input sums of sub-blocks 2i, 2i + 1.
__device__ __forceinline__ void q4k_step_bd(const Q4kW& w, uint2 xg, uint4 h0, u32 bs, const BdLane& l,
                                            float (&acc)[4]) {
    int whole[4] = {0, 0, 0, 0}, high[4] = {0, 0, 0, 0};
#pragma unroll
    for (int j = 0; j < 4; j++) {  // sub-block pair j: 2j in the low nibbles, 2j + 1 in the high
        const u32 a0 = w.p[j].x, a1 = w.p[j].y, a2 = w.p[j].z, a3 = w.p[j].w;
        const u32 b0 = xg.x & l.here[j], b1 = xg.y & l.here[j];
        mma_u8s8_acc(a0, a1, a2, a3, b0, b1, whole);
        const u32 m = 0xf0f0f0f0u;
        mma_u8s8_acc(a0 & m, a1 & m, a2 & m, a3 & m, b0, b1, high);
    }
    // Lane (g, i): whole[0], high[0], high[1] of row g (columns 2i, 2i + 1), [2], [3] of row g + 8.
    const u32 shifts = l.second ? h0.z : h0.y;
    const int t0 = __byte_perm(shifts, 0, l.sel0), t1 = __byte_perm(shifts, 0, l.sel1);
    const float step = __uint_as_float(h0.x);
#pragma unroll
    for (int r = 0; r < 2; r++) {
        const Q4kHead hd = q4k_head(r ? w.hb : w.ha);
        const u32 sc = l.second ? hd.sc[1] : hd.sc[0], mn = l.second ? hd.mn[1] : hd.mn[0];
        const int lo = whole[2 * r] - high[2 * r], hi = high[2 * r + 1] >> 4;
        const int dot = (int)__byte_perm(sc, 0, l.sel0) * (lo << t0) + (int)__byte_perm(sc, 0, l.sel1) * (hi << t1);
        const int mins = dp2a_lo(bs, mn >> l.down, 0);
        const float s = scaled_pair(hd.d, __int2float_rn(dot), -hd.dmin, __int2float_rn(mins));
        acc[2 * r] = __fmaf_rn(step, s, acc[2 * r]);
    }
}

// The weight (of up to three: m0, m1, m2 rows; `which`) whose tiles of 16
// rows hold tile `tile` of the launch, and the tile within it.
__device__ __forceinline__ bool pick_tile(u32& tile, const u8*& w, float*& y, u32& m, const u8* w1, const u8* w2,
                                          float* y1, float* y2, u32 m1, u32 m2, u32& which) {
    const u32 t0 = (m + 15) / 16, t1 = (m1 + 15) / 16;
    which = 0;
    if (tile < t0) return true;
    tile -= t0;
    w = w1, y = y1, m = m1, which = 1;
    if (tile < t1) return true;
    tile -= t1;
    w = w2, y = y2, m = m2, which = 2;
    return tile < (m2 + 15) / 16;
}

// ------------------------------------------------- Q5_K decode GEMV on tensor cores
// As Q4_K's, on tiles of Q4_K's layout with each lane's fifth bits after
// them (`q5_k_tiles`: a 16-byte load, word j for sub-block pair j): each
// 4-bit word of a fragment takes its fifth bits with a shift and two
// LOP3s (quant.cu `with_fifth`), so the operands are the 5-bit values as
// u8, and the scales and mins are Q4_K's.
struct Q5kW {
    Q4kW k4;
    uint4 f;
};
__device__ __forceinline__ Q5kW q5k_fetch(const u8* tile, u32 sb, u32 lane) {
    Q5kW w;
    w.k4 = q4k_fetch<2816>(tile, sb, lane);
    w.f = load_blocks((const uint4*)(tile + 2816 * (u64)sb + 2304) + lane);
    return w;
}
// One super-block into the lane's four sums, as `q4k_step`.
template <int N>
__device__ __forceinline__ void q5k_step(const Q5kW& w, const uint4 (&x)[4], uint4 h0, uint4 s0, uint4 h1,
                                         uint4 s1, float (&acc)[4]) {
    const Q4kHead ha = q4k_head(w.k4.ha), hb = q4k_head(w.k4.hb);
    const u32 f[4] = {w.f.x, w.f.y, w.f.z, w.f.w};
    // |sum| < 8 * 63 * 31 * 127 * 32 * 8: within 2^31.
    int sum[4] = {0, 0, 0, 0};
#pragma unroll
    for (int j = 0; j < 4; j++) {
        const uint4 p = w.k4.p[j];
#pragma unroll
        for (int hs = 0; hs < 2; hs++) {
            int c[4];
            mma_u8s8(with_fifth(p.x, f[j], 0, hs), with_fifth(p.y, f[j], 1, hs), with_fifth(p.z, f[j], 2, hs),
                     with_fifth(p.w, f[j], 3, hs), hs ? x[j].z : x[j].x, hs ? x[j].w : x[j].y, c);
            k_sub_add<N>(ha, hb, 2 * j + hs, c, h0, h1, sum);
        }
    }
    k_finish<N>(ha, hb, sum, h0, s0, h1, s1, acc);
}

// Batch 1, a sub-block a column, as `q4k_step_bd`: pair j's two mmas take
// column 2j's input (sub-block 2j) and 2j + 1's, so the even sub-blocks'
// sums are right in the columns 2i of the first mmas' accumulator and the
// odd ones' in the columns 2i + 1 of the second's. (Its float sums round
// otherwise than a batch's rows; `gemv_q5_kt_whole_1` sums a lone row as a
// batch's for the batch-invariant mode.)
__device__ __forceinline__ void q5k_step_bd(const Q5kW& w, uint2 xg, uint4 h0, u32 bs, const BdLane& l,
                                            float (&acc)[4]) {
    const u32 f[4] = {w.f.x, w.f.y, w.f.z, w.f.w};
    int even[4] = {0, 0, 0, 0}, odd[4] = {0, 0, 0, 0};
#pragma unroll
    for (int j = 0; j < 4; j++) {
        const uint4 p = w.k4.p[j];
        const u32 b0 = xg.x & l.here[j], b1 = xg.y & l.here[j];
        mma_u8s8_acc(with_fifth(p.x, f[j], 0, 0), with_fifth(p.y, f[j], 1, 0), with_fifth(p.z, f[j], 2, 0),
                     with_fifth(p.w, f[j], 3, 0), b0, b1, even);
        mma_u8s8_acc(with_fifth(p.x, f[j], 0, 1), with_fifth(p.y, f[j], 1, 1), with_fifth(p.z, f[j], 2, 1),
                     with_fifth(p.w, f[j], 3, 1), b0, b1, odd);
    }
    // Lane (g, i): even[0], odd[1] of row g (columns 2i, 2i + 1), even[2], odd[3] of row g + 8.
    const u32 shifts = l.second ? h0.z : h0.y;
    const int t0 = __byte_perm(shifts, 0, l.sel0), t1 = __byte_perm(shifts, 0, l.sel1);
    const float step = __uint_as_float(h0.x);
#pragma unroll
    for (int r = 0; r < 2; r++) {
        const Q4kHead hd = q4k_head(r ? w.k4.hb : w.k4.ha);
        const u32 sc = l.second ? hd.sc[1] : hd.sc[0], mn = l.second ? hd.mn[1] : hd.mn[0];
        const int dot = (int)__byte_perm(sc, 0, l.sel0) * (even[2 * r] << t0) +
                        (int)__byte_perm(sc, 0, l.sel1) * (odd[2 * r + 1] << t1);
        const int mins = dp2a_lo(bs, mn >> l.down, 0);
        const float s = scaled_pair(hd.d, __int2float_rn(dot), -hd.dmin, __int2float_rn(mins));
        acc[2 * r] = __fmaf_rn(step, s, acc[2 * r]);
    }
}

// ------------------------------------------------- Q6_K decode GEMV on tensor cores
// As Q4_K's (above): one mma.sync, here m16n8k16, multiplies 16 weight
// rows by one 16-value sub-block (Q6_K's scale unit) for up to 8 input
// columns. Each value q (0..63) is the i8 4 (q - 32), built from its 4-bit
// and (top bit flipped at upload) 2-bit parts with a shift, a mask and an
// OR per 4 values, so no sums of the input are needed; the input is
// Q4_K's (`quantize_sb`): its 32-value groups are two of the sub-blocks.

// c plus 16 weight rows x 16 values (s8) times 16 inputs x 8 columns (s8), exact.
__device__ __forceinline__ void mma_s8s8_k16_acc(u32 a0, u32 a1, u32 b0, int (&c)[4]) {
    asm("mma.sync.aligned.m16n8k16.row.col.s32.s8.s8.s32 {%0, %1, %2, %3}, {%4, %5}, {%6}, {%0, %1, %2, %3};"
        : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
        : "r"(a0), "r"(a1), "r"(b0));
}
__device__ __forceinline__ void mma_s8s8_k16(u32 a0, u32 a1, u32 b0, int (&c)[4]) {
    c[0] = c[1] = c[2] = c[3] = 0;
    mma_s8s8_k16_acc(a0, a1, b0, c);
}

// A lane's weights of one super-block (`q6_k_tiles`): rows g and g + 8 of
// its warp's tile, word s of `lo` (sub-block s, 4-bit values, the rows'
// in the low and high nibbles) and word s / 2 of `hi` (2-bit values,
// fields: sub-block 2j's rows, then 2j + 1's), the rows' scales (a byte per
// sub-block) and their d (two f16). Each of the warp's value loads reads
// 512 contiguous bytes.
struct Q6kW {
    uint4 lo[4], hi[2], sa, sb;
    u32 d;
};
__device__ __forceinline__ Q6kW q6k_fetch(const u8* tile, u32 sb, u32 lane) {
    const uint4* blk = (const uint4*)(tile + 3360 * (u64)sb);
    Q6kW w;
#pragma unroll
    for (int j = 0; j < 4; j++) w.lo[j] = load_blocks(blk + 32 * j + lane);
#pragma unroll
    for (int j = 0; j < 2; j++) w.hi[j] = load_blocks(blk + 128 + 32 * j + lane);
    w.sa = load_blocks(blk + 192 + (lane >> 2)), w.sb = load_blocks(blk + 200 + (lane >> 2));
    w.d = __ldg((const u32*)(blk + 208) + (lane >> 2));
    return w;
}

// One super-block into the lane's four sums (as `q4k_step`; no input sums).
template <int N>
__device__ __forceinline__ void q6k_step(const Q6kW& w, const uint4 (&x)[4], uint4 h0, uint4 h1, float (&acc)[4]) {
    const u32 xw[16] = {x[0].x, x[0].y, x[0].z, x[0].w, x[1].x, x[1].y, x[1].z, x[1].w,
                        x[2].x, x[2].y, x[2].z, x[2].w, x[3].x, x[3].y, x[3].z, x[3].w};
    const u32 lw[16] = {w.lo[0].x, w.lo[0].y, w.lo[0].z, w.lo[0].w, w.lo[1].x, w.lo[1].y, w.lo[1].z, w.lo[1].w,
                        w.lo[2].x, w.lo[2].y, w.lo[2].z, w.lo[2].w, w.lo[3].x, w.lo[3].y, w.lo[3].z, w.lo[3].w};
    const u32 hw[8] = {w.hi[0].x, w.hi[0].y, w.hi[0].z, w.hi[0].w, w.hi[1].x, w.hi[1].y, w.hi[1].z, w.hi[1].w};
    const u32 sa[4] = {w.sa.x, w.sa.y, w.sa.z, w.sa.w}, sb[4] = {w.sb.x, w.sb.y, w.sb.z, w.sb.w};
    // Sub-blocks 0..7 and 8..15 apart: |4 (q - 32)| <= 128, |x| <= 127, 16
    // products, a scale of at most 128 and a shift of 3, eight sub-blocks:
    // below 2^31.
    int lo[4] = {0, 0, 0, 0}, hi[4] = {0, 0, 0, 0};
#pragma unroll
    for (int p = 0; p < 8; p++) {  // the input's group p of 32: sub-blocks 2p, 2p + 1
        int part[4] = {0, 0, 0, 0};
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const int s = 2 * p + h;
            const u32 l = lw[s], q = hw[p];
            const u32 a0 = ((l << 2) & 0x3c3c3c3cu) | ((q << (6 - 4 * h)) & 0xc0c0c0c0u);
            const u32 a1 = ((l >> 2) & 0x3c3c3c3cu) | ((q << (4 - 4 * h)) & 0xc0c0c0c0u);
            int c[4];
            mma_s8s8_k16(a0, a1, xw[s], c);
            const int sca = (signed char)(sa[s >> 2] >> (8 * (s & 3)));
            const int scb = (signed char)(sb[s >> 2] >> (8 * (s & 3)));
            part[0] += sca * c[0];
            part[2] += scb * c[2];
            if (N > 1) {
                part[1] += sca * c[1];
                part[3] += scb * c[3];
            }
        }
        int* sum = p < 4 ? lo : hi;
        const int t0 = byte_of(p < 4 ? h0.y : h0.z, p & 3);
        sum[0] += part[0] << t0;
        sum[2] += part[2] << t0;
        if (N > 1) {
            const int t1 = byte_of(p < 4 ? h1.y : h1.z, p & 3);
            sum[1] += part[1] << t1;
            sum[3] += part[3] << t1;
        }
    }
    const float da = f16_to_f32((u16)(w.d & 0xffff)) * 0.25f, db = f16_to_f32((u16)(w.d >> 16)) * 0.25f;
#pragma unroll
    for (int q = 0; q < 4; q++) {
        if (N == 1 && (q & 1)) continue;
        const float step = __uint_as_float(q & 1 ? h1.x : h0.x);
        const float sum = __fadd_rn(__int2float_rn(lo[q]), __int2float_rn(hi[q]));
        acc[q] = __fmaf_rn(__fmul_rn(step, q < 2 ? da : db), sum, acc[q]);
    }
}

// Batch 1, a sub-block a column, as `q4k_step_bd`: sub-blocks s and s + 8
// take column s % 8 in turn (lane group g gives it its input's bytes of
// that sub-block in that sub-block's mma, zeros in the others), so lane
// (g, i) scales only sub-blocks 2i, 2i + 1 and their second-round partners
// of its rows g and g + 8, each of the two rounds one 32-value group of the
// input, one shift. (H200, random Llama-3.1-8B Q4_K_M batch 1: 1.009 of
// `q6k_step` in one column, which `Q6K_ONE_COLUMN` restores; fifty-eighth
// session. Its float sums round otherwise than a batch's rows: the
// batch-invariant mode takes `gemv_q6_k_whole_1`.)
// x: the lane's input words of sub-blocks g and g + 8; h0: the step and
// shifts; i: the lane's place in its quad; here: g as a mask per column.
__device__ __forceinline__ void q6k_step_bd(const Q6kW& w, uint2 x, uint4 h0, u32 i, const BdLane& lane,
                                            float (&acc)[4]) {
    const u32 lw[16] = {w.lo[0].x, w.lo[0].y, w.lo[0].z, w.lo[0].w, w.lo[1].x, w.lo[1].y, w.lo[1].z, w.lo[1].w,
                        w.lo[2].x, w.lo[2].y, w.lo[2].z, w.lo[2].w, w.lo[3].x, w.lo[3].y, w.lo[3].z, w.lo[3].w};
    const u32 hw[8] = {w.hi[0].x, w.hi[0].y, w.hi[0].z, w.hi[0].w, w.hi[1].x, w.hi[1].y, w.hi[1].z, w.hi[1].w};
    // The lane's scales: words 2 round + i / 2 of each row's, bytes 2 (i % 2) and + 1, sign-extended.
    const u32 b = 16 * (i & 1);
    int sum[2] = {0, 0};
#pragma unroll
    for (int r = 0; r < 2; r++) {
        int c[4] = {0, 0, 0, 0};
#pragma unroll
        for (int s = 8 * r; s < 8 * r + 8; s++) {
            const int p = s >> 1, h = s & 1;
            const u32 l = lw[s], q = hw[p];
            const u32 a0 = ((l << 2) & 0x3c3c3c3cu) | ((q << (6 - 4 * h)) & 0xc0c0c0c0u);
            const u32 a1 = ((l >> 2) & 0x3c3c3c3cu) | ((q << (4 - 4 * h)) & 0xc0c0c0c0u);
            mma_s8s8_k16_acc(a0, a1, (r ? x.y : x.x) & lane.col[s & 7], c);
        }
        // c: columns 2i, 2i + 1 (sub-blocks 8 r + 2i, + 1: the input's group 4 r + i) of rows g, g + 8.
        const u32 wa = i < 2 ? (r ? w.sa.z : w.sa.x) : (r ? w.sa.w : w.sa.y);
        const u32 wb = i < 2 ? (r ? w.sb.z : w.sb.x) : (r ? w.sb.w : w.sb.y);
        const int t = byte_of(r ? h0.z : h0.y, i);
        sum[0] += ((signed char)(wa >> b) * c[0] + (signed char)(wa >> (b + 8)) * c[1]) << t;
        sum[1] += ((signed char)(wb >> b) * c[2] + (signed char)(wb >> (b + 8)) * c[3]) << t;
    }
    const float step = __uint_as_float(h0.x);
    const float da = f16_to_f32((u16)(w.d & 0xffff)) * 0.25f, db = f16_to_f32((u16)(w.d >> 16)) * 0.25f;
    acc[0] = __fmaf_rn(__fmul_rn(step, da), __int2float_rn(sum[0]), acc[0]);
    acc[2] = __fmaf_rn(__fmul_rn(step, db), __int2float_rn(sum[1]), acc[2]);
}

// The k-quant tensor-core GEMVs' weight types (the 32-value blocks':
// gemv_tile_b32.cu `B32Tile`), for `gemv_tile_body`: bytes per
// tile super-block, the lane's weights, their loads and their step (`sums`:
// whether it reads the input's sums, `bsums`).
struct Q4kTile {
    static constexpr u32 block = 2304;
    static constexpr bool sums = true;
#ifdef Q4K_ONE_COLUMN
    static constexpr bool split = false;
#else
    static constexpr bool split = true;
#endif
    // Batch 1 (`q4k_step_bd`): x, the super-block's input; m, its step, shifts and sums.
    static __device__ __forceinline__ void step_split(const Q4kW& w, const signed char* x, const uint4* m, u32 g, u32 i,
                                                      const BdLane& l, float (&acc)[4]) {
        q4k_step_bd(w, ((const uint2*)x)[g], m[0], ((const u32*)(m + 1))[i], l, acc);
    }
    using W = Q4kW;
    static __device__ __forceinline__ W fetch(const u8* t, u32 sb, u32 lane) { return q4k_fetch(t, sb, lane); }
    template <int N>
    static __device__ __forceinline__ void step(const W& w, const uint4 (&x)[4], uint4 h0, uint4 s0, uint4 h1,
                                                uint4 s1, float (&acc)[4]) {
        q4k_step<N>(w, x, h0, s0, h1, s1, acc);
    }
};
struct Q5kTile {
    static constexpr u32 block = 2816;
    static constexpr bool sums = true;
    static constexpr bool split = true;
    // Batch 1 (`q5k_step_bd`): as Q4_K's.
    static __device__ __forceinline__ void step_split(const Q5kW& w, const signed char* x, const uint4* m, u32 g, u32 i,
                                                      const BdLane& l, float (&acc)[4]) {
        q5k_step_bd(w, ((const uint2*)x)[g], m[0], ((const u32*)(m + 1))[i], l, acc);
    }
    using W = Q5kW;
    static __device__ __forceinline__ W fetch(const u8* t, u32 sb, u32 lane) { return q5k_fetch(t, sb, lane); }
    template <int N>
    static __device__ __forceinline__ void step(const W& w, const uint4 (&x)[4], uint4 h0, uint4 s0, uint4 h1,
                                                uint4 s1, float (&acc)[4]) {
        q5k_step<N>(w, x, h0, s0, h1, s1, acc);
    }
};
struct Q6kTile {
    static constexpr u32 block = 3360;
    static constexpr bool sums = false;
#ifdef Q6K_ONE_COLUMN
    static constexpr bool split = false;
#else
    static constexpr bool split = true;
#endif
    // Batch 1 (`q6k_step_bd`): x, the super-block's input; m, its step and shifts.
    static __device__ __forceinline__ void step_split(const Q6kW& w, const signed char* x, const uint4* m, u32 g, u32 i,
                                                      const BdLane& l, float (&acc)[4]) {
        q6k_step_bd(w, make_uint2(((const u32*)x)[g], ((const u32*)x)[8 + g]), m[0], i, l, acc);
    }
    using W = Q6kW;
    static __device__ __forceinline__ W fetch(const u8* t, u32 sb, u32 lane) { return q6k_fetch(t, sb, lane); }
    template <int N>
    static __device__ __forceinline__ void step(const W& w, const uint4 (&x)[4], uint4 h0, uint4, uint4 h1, uint4,
                                                float (&acc)[4]) {
        q6k_step<N>(w, x, h0, h1, acc);
    }
};

// Super-block sb of a warp's tile at tw, sb_stride bytes apart.
template <class KT>
__device__ __forceinline__ typename KT::W tile_fetch(const u8* tw, u32 sb_stride, u32 sb, u32 lane) {
    return KT::fetch(tw + (u64)sb * sb_stride, 0, lane);
}

#ifdef GEMV_NO_MATH
// One bit of every loaded word, so that each load is waited for as a product would.
template <class W>
__device__ __forceinline__ u32 no_math_use(const W& w) {
    const u32* p = (const u32*)&w;
    u32 v = 0;
#pragma unroll
    for (u32 i = 0; i < sizeof(W) / 4; i++) v ^= p[i];
    return v & 1u;
}
#endif

// Warp (kw, threadIdx.y) of a block takes tile blockIdx.x * blockDim.y +
// threadIdx.y of the launch's weights and super-blocks kw, kw + W, ... of
// it (W = blockDim.x / 32: small launches split k to fill the GPU); the
// block sums its warps' parts in a fixed order, so a row's result does not
// depend on the batch. Lane (g, i) holds rows g and g + 8 of the tile for
// columns 2i and 2i + 1. Two super-blocks' weights are in flight, in two
// sets of registers, loaded past L1 so that the input stays there (on the
// H200, Q4_K_M batch 4 +3%, batch 1 +0.7%). (Measured on the H200 and
// dropped: one in flight, a ring of four in shared memory by cp.async or
// by the copy engine, more warps per tile, the next 1-8 super-blocks asked
// of L2 ahead of the loads, and each block quantizing the input itself
// instead of `quantize_x8_sb`; on an H100, the next super-block asked for
// before this one's products, in a third set of registers, 0.85-0.94, and
// one in flight again, 0.92; see docs/cuda-journal.md.)
// `bx`: the block's index among the launch's blocks of this type. With RKV
// (N = 1, q/k/v): RoPE and the KV write in the epilogue instead of the
// stores (rope_kv.cuh); `which0`: the index (q 0, k 1, v 2) of w0.
// `SPLIT`: at batch 1, the weight type's step a sub-block a column
// (`KT::step_split`), whose sums round otherwise than a batch's.
template <class KT, int N, bool RKV = false, bool SPLIT = KT::split>
__device__ void gemv_tile_body(u32 bx, const u8* w0, const u8* w1, const u8* w2, float* y0, float* y1, float* y2,
                               u32 m0, u32 m1, u32 m2, const signed char* xq, const u32* meta, u32 k, u64 row_bytes,
                               const float* ss, float eps, int add, const RopeKv& rk = RopeKv(), u32 which0 = 0) {
    const u32 lane = threadIdx.x & 31, kw = threadIdx.x >> 5, nw = blockDim.x >> 5;
    // (Rows of 32-value blocks may end in part of a super-block, padded with
    // zero blocks at upload and zeros in the input: weight.rs `tiles_at_upload`.)
    const u32 g = lane >> 2, i = lane & 3, nsb = (k + 255) / 256;
    u32 tile = bx * blockDim.y + threadIdx.y;
    const u8* w = w0;
    float* y = y0;
    u32 m = m0, which;
    const bool live = pick_tile(tile, w, y, m, w1, w2, y1, y2, m1, m2, which);
    if (!live) tile = 0, w = w0, y = y0, m = m0;
    which += which0;
    // (SB_MAJOR, a measurement aid: read as if super-block s of every tile were
    // stored together, outputs wrong; on an H100 1.010 of the defaults, the
    // H200 not yet measured, fifty-third session.)
#ifdef SB_MAJOR
    const u32 sb_stride = (m + 15) / 16 * KT::block;
    const u8* tw = w + (u64)tile * KT::block;
#else
    const u32 sb_stride = KT::block;
    const u8* tw = w + (u64)tile * 16 * row_bytes;
#endif
    // The weights are not the kernel before's output: the first loads go
    // out before waiting for it.
    // At batch 1 not on an SM where decode attention runs (kernels/common.cuh
    // `sm_busy`): then after the wait. (Written out twice: the sources'
    // check allows no lambda before the wait.)
    const u32 first_a = min(kw, nsb - 1), first_b = min(kw + nw, nsb - 1);
#ifdef SKIP_ADD_GEMV_K  // (measurement aid: no adding GEMV of this k, e.g. 4096: Llama-3.1-8B's output projection)
    const bool skip = add && k == SKIP_ADD_GEMV_K;
#else
    const bool skip = false;
#endif
    const bool early = !skip && (N > 1 || !sm_busy());
    typename KT::W wa, wb;
#ifdef GEMV_ONE_IN_FLIGHT
    const bool second = false;
#else
    const bool second = true;
#endif
    if (early) wa = tile_fetch<KT>(tw, sb_stride, first_a, lane);
    if (early && second) wb = tile_fetch<KT>(tw, sb_stride, first_b, lane);
    pdl_wait();
    if (skip) {
        pdl_trigger();
        return;
    }
    if (!early) wa = tile_fetch<KT>(tw, sb_stride, first_a, lane);
    if (!early && second) wb = tile_fetch<KT>(tw, sb_stride, first_b, lane);
    // At N = 1 the epilogue's loads (the norm's squares, the sums added to)
    // go out now, their latency hidden under the loop's rather than added
    // after it; their uses stay after the loop.
    float sq_early[2] = {0.f, 0.f}, base_early[2] = {0.f, 0.f};
    if (N == 1 && kw == 0) {
        if (ss) {
            if (lane < nsb) sq_early[0] = ss[lane];
            if (lane + 32 < nsb) sq_early[1] = ss[lane + 32];
        }
        if (add && live && i == 0) {
            const u32 r = 16 * tile + g;
            if (r < m) base_early[0] = y[r];
            if (r + 8 < m) base_early[1] = y[r + 8];
        }
    }
    const RopeKvLane rl = RKV ? rope_kv_lane(rk, which, 16 * tile + g, m) : RopeKvLane{};
    const u32 nb = min(g, (u32)N - 1), n0 = min(2 * i, (u32)N - 1), n1 = min(2 * i + 1, (u32)N - 1);
    const signed char* xr = xq + (u64)nb * nsb * 256 + 64 * i;
    const uint4* mp0 = (const uint4*)(meta + (u64)n0 * nsb * 8);
    const uint4* mp1 = (const uint4*)(meta + (u64)n1 * nsb * 8);
    float acc[4] = {0.f, 0.f, 0.f, 0.f};
    const BdLane bd = bd_lane(g, i);
    auto step = [&](const typename KT::W& cur, u32 sb) {
#ifdef GEMV_NO_MATH  // (measurement aid: the weights' loads alone, each used once; outputs wrong)
        acc[0] += (float)no_math_use(cur);
        return;
#endif
        if constexpr (N == 1 && SPLIT) {
            KT::step_split(cur, xr + 256 * (u64)sb, mp0 + 2 * sb, g, i, bd, acc);
            return;
        }
        const uint4* xs = (const uint4*)(xr + 256 * (u64)sb);
        const uint4 x[4] = {xs[0], xs[1], xs[2], xs[3]};
        const uint4 h0 = mp0[2 * sb], h1 = N > 1 ? mp1[2 * sb] : h0;
        const uint4 s0 = KT::sums ? mp0[2 * sb + 1] : h0;
        const uint4 s1 = KT::sums && N > 1 ? mp1[2 * sb + 1] : s0;
        KT::template step<N>(cur, x, h0, s0, h1, s1, acc);
#ifdef GEMV_MATH_TWICE  // (measurement aid: each product done twice, on a changed input; outputs wrong)
        uint4 x2[4];
#pragma unroll
        for (int q = 0; q < 4; q++) x2[q] = make_uint4(x[q].x ^ sb, x[q].y ^ sb, x[q].z ^ sb, x[q].w ^ sb);
        KT::template step<N>(cur, x2, h0, s0, h1, s1, acc);
#endif
    };
#ifdef GEMV_ONE_IN_FLIGHT  // (trial: one super-block in flight a warp, asked for after the products)
    for (u32 sb = kw; sb < nsb; sb += nw) {
        step(wa, sb);
        if (sb + nw < nsb) wa = tile_fetch<KT>(tw, sb_stride, sb + nw, lane);
    }
    if (false)
#endif
    for (u32 sb = kw; sb < nsb; sb += 2 * nw) {
        step(wa, sb);
        if (sb + 2 * nw < nsb) wa = tile_fetch<KT>(tw, sb_stride, sb + 2 * nw, lane);
        if (sb + nw < nsb) {
            step(wb, sb + nw);
            if (sb + 3 * nw < nsb) wb = tile_fetch<KT>(tw, sb_stride, sb + 3 * nw, lane);
        }
    }
    if constexpr (N == 1 && SPLIT) {  // the quad's sub-blocks, in a fixed order
#pragma unroll
        for (int q = 0; q < 4; q += 2) {
            acc[q] += __shfl_xor_sync(0xffffffffu, acc[q], 1);
            acc[q] += __shfl_xor_sync(0xffffffffu, acc[q], 2);
        }
    }
    trace_mark("tile.loop");
    pdl_trigger();
    if (nw > 1) {
        __shared__ float4 part[16][32];
        const u32 wid = threadIdx.y * nw + kw;
        part[wid][lane] = make_float4(acc[0], acc[1], acc[2], acc[3]);
        __syncthreads();
        if (kw != 0) return;
        for (u32 j = 1; j < nw; j++) {
            const float4 p = part[wid + j][lane];
            acc[0] += p.x, acc[1] += p.y, acc[2] += p.z, acc[3] += p.w;
        }
    }
    if (!live) return;
    float f[2] = {1.f, 1.f};
    if (ss) {  // the input norm (batch 1): each column's squares per super-block
#pragma unroll
        for (u32 n = 0; n < (u32)N; n++) {
            float sq = 0.f;
            u32 c = lane;
            if (N == 1) sq = sq_early[0] + sq_early[1], c += 64;
            for (; c < nsb; c += 32) sq += ss[(u64)n * nsb + c];
            const float v = rsqrtf(warp_sum(sq) / k + eps);
            if (n == n0) f[0] = v;
            if (n == n1) f[1] = v;
        }
    }
    if (RKV) {  // lanes i = 0 hold rows g and g + 8 of the one column
        rope_kv_rows2(rk, rl, which, 16 * tile + g, m, acc[0] * f[0], acc[2] * f[0], i == 0, y);
    } else {
#pragma unroll
        for (int q = 0; q < 4; q++) {
            const u32 row = 16 * tile + g + 8 * (q >> 1), n = 2 * i + (q & 1);
            if (row < m && n < (u32)N) {
                float* p = y + (u64)n * m + row;
                *p = __fmaf_rn(acc[q], f[q & 1], add ? (N == 1 ? base_early[q >> 1] : *p) : 0.f);
            }
        }
    }
    trace_mark("tile.end");
}

#define GEMV_TILE(STEM, KT, N)                                                                                 \
    extern "C" __global__ void __launch_bounds__(512) gemv_##STEM##_##N(GEMVQ_ARGS) {                         \
        gemv_tile_body<KT, N>(blockIdx.x, w0, w1, w2, y0, y1, y2, m0, m1, m2, xq, (const u32*)meta, k, row_bytes, \
                              ss, eps, add);                                                                   \
    }
FOR_EACH_N(GEMV_TILE, q4_k, Q4kTile)
FOR_EACH_N(GEMV_TILE, q5_kt, Q5kTile)  // (`q5_k`: the dp4a GEMV of Q5_K's own blocks)
FOR_EACH_N(GEMV_TILE, q6_k, Q6kTile)
// Batch 1 summed as a batch's rows are (`q4k_step`, `q6k_step`), for the batch-invariant mode.
extern "C" __global__ void __launch_bounds__(512) gemv_q4_k_whole_1(GEMVQ_ARGS) {
    gemv_tile_body<Q4kTile, 1, false, false>(blockIdx.x, w0, w1, w2, y0, y1, y2, m0, m1, m2, xq, (const u32*)meta, k,
                                             row_bytes, ss, eps, add);
}
extern "C" __global__ void __launch_bounds__(512) gemv_q5_kt_whole_1(GEMVQ_ARGS) {
    gemv_tile_body<Q5kTile, 1, false, false>(blockIdx.x, w0, w1, w2, y0, y1, y2, m0, m1, m2, xq, (const u32*)meta, k,
                                             row_bytes, ss, eps, add);
}
extern "C" __global__ void __launch_bounds__(512) gemv_q6_k_whole_1(GEMVQ_ARGS) {
    gemv_tile_body<Q6kTile, 1, false, false>(blockIdx.x, w0, w1, w2, y0, y1, y2, m0, m1, m2, xq, (const u32*)meta, k,
                                             row_bytes, ss, eps, add);
}

// The step's RoPE and KV write fused into q/k/v's GEMV at batch 1 (host:
// gemv.rs `RopeKvArgs`): q/k/v all of one type, or Q4_K or Q5_K q/k with a
// Q6_K v (Q4_K_M's and Q5_K_M's layers with a wider value projection:
// `gemv_q4k_q6k_*`, `gemv_q5k_q6k_*`, blocks 0 .. qk_blocks on q and k, the
// rest on v, all on the one input, so that neither type waits for the other
// to end). Only q is stored as output (y0); k and v go to the caches.
#define RKV_ARGS \
    const u32 *pos, const float *inv_freq, const u32 *slots, u16 *kc, u16 *vc, u32 head_dim, u32 kv_dim
#define RKV_OF RopeKv{pos, inv_freq, slots, kc, vc, head_dim, kv_dim}
#define MIXED_ARGS u64 rb6, u32 qk_blocks
template <class KT, bool RKV>
__device__ void mixed_qkv_body(const u8* w0, const u8* w1, const u8* w2, float* y0, float* y1, float* y2, u32 m0,
                               u32 m1, u32 m2, const signed char* xq, const u32* meta, u32 k, u64 rb_qk,
                               const float* ss, float eps, int add, u64 rb6, u32 qk_blocks,
                               const RopeKv& rk = RopeKv()) {
    if (blockIdx.x < qk_blocks)
        gemv_tile_body<KT, 1, RKV>(blockIdx.x, w0, w1, w1, y0, y1, y1, m0, m1, 0, xq, meta, k, rb_qk, ss, eps, add, rk);
    else
        gemv_tile_body<Q6kTile, 1, RKV>(blockIdx.x - qk_blocks, w2, w2, w2, y2, y2, y2, m2, 0, 0, xq, meta, k, rb6,
                                        ss, eps, add, rk, 2);
}
#define GEMV_MIXED(STEM, KT)                                                                                     \
    extern "C" __global__ void __launch_bounds__(512) gemv_##STEM##_q6k_1(GEMVQ_ARGS, MIXED_ARGS) {             \
        mixed_qkv_body<KT, false>(w0, w1, w2, y0, y1, y2, m0, m1, m2, xq, (const u32*)meta, k, row_bytes, ss, eps, \
                                  add, rb6, qk_blocks);                                                           \
    }                                                                                                            \
    extern "C" __global__ void __launch_bounds__(512) gemv_##STEM##_q6k_rkv_1(GEMVQ_ARGS, MIXED_ARGS, RKV_ARGS) { \
        mixed_qkv_body<KT, true>(w0, w1, w2, y0, y1, y2, m0, m1, m2, xq, (const u32*)meta, k, row_bytes, ss, eps,  \
                                 add, rb6, qk_blocks, RKV_OF);                                                    \
    }
GEMV_MIXED(q4k, Q4kTile)
GEMV_MIXED(q5k, Q5kTile)
#define GEMV_RKV(STEM, KT)                                                                                    \
    extern "C" __global__ void __launch_bounds__(512) gemv_##STEM##_rkv_1(GEMVQ_ARGS, RKV_ARGS) {             \
        gemv_tile_body<KT, 1, true>(blockIdx.x, w0, w1, w2, y0, y1, y2, m0, m1, m2, xq, (const u32*)meta, k,  \
                                    row_bytes, ss, eps, add, RKV_OF);                                         \
    }
GEMV_RKV(q4_k, Q4kTile)
GEMV_RKV(q5_kt, Q5kTile)
GEMV_RKV(q6_k, Q6kTile)
