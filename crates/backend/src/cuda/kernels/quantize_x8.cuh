// The 8-bit inputs of the quantized decode GEMVs (kernels/quant.cu), as
// device functions: quant.cu's kernels run them over a whole input, and
// the attention row kernels over the output they have just written, so that
// the output projection's input needs no kernel of its own.

// Input groups of 32 (in piece order with `kperm`, which needs k % 256 ==
// 0): the 8-bit values, and per group its scale (f32 bits) and the sums of
// its first and last 16 values (two i16).
// With an input norm (`nw` not null, rows of k values): x times the norm's
// weights is quantized, and each group's sum of squares of x goes to `ss`
// for the GEMV, which scales its sums by the norm (quantizing is
// scale-invariant: the 8-bit values are those of the normed input).
// With `up` (not null), act(x) * up is quantized instead: a gated MLP's
// activation, computed here rather than by a kernel of its own (`glu`).
__device__ __forceinline__ void quantize_group(u64 g, u32 lane, const float* x, signed char* xq, uint2* meta,
                                               int kperm, const float* nw, u32 k, float* ss, const float* up,
                                               int act) {
    const u64 src = kperm ? (g >> 3) * 256 + 64 * ((g & 7) >> 1) + 32 * (lane >> 4) + 16 * (g & 1) + (lane & 15)
                          : 32 * g + lane;
    // (The norm's weight is loaded with x: after the store to ss below it
    // would wait a round trip of its own.)
    const float wn = nw ? nw[src % k] : 1.f;
    float v = x[src];
    if (up) v = act_fn(v, act) * up[src];
    if (nw) {
        float sq = v * v;
        for (int o = 16; o > 0; o >>= 1) sq += __shfl_xor_sync(0xffffffffu, sq, o);
        if (lane == 0) ss[g] = sq;
        v *= wn;
    }
    float amax = fabsf(v);
    for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    const float d = amax / 127.f;
    // (Clamped: a subnormal amax makes d zero.)
    const int q = amax > 0.f ? max(-127, min(127, __float2int_rn(v / d))) : 0;
    xq[32 * g + lane] = (signed char)q;
    int lo = lane < 16 ? q : 0, hi = lane < 16 ? 0 : q;
    for (int o = 16; o > 0; o >>= 1) {
        lo += __shfl_xor_sync(0xffffffffu, lo, o);
        hi += __shfl_xor_sync(0xffffffffu, hi, o);
    }
    if (lane == 0) meta[g] = make_uint2(__float_as_uint(d), ((u32)lo & 0xffffu) | ((u32)hi << 16));
}

// The input (`quantize_x8_sb`): per super-block of 256 values of a row one
// step D / 8, and per sub-block of 32 a shift t (0..3): its values are
// rounded at the step D / 2^(3 - t), the finest of the four that keeps them
// within ±127 (D = the super-block's largest magnitude / 127), so each
// sub-block is rounded at most twice as coarsely as at a scale of its own
// while the products stay integers across the super-block:
//   sum_i x_i (d sc_s q_i - dmin m_s) = (D / 8) (d sum_s sc_s 2^t_s dot_s - dmin sum_s m_s bsum_s)
// where bsum_s is the sub-block's sum of inputs times 2^t_s. Per super-block
// eight u32 of `meta`: D / 8 (f32 bits), the shifts (a byte per sub-block,
// two words), a zero word, the bsums (i16 pairs, four words).
// The 8-bit values are in fragment order: lane i of a quad reads 64 bytes,
// for each sub-block s its values 4i..4i+3 and 16+4i..16+4i+3.
__device__ __forceinline__ void store_sb(u64 g, u32 lane, const float (&v)[8], signed char* xq, u32* meta) {
    float sub = 0.f;
#pragma unroll
    for (int e = 0; e < 8; e++) sub = fmaxf(sub, fabsf(v[e]));
    sub = fmaxf(sub, __shfl_xor_sync(0xffffffffu, sub, 1));
    sub = fmaxf(sub, __shfl_xor_sync(0xffffffffu, sub, 2));
    float amax = sub;
    for (int o = 4; o < 32; o <<= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    // Coarsest first: t = 3 - (doublings of the sub-block's largest that stay within amax).
    int t = 3;
    while (t > 0 && sub * (float)(16 >> t) <= amax) t--;
    const float inv = 8.f / (amax / 127.f * (float)(1 << t));
    u32 lo = 0, hi = 0;
    int sum = 0;
#pragma unroll
    for (int e = 0; e < 8; e++) {
        // (Clamped: a subnormal amax makes the step zero.)
        const int q = amax > 0.f ? max(-127, min(127, __float2int_rn(v[e] * inv))) : 0;
        sum += q;
        if (e < 4) lo |= ((u32)q & 0xffu) << (8 * e);
        else hi |= ((u32)q & 0xffu) << (8 * (e - 4));
    }
    sum += __shfl_xor_sync(0xffffffffu, sum, 1);
    sum += __shfl_xor_sync(0xffffffffu, sum, 2);
    const u32 s = lane >> 2, h = (lane & 3) >> 1, i = 2 * (lane & 1);
    u32* dst = (u32*)(xq + 256 * g);
    dst[16 * i + 2 * s + h] = lo;
    dst[16 * (i + 1) + 2 * s + h] = hi;
    u32* mg = meta + 8 * g;
    if ((lane & 3) == 0) {
        ((unsigned char*)(mg + 1))[s] = (unsigned char)t;
        ((short*)(mg + 4))[s] = (short)(sum << t);
    }
    if (lane == 0) mg[0] = __float_as_uint(amax / 127.f / 8.f), mg[3] = 0;
}

// Super-block g of x (values 8 lane .. + 7 a lane) quantized as `store_sb`
// does, normed or gated first (see `quantize_group`). Rows of k values: a
// row's last super-block, where k % 256 != 0 (tiles padded at upload,
// weight.rs `tiles_at_upload`), takes zeros past its end.
__device__ __forceinline__ void quantize_sb(u64 g, u32 lane, const float* x, signed char* xq, u32* meta,
                                            const float* nw, u32 k, float* ss, const float* up, int act) {
    // (32-bit division: an input holds fewer than 2^32 super-blocks.)
    const u32 nsb = (k + 255) / 256, gs = (u32)g, col = 256 * (gs % nsb) + 8 * lane;  // values col .. + 7 of the row
    const u64 src = (u64)(gs / nsb) * k + col;
    // (The norm's weights are loaded with x, as in `quantize_group`; 16-byte
    // aligned: a buffer's start plus a multiple of 8 values.)
    float4 na = make_float4(1.f, 1.f, 1.f, 1.f), nb = na;
    float4 a = make_float4(0.f, 0.f, 0.f, 0.f), b = a;
    if (col < k) {  // (k % 8 == 0: a lane's 8 values are all in the row or all past it)
        if (nw) na = *(const float4*)(nw + col), nb = *(const float4*)(nw + col + 4);
        a = *(const float4*)(x + src), b = *(const float4*)(x + src + 4);
    }
    float v[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
    if (up && col < k) {
        const float4 ua = *(const float4*)(up + src), ub = *(const float4*)(up + src + 4);
        const float u[8] = {ua.x, ua.y, ua.z, ua.w, ub.x, ub.y, ub.z, ub.w};
#pragma unroll
        for (int e = 0; e < 8; e++) v[e] = act_fn(v[e], act) * u[e];
    }
    if (nw) {
        float sq = 0.f;
#pragma unroll
        for (int e = 0; e < 8; e++) sq += v[e] * v[e];
        sq = warp_sum(sq);
        if (lane == 0) ss[g] = sq;
        const float wr[8] = {na.x, na.y, na.z, na.w, nb.x, nb.y, nb.z, nb.w};
#pragma unroll
        for (int e = 0; e < 8; e++) v[e] *= wr[e];
    }
    store_sb(g, lane, v, xq, meta);
}

// Where a kernel also writes its output as a quantized GEMV's input: the
// 8-bit values and their metadata in `order` (gemv.rs `input_order`: 0
// groups of 32 in place, 1 in k-quant piece order, 2 the tiles' super-blocks);
// a null `xq`: not at all.
struct X8Out {
    signed char* xq;
    u32* meta;
    int order;
};

// Values base .. base + count of x (whole groups; super-blocks for orders 1
// and 2) as `o`'s input, by warp `warp` of `warps` (all lanes of each).
__device__ __forceinline__ void quantize_span(const float* x, u64 base, u32 count, X8Out o, u32 warp, u32 warps) {
    const u32 lane = threadIdx.x & 31;
    if (o.order == 2) {  // (k = 256: group g is x's super-block g)
        for (u32 s = warp; s < count / 256; s += warps)
            quantize_sb(base / 256 + s, lane, x, o.xq, o.meta, nullptr, 256, nullptr, nullptr, 0);
        return;
    }
    for (u32 j = warp; j < count / 32; j += warps)
        quantize_group(base / 32 + j, lane, x, o.xq, (uint2*)o.meta, o.order, nullptr, 1, nullptr, nullptr, 0);
}
