// Bidirectional attention for encoders (no KV cache), f32: q [n, n_heads * hd],
// k and v [n, n_kv_heads * hd], every sequence of the flat batch attending
// only to itself (and, with a window, only to keys j with |i - j| <= window:
// local layers read just their band).
//
// A block takes one tile (up to ENC_ROWS query rows of one sequence) of one
// head. Keys and values stream through shared memory KC at a time. G threads
// share a query row, each holding D of its q and output values in units of
// W floats (float4s where hd % 4 == 0, else single floats): thread p owns
// units p, p + G, p + 2G, ... so the G threads of a row read neighbouring
// banks, and rows read the same addresses (broadcast). Scores of a chunk are
// taken first (in log2 units: exp2 is one instruction), then one rescale
// per chunk. Needs hd <= D * G. HD, when not 0, is hd at compile time, which
// folds away every bound check and address computation per key: the common
// head sizes get such instances, with one thread per 32 values of the head.
// tiles: (first row, rows, sequence start, sequence end) per tile. `half`,
// when given, gets the output in 16 bits too (bf16 when `bf16`, else f16).

#define ENC_ROWS 64

// W consecutive floats from p[at] into r (at a multiple of W).
template <int W>
__device__ __forceinline__ void load_unit(const float* p, u64 at, float* r) {
    if (W == 4) {
        const float4 x = *(const float4*)(p + at);
        r[0] = x.x, r[1] = x.y, r[2] = x.z, r[3] = x.w;
    } else {
        r[0] = p[at];
    }
}

template <int HD, int D, int G, int KC, int W>
__device__ __forceinline__ void encoder_tile(const float* q, const float* k, const float* v, float* out,
                                             u16* half, int bf16, const u32* tiles, u32 n_heads, u32 n_kv_heads, u32 hd_arg,
                                             u32 window, float scale) {
    const u32 hd = HD ? HD : hd_arg;
    constexpr int NU = D / W;  // units per thread
    __shared__ __align__(16) float ks[KC * D * G];
    __shared__ __align__(16) float vs[KC * D * G];
    const u32* tile = tiles + 4 * blockIdx.x;
    const u32 r0 = tile[0], nr = tile[1], s0 = tile[2], s1 = tile[3];
    const u32 head = blockIdx.y, kvh = head / (n_heads / n_kv_heads);
    const u32 units = hd / W, qd = n_heads * hd, kvd = n_kv_heads * hd;
    const u32 part = threadIdx.x % G, row = r0 + threadIdx.x / G;
    const bool active = threadIdx.x / G < nr;
    float qv[D], acc[D];
#pragma unroll
    for (int i = 0; i < NU; ++i) {
        const u32 u = part + G * i;
        if (active && u < units) {
            load_unit<W>(q, (u64)row * qd + head * hd + u * W, qv + i * W);
        } else {
#pragma unroll
            for (int e = 0; e < W; ++e) qv[i * W + e] = 0.f;
        }
    }
#pragma unroll
    for (int d = 0; d < D; ++d) qv[d] *= scale * 1.4426950408889634f, acc[d] = 0.f;  // log2(e)
    // The keys any row of the tile sees.
    u32 lo = s0, hi = s1;
    if (window) {
        lo = max(s0, r0 > window ? r0 - window : 0u);
        hi = min(s1, r0 + nr + window);
    }
    float m = -INFINITY, l = 0.f;
    for (u32 c0 = lo; c0 < hi; c0 += KC) {
        const u32 nk = min((u32)KC, hi - c0);
        __syncthreads();
        for (u32 i = threadIdx.x; i < KC * units; i += blockDim.x) {
            const u32 j = i / units, u = i % units;
            if (j < nk) {
                const u64 at = (u64)(c0 + j) * kvd + kvh * hd + u * W;
                load_unit<W>(k, at, ks + j * hd + u * W);
                load_unit<W>(v, at, vs + j * hd + u * W);
            } else {
                // Zeros past the last key: its weight is 0, and 0 * 0 stays 0.
#pragma unroll
                for (int e = 0; e < W; ++e) ks[j * hd + u * W + e] = vs[j * hd + u * W + e] = 0.f;
            }
        }
        __syncthreads();
        float s[KC];
        float top = -INFINITY;
#pragma unroll
        for (int j = 0; j < KC; ++j) {
            float dot = 0.f;
#pragma unroll
            for (int i = 0; i < NU; ++i) {
                const u32 u = part + G * i;
                if (u < units) {
                    float kk[W];
                    load_unit<W>(ks, j * hd + u * W, kk);
#pragma unroll
                    for (int e = 0; e < W; ++e) dot += qv[i * W + e] * kk[e];
                }
            }
            // Every lane takes part: the G lanes of a row are neighbours.
#pragma unroll
            for (int o = G / 2; o > 0; o /= 2) dot += __shfl_xor_sync(0xffffffffu, dot, o);
            const u32 key = c0 + j;
            const bool seen = j < nk && (!window || (key + window >= row && key <= row + window));
            s[j] = seen ? dot : -INFINITY;
            top = fmaxf(top, s[j]);
        }
        if (top == -INFINITY) continue;
        const float next = fmaxf(m, top), corr = exp2f(m - next);
        l *= corr;
#pragma unroll
        for (int d = 0; d < D; ++d) acc[d] *= corr;
#pragma unroll
        for (int j = 0; j < KC; ++j) {
            const float p = exp2f(s[j] - next);  // 0 for keys not seen
            l += p;
#pragma unroll
            for (int i = 0; i < NU; ++i) {
                const u32 u = part + G * i;
                if (u < units) {
                    float vv[W];
                    load_unit<W>(vs, j * hd + u * W, vv);
#pragma unroll
                    for (int e = 0; e < W; ++e) acc[i * W + e] += p * vv[e];
                }
            }
        }
        m = next;
    }
    if (!active) return;
    const float inv = 1.f / l;
    float* o = out + (u64)row * qd + head * hd;
#pragma unroll
    for (int i = 0; i < NU; ++i) {
        const u32 u = part + G * i;
        if (u >= units) continue;
        if (W == 4) {
            *(float4*)(o + u * W) =
                make_float4(acc[i * W] * inv, acc[i * W + 1] * inv, acc[i * W + 2] * inv, acc[i * W + 3] * inv);
        } else {
            o[u] = acc[i] * inv;
        }
        if (!half) continue;
        u16* h = half + (u64)row * qd + head * hd + u * W;
        if (W == 4) {  // one 8-byte store
            const float* a = acc + i * W;
            const u32 lo = f32_to_half(a[0] * inv, bf16) | ((u32)f32_to_half(a[1] * inv, bf16) << 16);
            const u32 hi = f32_to_half(a[2] * inv, bf16) | ((u32)f32_to_half(a[3] * inv, bf16) << 16);
            *(uint2*)h = make_uint2(lo, hi);
        } else {
            h[0] = f32_to_half(acc[i] * inv, bf16);
        }
    }
}

// encoder_attention_d{D}_g{G} (float4 units) and ..._s (single floats) for
// any head size up to D * G; encoder_attention_hd{HD} for that size only.
#define ENCODER_KERNEL(NAME, HD, D, G, W)                                                                        \
    extern "C" __global__ void __launch_bounds__(ENC_ROWS * G)                                                  \
        NAME(const float* q, const float* k, const float* v, float* out, u16* half, int bf16, const u32* tiles,  \
             u32 n_heads, u32 n_kv_heads, u32 hd, u32 window, float scale) {                                    \
        pdl_trigger();                                                                                          \
        pdl_wait();                                                                                             \
        encoder_tile<HD, D, G, 16, W>(q, k, v, out, half, bf16, tiles, n_heads, n_kv_heads, hd, window, scale); \
    }
#define ENCODER_KERNELS(D, G)                                        \
    ENCODER_KERNEL(encoder_attention_d##D##_g##G, 0, D, G, 4)        \
    ENCODER_KERNEL(encoder_attention_d##D##_g##G##_s, 0, D, G, 1)
ENCODER_KERNELS(16, 1)
ENCODER_KERNELS(16, 2)
ENCODER_KERNELS(32, 2)
ENCODER_KERNELS(32, 4)
ENCODER_KERNELS(32, 8)
ENCODER_KERNEL(encoder_attention_hd32, 32, 32, 1, 4)
ENCODER_KERNEL(encoder_attention_hd64, 64, 32, 2, 4)
ENCODER_KERNEL(encoder_attention_hd128, 128, 32, 4, 4)
