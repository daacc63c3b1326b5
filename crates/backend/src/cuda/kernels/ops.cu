// Elementwise and row-wise ops on f32 activations [rows, cols], row-major.

extern "C" __global__ void to_bf16(const float* x, u16* y, u64 n) {
    pdl_trigger();
    pdl_wait();
    for (u64 i = blockIdx.x * (u64)blockDim.x + threadIdx.x; i < n; i += (u64)gridDim.x * blockDim.x)
        y[i] = f32_to_bf16(x[i]);
}

extern "C" __global__ void to_f16(const float* x, u16* y, u64 n) {
    pdl_trigger();
    pdl_wait();
    for (u64 i = blockIdx.x * (u64)blockDim.x + threadIdx.x; i < n; i += (u64)gridDim.x * blockDim.x)
        y[i] = f32_to_f16(x[i]);
}

// f32 values of a 16-bit copy (bf16 when `bf16`, else f16): for an op that
// reads f32 from a tensor whose maker wrote only its 16-bit copy.
extern "C" __global__ void from_half(const u16* h, float* y, u64 n, int bf16) {
    pdl_trigger();
    pdl_wait();
    for (u64 i = blockIdx.x * (u64)blockDim.x + threadIdx.x; i < n; i += (u64)gridDim.x * blockDim.x)
        y[i] = bf16 ? bf16_to_f32(h[i]) : f16_to_f32(h[i]);
}

// w[r, c] *= s[c] for 16-bit weights [n / cols, cols] (bf16 when `bf16`,
// else f16), rounded once: an RMS norm's weights folded into the matmuls
// that read its output (`fold_norm`).
extern "C" __global__ void scale_cols_half(u16* w, const float* s, u64 n, u32 cols, int bf16) {
    pdl_trigger();
    pdl_wait();
    for (u64 i = blockIdx.x * (u64)blockDim.x + threadIdx.x; i < n; i += (u64)gridDim.x * blockDim.x) {
        const float v = (bf16 ? bf16_to_f32(w[i]) : f16_to_f32(w[i])) * s[i % cols];
        w[i] = f32_to_half(v, bf16);
    }
}

extern "C" __global__ void add(float* x, const float* y, u64 n) {
    pdl_trigger();
    pdl_wait();
    for (u64 i = blockIdx.x * (u64)blockDim.x + threadIdx.x; i < n; i += (u64)gridDim.x * blockDim.x)
        x[i] += y[i];
}

// x[r, c] += v[c]
extern "C" __global__ void add_row(float* x, const float* v, u64 n, u32 cols) {
    pdl_trigger();
    pdl_wait();
    for (u64 i = blockIdx.x * (u64)blockDim.x + threadIdx.x; i < n; i += (u64)gridDim.x * blockDim.x)
        x[i] += v[i % cols];
}

extern "C" __global__ void scale(float* x, float s, u64 n) {
    pdl_trigger();
    pdl_wait();
    for (u64 i = blockIdx.x * (u64)blockDim.x + threadIdx.x; i < n; i += (u64)gridDim.x * blockDim.x)
        x[i] *= s;
}

extern "C" __global__ void softcap(float* x, float cap, u64 n) {
    pdl_trigger();
    pdl_wait();
    for (u64 i = blockIdx.x * (u64)blockDim.x + threadIdx.x; i < n; i += (u64)gridDim.x * blockDim.x)
        x[i] = cap * tanhf(x[i] / cap);
}

extern "C" __global__ void activate(float* x, u64 n, int act) {
    pdl_trigger();
    pdl_wait();
    for (u64 i = blockIdx.x * (u64)blockDim.x + threadIdx.x; i < n; i += (u64)gridDim.x * blockDim.x)
        x[i] = act_fn(x[i], act);
}

// activate, writing the result in 16 bits too (bf16 when `bf16`, else f16).
extern "C" __global__ void activate_half(float* x, u16* half, u64 n, int act, int bf16) {
    pdl_trigger();
    pdl_wait();
    for (u64 i = blockIdx.x * (u64)blockDim.x + threadIdx.x; i < n; i += (u64)gridDim.x * blockDim.x) {
        const float y = act_fn(x[i], act);
        x[i] = y;
        half[i] = f32_to_half(y, bf16);
    }
}

// out = act(gate) * up; `half`, when given, gets it in 16 bits too (bf16
// when `bf16`, else f16) for the GEMM that reads it next.
extern "C" __global__ void glu(const float* gate, const float* up, float* out, u64 n, int act, u16* half, int bf16) {
    pdl_trigger();
    pdl_wait();
    for (u64 i = blockIdx.x * (u64)blockDim.x + threadIdx.x; i < n; i += (u64)gridDim.x * blockDim.x) {
        const float y = act_fn(gate[i], act) * up[i];
        out[i] = y;
        if (half) half[i] = f32_to_half(y, bf16);
    }
}

// glu from bf16 gate and up, as a GEMM wrote them (half the bytes of f32);
// four values a thread, the last n % 4 one each. A null `out` writes the
// 16-bit copy alone, where only GEMMs read the result (`CudaTensor`).
extern "C" __global__ void glu_bf16in(const u16* gate, const u16* up, float* out, u64 n, int act, u16* half,
                                      int bf16) {
    pdl_trigger();
    pdl_wait();
    const u64 stride = (u64)gridDim.x * blockDim.x, t = blockIdx.x * (u64)blockDim.x + threadIdx.x;
    for (u64 i = t; i < n / 4; i += stride) {
        const uint2 g = ((const uint2*)gate)[i], u = ((const uint2*)up)[i];
        const u32 gw[2] = {g.x, g.y}, uw[2] = {u.x, u.y};
        float y[4];
#pragma unroll
        for (int j = 0; j < 4; j++) {
            const u32 sh = 16 * (j & 1);
            y[j] = act_fn(bf16_to_f32((u16)(gw[j / 2] >> sh)), act) * bf16_to_f32((u16)(uw[j / 2] >> sh));
        }
        if (out) ((float4*)out)[i] = make_float4(y[0], y[1], y[2], y[3]);
        if (half) {
            const u32 lo = (u32)f32_to_half(y[0], bf16) | ((u32)f32_to_half(y[1], bf16) << 16);
            const u32 hi = (u32)f32_to_half(y[2], bf16) | ((u32)f32_to_half(y[3], bf16) << 16);
            ((uint2*)half)[i] = make_uint2(lo, hi);
        }
    }
    for (u64 i = n / 4 * 4 + t; i < n; i += stride) {
        const float y = act_fn(bf16_to_f32(gate[i]), act) * bf16_to_f32(up[i]);
        if (out) out[i] = y;
        if (half) half[i] = f32_to_half(y, bf16);
    }
}

// One block per group of `g` values (a row, or one head of a row); `half`
// as in glu, and a null `out` as in glu_bf16in.
extern "C" __global__ void rms_norm(const float* x, const float* w, float* out, u32 g, float eps, u16* half,
                                    int bf16) {
    pdl_trigger();
    pdl_wait();
    const float* xi = x + (u64)blockIdx.x * g;
    float* oi = out + (u64)blockIdx.x * g;
    float ss = 0.f;
    for (u32 i = threadIdx.x; i < g; i += blockDim.x) ss += xi[i] * xi[i];
    const float r = rsqrtf(block_sum(ss) / g + eps);
    for (u32 i = threadIdx.x; i < g; i += blockDim.x) {
        const float y = xi[i] * r * w[i];
        if (out) oi[i] = y;
        if (half) half[(u64)blockIdx.x * g + i] = f32_to_half(y, bf16);
    }
}

// One block per row; two passes (mean, then centred variance). `b` may be null.
extern "C" __global__ void layer_norm(const float* x, const float* w, const float* b, float* out, u32 cols,
                                      float eps) {
    pdl_trigger();
    pdl_wait();
    const float* xi = x + (u64)blockIdx.x * cols;
    float* oi = out + (u64)blockIdx.x * cols;
    float s = 0.f;
    for (u32 i = threadIdx.x; i < cols; i += blockDim.x) s += xi[i];
    const float mean = block_sum(s) / cols;
    float v = 0.f;
    for (u32 i = threadIdx.x; i < cols; i += blockDim.x) v += (xi[i] - mean) * (xi[i] - mean);
    const float r = rsqrtf(block_sum(v) / cols + eps);
    for (u32 i = threadIdx.x; i < cols; i += blockDim.x) {
        const float y = (xi[i] - mean) * r * w[i];
        oi[i] = b ? y + b[i] : y;
    }
}

// LayerNorm with one warp per row, the row in registers (VEC float4 per
// lane: cols a multiple of 4, at most 128 * VEC): x += y first when y is
// given (the residual add fused in), b may be null, and `half`, when given,
// gets the output in 16 bits too (bf16 when `bf16`, else f16) for the GEMM
// that reads it. Two passes over the registers: mean, then centred variance.
template <int VEC>
__device__ __forceinline__ void layer_norm_warp(float* x, const float* y, const float* w, const float* b, float* out,
                                                u16* half, int bf16, u32 rows, u32 cols, float eps) {
    const u32 row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (row >= rows) return;
    const u32 n4 = cols / 4;
    float4* xi = (float4*)(x + (u64)row * cols);
    float4 v[VEC];
    float s = 0.f;
#pragma unroll
    for (int j = 0; j < VEC; j++) {
        const u32 i = lane + 32 * j;
        v[j] = make_float4(0.f, 0.f, 0.f, 0.f);
        if (i < n4) {
            v[j] = xi[i];
            if (y) {
                const float4 t = ((const float4*)(y + (u64)row * cols))[i];
                v[j] = make_float4(v[j].x + t.x, v[j].y + t.y, v[j].z + t.z, v[j].w + t.w);
                xi[i] = v[j];
            }
            s += v[j].x + v[j].y + v[j].z + v[j].w;
        }
    }
    const float mean = warp_sum(s) / cols;
    float q = 0.f;
#pragma unroll
    for (int j = 0; j < VEC; j++) {
        if (lane + 32 * j < n4) {
            const float a = v[j].x - mean, c = v[j].y - mean, d = v[j].z - mean, e = v[j].w - mean;
            q += a * a + c * c + d * d + e * e;
        }
    }
    const float r = rsqrtf(warp_sum(q) / cols + eps);
    float4* oi = (float4*)(out + (u64)row * cols);
#pragma unroll
    for (int j = 0; j < VEC; j++) {
        const u32 i = lane + 32 * j;
        if (i >= n4) continue;
        const float4 g = ((const float4*)w)[i];
        const float4 o = b ? ((const float4*)b)[i] : make_float4(0.f, 0.f, 0.f, 0.f);
        const float4 t = make_float4((v[j].x - mean) * r * g.x + o.x, (v[j].y - mean) * r * g.y + o.y,
                                     (v[j].z - mean) * r * g.z + o.z, (v[j].w - mean) * r * g.w + o.w);
        oi[i] = t;
        if (half) {
            const u32 lo = f32_to_half(t.x, bf16) | ((u32)f32_to_half(t.y, bf16) << 16);
            const u32 hi = f32_to_half(t.z, bf16) | ((u32)f32_to_half(t.w, bf16) << 16);
            ((uint2*)(half + (u64)row * cols))[i] = make_uint2(lo, hi);
        }
    }
}

#define LAYER_NORM_WARP(VEC)                                                                                   \
    extern "C" __global__ void layer_norm_w##VEC(float* x, const float* y, const float* w, const float* b,    \
                                                 float* out, u16* half, int bf16, u32 rows, u32 cols,         \
                                                 float eps) {                                                 \
        pdl_trigger();                                                                                        \
        pdl_wait();                                                                                           \
        layer_norm_warp<VEC>(x, y, w, b, out, half, bf16, rows, cols, eps);                                   \
    }
LAYER_NORM_WARP(2)
LAYER_NORM_WARP(4)
LAYER_NORM_WARP(8)

#define MAX_HALF 256  // rotated pairs per head (head_dim <= 512)

__device__ __forceinline__ void store_kv(float* c, u64 i, float v) { c[i] = v; }
__device__ __forceinline__ void store_kv(u16* c, u64 i, float v) { c[i] = f32_to_f16(v); }

// Activations RoPE reads and writes: f32, or bf16 (raw bits; prefill's q, k
// and v when only their bf16 copies were written).
__device__ __forceinline__ float load_act(const float* p, u64 i) { return p[i]; }
__device__ __forceinline__ float load_act(const u16* p, u64 i) { return bf16_to_f32(p[i]); }
__device__ __forceinline__ void store_act(float* p, u64 i, float v) { p[i] = v; }
__device__ __forceinline__ void store_act(u16* p, u64 i, float v) { p[i] = f32_to_bf16(v); }
// Two adjacent values (i even) in one load or store.
__device__ __forceinline__ float2 load2_act(const float* p, u64 i) { return *(const float2*)(p + i); }
__device__ __forceinline__ float2 load2_act(const u16* p, u64 i) {
    const u32 w = *(const u32*)(p + i);
    return make_float2(__uint_as_float(w << 16), __uint_as_float(w & 0xffff0000u));
}
__device__ __forceinline__ void store2_act(float* p, u64 i, float a, float b) { *(float2*)(p + i) = make_float2(a, b); }
__device__ __forceinline__ void store2_act(u16* p, u64 i, float a, float b) {
    *(u32*)(p + i) = (u32)f32_to_bf16(a) | ((u32)f32_to_bf16(b) << 16);
}
__device__ __forceinline__ void store2_kv(float* c, u64 i, float a, float b) { *(float2*)(c + i) = make_float2(a, b); }
__device__ __forceinline__ void store2_kv(u16* c, u64 i, float a, float b) {
    *(u32*)(c + i) = (u32)f32_to_f16(a) | ((u32)f32_to_f16(b) << 16);
}

// One row's rotary embedding, in place; each turned pair also stored at
// `cache + dst` when `cache` is given. Angles once per row in shared memory,
// then every pair of every head at once: a loop over heads per thread would
// wait on each load in turn. Pairs (2i, 2i+1) when `interleaved`, else
// (i, i + head_dim/2).
template <typename XT, typename KT>
__device__ void rope_row(XT* xi, u32 cols, float p, const float* inv_freq, u32 head_dim, int interleaved,
                         KT* cache, u64 dst) {
    __shared__ float cs[MAX_HALF], sn[MAX_HALF];
    const u32 half = head_dim / 2;
    for (u32 i = threadIdx.x; i < half; i += blockDim.x) sincosf(p * inv_freq[i], &sn[i], &cs[i]);
    __syncthreads();
    if (!(half & 1)) {
        // Two pairs (i, i + 1) a thread: their values lie in twos (or a four,
        // interleaved), each loaded and stored at once.
        for (u32 j = 2 * threadIdx.x; j < cols / 2; j += 2 * blockDim.x) {
            const u32 h = j / half, i = j % half;
            const u32 a = h * head_dim + (interleaved ? 2 * i : i), b = interleaved ? a + 2 : a + half;
            // Pair k is (uk, wk): in memory u0 w0 u1 w1 (interleaved), else u0 u1 at a, w0 w1 at b.
            const float2 v0 = load2_act(xi, a), v1 = load2_act(xi, b);
            const float u0 = v0.x, w0 = interleaved ? v0.y : v1.x;
            const float u1 = interleaved ? v1.x : v0.y, w1 = v1.y;
            const float ra0 = u0 * cs[i] - w0 * sn[i], rb0 = u0 * sn[i] + w0 * cs[i];
            const float ra1 = u1 * cs[i + 1] - w1 * sn[i + 1], rb1 = u1 * sn[i + 1] + w1 * cs[i + 1];
            // Back in memory order.
            const float2 oa = interleaved ? make_float2(ra0, rb0) : make_float2(ra0, ra1);
            const float2 ob = interleaved ? make_float2(ra1, rb1) : make_float2(rb0, rb1);
            store2_act(xi, a, oa.x, oa.y);
            store2_act(xi, b, ob.x, ob.y);
            if (cache) {
                store2_kv(cache, dst + a, oa.x, oa.y);
                store2_kv(cache, dst + b, ob.x, ob.y);
            }
        }
        return;
    }
    for (u32 j = threadIdx.x; j < cols / 2; j += blockDim.x) {
        const u32 h = j / half, i = j % half;
        const u32 a = h * head_dim + (interleaved ? 2 * i : i);
        const u32 b = h * head_dim + (interleaved ? 2 * i + 1 : i + half);
        const float u = load_act(xi, a), w = load_act(xi, b);
        const float ra = u * cs[i] - w * sn[i], rb = u * sn[i] + w * cs[i];
        store_act(xi, a, ra);
        store_act(xi, b, rb);
        if (cache) {
            store_kv(cache, dst + a, ra);
            store_kv(cache, dst + b, rb);
        }
    }
}

// Rotary embedding in place of one or two tensors with the same positions;
// one block per row and tensor (block row y turns tensor y: q and k in one
// launch; y is only 0 for one tensor).
extern "C" __global__ void rope(float* x0, float* x1, const u32* pos, const float* inv_freq, u32 cols0, u32 cols1,
                                u32 head_dim, int interleaved) {
    pdl_trigger();
    pdl_wait();
    const u32 cols = blockIdx.y ? cols1 : cols0;
    float* xi = (blockIdx.y ? x1 : x0) + (u64)blockIdx.x * cols;
    rope_row<float, float>(xi, cols, (float)pos[blockIdx.x], inv_freq, head_dim, interleaved, nullptr, 0);
}

// `rope` on q and k, then K and V stored at their cache slots, in one launch
// (every layer of every step runs it). Block (row, part): part 0 turns q's
// row; part 1 turns k's row and stores it, part 2 stores v's row.
// q, k and v are XT: f32, or bf16 (`rope_kv_f16_bf16in`).
template <typename XT, typename KT>
__device__ void rope_kv_body(XT* q, XT* k, const XT* v, const u32* pos, const float* inv_freq,
                             const u32* slots, KT* kc, KT* vc, u32 q_cols, u32 kv_dim, u32 head_dim,
                             int interleaved) {
    const u32 row = blockIdx.x, part = blockIdx.y;
    const u64 dst = (u64)slots[row] * kv_dim;
    if (part == 2) {
        const XT* vi = v + (u64)row * kv_dim;
        if (!(kv_dim & 1)) {
            for (u32 i = 2 * threadIdx.x; i < kv_dim; i += 2 * blockDim.x) {
                const float2 x = load2_act(vi, i);
                store2_kv(vc, dst + i, x.x, x.y);
            }
            return;
        }
        for (u32 i = threadIdx.x; i < kv_dim; i += blockDim.x) store_kv(vc, dst + i, load_act(vi, i));
        return;
    }
    const u32 cols = part ? kv_dim : q_cols;
    XT* xi = (part ? k : q) + (u64)row * cols;
    rope_row<XT, KT>(xi, cols, (float)pos[row], inv_freq, head_dim, interleaved, part ? kc : nullptr, dst);
}

#define ROPE_KV(NAME, XT, KT)                                                                                 \
    extern "C" __global__ void NAME(XT* q, XT* k, const XT* v, const u32* pos, const float* inv_freq,          \
                                    const u32* slots, KT* kc, KT* vc, u32 q_cols, u32 kv_dim, u32 head_dim,    \
                                    int interleaved) {                                                        \
        pdl_trigger();                                                                                        \
        pdl_wait();                                                                                           \
        rope_kv_body<XT, KT>(q, k, v, pos, inv_freq, slots, kc, vc, q_cols, kv_dim, head_dim, interleaved);   \
    }
ROPE_KV(rope_kv_f32, float, float)
ROPE_KV(rope_kv_f16, float, u16)
ROPE_KV(rope_kv_f16_bf16in, u16, u16)

// Prefill's bf16 q, k and v (`rope_kv_f16_bf16in`'s work, f16 cache) for
// heads of a multiple of 16: RK_ROWS rows a block, each thread on units of
// eight pairs (two 16-byte loads and stores), RK_UNROLL units' loads in
// flight before any store. (A block per row and part, two pairs a thread,
// was latency-bound: 49,152 short blocks for 16,384 rows, at a third of the
// copy bandwidth.) Block (rows, part): part 0 turns q, part 1 turns k and
// stores it, part 2 stores v.
#define RK_ROWS 8
#define RK_UNROLL 4

__device__ __forceinline__ void bf16x8(uint4 w, float* f) {
    const u32 v[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
    for (int i = 0; i < 4; i++) {
        f[2 * i] = __uint_as_float(v[i] << 16);
        f[2 * i + 1] = __uint_as_float(v[i] & 0xffff0000u);
    }
}

__device__ __forceinline__ uint4 pack8(const float* f, bool bf16) {
    u32 v[4];
#pragma unroll
    for (int i = 0; i < 4; i++) v[i] = (u32)f32_to_half(f[2 * i], bf16) | ((u32)f32_to_half(f[2 * i + 1], bf16) << 16);
    return make_uint4(v[0], v[1], v[2], v[3]);
}

extern "C" __global__ void rope_kv_rows(u16* q, u16* k, const u16* v, const u32* pos, const float* inv_freq,
                                        const u32* slots, u16* kc, u16* vc, u32 rows, u32 q_cols, u32 kv_dim,
                                        u32 head_dim, int interleaved) {
    pdl_trigger();
    pdl_wait();
    __shared__ float cs[RK_ROWS][MAX_HALF / 2], sn[RK_ROWS][MAX_HALF / 2];
    const u32 r0 = blockIdx.x * RK_ROWS, part = blockIdx.y, half = head_dim / 2;
    const u32 nr = min((u32)RK_ROWS, rows - r0);
    if (part < 2) {
        for (u32 t = threadIdx.x; t < nr * half; t += blockDim.x) {
            const u32 r = t / half, i = t % half;
            sincosf((float)pos[r0 + r] * inv_freq[i], &sn[r][i], &cs[r][i]);
        }
        __syncthreads();
    }
    const u32 cols = part == 0 ? q_cols : kv_dim;
    // A unit: 16 values of a row (q, k: eight pairs; v: two 8-value copies).
    const u32 units = cols / 16, total = nr * units;
    u16* x = part == 0 ? q : k;
    for (u32 t0 = threadIdx.x; t0 < total; t0 += RK_UNROLL * blockDim.x) {
        uint4 lo[RK_UNROLL], hi[RK_UNROLL];
        // Per unit: its row's offset in x and in the cache, its two columns.
        u64 row[RK_UNROLL], dst[RK_UNROLL];
        u32 lo_col[RK_UNROLL], hi_col[RK_UNROLL], i0[RK_UNROLL], rr[RK_UNROLL];
#pragma unroll
        for (int z = 0; z < RK_UNROLL; z++) {
            const u32 t = t0 + z * blockDim.x;
            if (t >= total) break;
            const u32 r = t / units, u = t % units;
            rr[z] = r;
            row[z] = (u64)(r0 + r) * cols;
            dst[z] = (u64)slots[r0 + r] * kv_dim;
            if (part == 2) {
                lo_col[z] = 16 * u, hi_col[z] = 16 * u + 8;
            } else {
                // Head h, pairs i0 .. i0 + 7: at i0 and i0 + half, or 16 values at 2 i0.
                const u32 h = u / (half / 8);
                i0[z] = 8 * (u % (half / 8));
                lo_col[z] = h * head_dim + (interleaved ? 2 * i0[z] : i0[z]);
                hi_col[z] = lo_col[z] + (interleaved ? 8 : half);
            }
            const u16* src = (part == 2 ? v : x) + row[z];
            lo[z] = *(const uint4*)(src + lo_col[z]);
            hi[z] = *(const uint4*)(src + hi_col[z]);
        }
#pragma unroll
        for (int z = 0; z < RK_UNROLL; z++) {
            const u32 t = t0 + z * blockDim.x;
            if (t >= total) break;
            float a[8], b[8];
            bf16x8(lo[z], a);
            bf16x8(hi[z], b);
            if (part == 2) {
                *(uint4*)(vc + dst[z] + lo_col[z]) = pack8(a, false);
                *(uint4*)(vc + dst[z] + hi_col[z]) = pack8(b, false);
                continue;
            }
            const float* c = cs[rr[z]] + i0[z];
            const float* s = sn[rr[z]] + i0[z];
            float ra[8], rb[8];
            if (interleaved) {
                // Pairs (a0, a1) .. (a6, a7) then (b0, b1) .. (b6, b7).
#pragma unroll
                for (int m = 0; m < 4; m++) {
                    ra[2 * m] = a[2 * m] * c[m] - a[2 * m + 1] * s[m];
                    ra[2 * m + 1] = a[2 * m] * s[m] + a[2 * m + 1] * c[m];
                    rb[2 * m] = b[2 * m] * c[4 + m] - b[2 * m + 1] * s[4 + m];
                    rb[2 * m + 1] = b[2 * m] * s[4 + m] + b[2 * m + 1] * c[4 + m];
                }
            } else {
#pragma unroll
                for (int m = 0; m < 8; m++) {
                    ra[m] = a[m] * c[m] - b[m] * s[m];
                    rb[m] = a[m] * s[m] + b[m] * c[m];
                }
            }
            *(uint4*)(x + row[z] + lo_col[z]) = pack8(ra, true);
            *(uint4*)(x + row[z] + hi_col[z]) = pack8(rb, true);
            if (part == 1) {
                *(uint4*)(kc + dst[z] + lo_col[z]) = pack8(ra, false);
                *(uint4*)(kc + dst[z] + hi_col[z]) = pack8(rb, false);
            }
        }
    }
}

// out[i] = x[rows[i]]; one block per output row.
extern "C" __global__ void gather_rows(const float* x, const u32* rows, float* out, u32 cols) {
    pdl_trigger();
    pdl_wait();
    const float* src = x + (u64)rows[blockIdx.x] * cols;
    float* dst = out + (u64)blockIdx.x * cols;
    for (u32 i = threadIdx.x; i < cols; i += blockDim.x) dst[i] = src[i];
}

// One row per segment [lo, hi) of x's rows (segs holds lo, hi pairs): their
// mean (mode 0, summed in double like the CPU) or element-wise maximum (1).
extern "C" __global__ void reduce_segments(const float* x, const u32* segs, float* out, u32 cols, int mode) {
    pdl_trigger();
    pdl_wait();
    const u32 lo = segs[2 * blockIdx.x], hi = segs[2 * blockIdx.x + 1];
    for (u32 c = threadIdx.x; c < cols; c += blockDim.x) {
        double sum = 0.0;
        float top = -INFINITY;
        for (u32 r = lo; r < hi; ++r) {
            const float v = x[(u64)r * cols + c];
            sum += v;
            top = fmaxf(top, v);
        }
        out[(u64)blockIdx.x * cols + c] = mode == 0 ? (float)(sum / (double)(hi - lo)) : top;
    }
}

// Embedding rows of a table stored as f32 (dtype 0), f16 (1) or bf16 (2).
extern "C" __global__ void embedding(const void* table, const u32* ids, const u32* picks, float* out, u32 cols,
                                     int dtype) {
    pdl_trigger();
    pdl_wait();
    const u64 base = (u64)token_id(ids[blockIdx.x], picks) * cols;
    float* dst = out + (u64)blockIdx.x * cols;
    for (u32 i = threadIdx.x; i < cols; i += blockDim.x) {
        float v;
        if (dtype == 0) v = ((const float*)table)[base + i];
        else if (dtype == 1) v = f16_to_f32(((const u16*)table)[base + i]);
        else v = bf16_to_f32(((const u16*)table)[base + i]);
        dst[i] = v;
    }
}

// Stores K and V rows [n, kv_dim] at their cache slots; one block per row.
extern "C" __global__ void write_kv_f32(const float* k, const float* v, const u32* slots, float* kc, float* vc,
                                        u32 kv_dim) {
    pdl_trigger();
    pdl_wait();
    const u64 src = (u64)blockIdx.x * kv_dim, dst = (u64)slots[blockIdx.x] * kv_dim;
    for (u32 i = threadIdx.x; i < kv_dim; i += blockDim.x) {
        kc[dst + i] = k[src + i];
        vc[dst + i] = v[src + i];
    }
}

extern "C" __global__ void write_kv_f16(const float* k, const float* v, const u32* slots, u16* kc, u16* vc,
                                        u32 kv_dim) {
    pdl_trigger();
    pdl_wait();
    const u64 src = (u64)blockIdx.x * kv_dim, dst = (u64)slots[blockIdx.x] * kv_dim;
    for (u32 i = threadIdx.x; i < kv_dim; i += blockDim.x) {
        kc[dst + i] = f32_to_f16(k[src + i]);
        vc[dst + i] = f32_to_f16(v[src + i]);
    }
}

// rms_norm over whole rows of whole float4s, up to NORM_VEC per thread: every
// load of the row is issued at once, the sum taken, then the row written
// from registers. `half` as in glu, and a null `out` as in glu_bf16in.
#define NORM_VEC 8
extern "C" __global__ void __launch_bounds__(1024)
    rms_norm4(const float* x, const float* w, float* out, u32 cols, float eps, u16* half, int bf16) {
    pdl_trigger();
    pdl_wait();
    const float4* xi = (const float4*)(x + (u64)blockIdx.x * cols);
    const float4* wi = (const float4*)w;
    float4* oi = (float4*)(out + (u64)blockIdx.x * cols);
    const u32 n4 = cols / 4;
    float4 v[NORM_VEC];
    float ss = 0.f;
#pragma unroll
    for (int j = 0; j < NORM_VEC; j++) {
        const u32 i = threadIdx.x + j * blockDim.x;
        if (i < n4) {
            v[j] = xi[i];
            ss += v[j].x * v[j].x + v[j].y * v[j].y + v[j].z * v[j].z + v[j].w * v[j].w;
        }
    }
    const float r = rsqrtf(block_sum(ss) / cols + eps);
#pragma unroll
    for (int j = 0; j < NORM_VEC; j++) {
        const u32 i = threadIdx.x + j * blockDim.x;
        if (i < n4) {
            const float4 g = wi[i];
            const float4 t = make_float4(v[j].x * r * g.x, v[j].y * r * g.y, v[j].z * r * g.z, v[j].w * r * g.w);
            if (out) oi[i] = t;
            if (half) {
                const u32 lo = f32_to_half(t.x, bf16) | ((u32)f32_to_half(t.y, bf16) << 16);
                const u32 hi = f32_to_half(t.z, bf16) | ((u32)f32_to_half(t.w, bf16) << 16);
                ((uint2*)(half + (u64)blockIdx.x * cols))[i] = make_uint2(lo, hi);
            }
        }
    }
}

// The read ceiling (cuda/ceilings.rs): the n 16-byte units of p loaded as
// the quantized GEMVs load their weights (`load_blocks`), four a thread in
// flight. One word goes out only if the data's XOR is a given value, so
// that no load is dead (the buffer holds zeros: nothing is written).
#define READ_AHEAD 4
extern "C" __global__ void __launch_bounds__(512, 4) read_rate(const uint4* p, u64 n, u32* out) {
    pdl_wait();
    const u64 stride = (u64)gridDim.x * blockDim.x;
    u64 i = blockIdx.x * (u64)blockDim.x + threadIdx.x;
    u32 acc = 0;
    for (; i + (READ_AHEAD - 1) * stride < n; i += READ_AHEAD * stride) {
        uint4 v[READ_AHEAD];
#pragma unroll
        for (int j = 0; j < READ_AHEAD; j++) v[j] = load_blocks(p + i + j * stride);
#pragma unroll
        for (int j = 0; j < READ_AHEAD; j++) acc ^= v[j].x ^ v[j].y ^ v[j].z ^ v[j].w;
    }
    for (; i < n; i += stride) {
        const uint4 v = load_blocks(p + i);
        acc ^= v.x ^ v.y ^ v.z ^ v.w;
    }
    if (acc == 0x9e3779b9u) *out = acc;
}
