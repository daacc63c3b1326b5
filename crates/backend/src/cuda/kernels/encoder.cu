// Bidirectional attention for encoders (no KV cache), f32: q [n, n_heads * hd],
// k and v [n, n_kv_heads * hd], every sequence of the flat batch attending
// only to itself (and, with a window, only to keys j with |i - j| <= window:
// local layers read just their band).
//
// A block takes one tile (up to ENC_ROWS query rows of one sequence) of one
// head. Keys and values stream through shared memory KC at a time. G threads
// share a query row, each holding up to 8 float4s of its q and output:
// thread p owns float4s p, p + G, p + 2G, ... so the G threads of a row read
// neighbouring banks, and rows read the same addresses (broadcast).
// Scores of a chunk are taken first, then one rescale per chunk.
// tiles: (first row, rows, sequence start, sequence end) per tile.
// Needs hd % 4 == 0 and hd <= 32 * G.

#define ENC_ROWS 64

template <int G, int KC>
__device__ __forceinline__ void encoder_tile(const float* q, const float* k, const float* v, float* out,
                                             const u32* tiles, u32 n_heads, u32 n_kv_heads, u32 hd, u32 window,
                                             float scale) {
    __shared__ float4 ks[KC * 8 * G];
    __shared__ float4 vs[KC * 8 * G];
    const u32* tile = tiles + 4 * blockIdx.x;
    const u32 r0 = tile[0], nr = tile[1], s0 = tile[2], s1 = tile[3];
    const u32 head = blockIdx.y, kvh = head / (n_heads / n_kv_heads);
    const u32 h4 = hd / 4, qd = n_heads * hd, kvd = n_kv_heads * hd;
    const u32 part = threadIdx.x % G, row = r0 + threadIdx.x / G;
    const bool active = threadIdx.x / G < nr;
    float4 qv[8], acc[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) {
        const u32 c = part + G * i;
        float4 x = make_float4(0.f, 0.f, 0.f, 0.f);
        if (active && c < h4) {
            x = ((const float4*)(q + (u64)row * qd + head * hd))[c];
            x.x *= scale, x.y *= scale, x.z *= scale, x.w *= scale;
        }
        qv[i] = x;
        acc[i] = make_float4(0.f, 0.f, 0.f, 0.f);
    }
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
        for (u32 i = threadIdx.x; i < nk * h4; i += blockDim.x) {
            const u32 j = i / h4, c = i % h4;
            const u64 at = (u64)(c0 + j) * kvd + kvh * hd;
            ks[j * h4 + c] = ((const float4*)(k + at))[c];
            vs[j * h4 + c] = ((const float4*)(v + at))[c];
        }
        __syncthreads();
        float s[KC];
        float top = -INFINITY;
#pragma unroll
        for (int j = 0; j < KC; ++j) {
            float dot = 0.f;
            if (j < nk) {
#pragma unroll
                for (int i = 0; i < 8; ++i) {
                    const u32 c = part + G * i;
                    if (c < h4) {
                        const float4 kk = ks[j * h4 + c];
                        dot += qv[i].x * kk.x + qv[i].y * kk.y + qv[i].z * kk.z + qv[i].w * kk.w;
                    }
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
        const float next = fmaxf(m, top), corr = expf(m - next);
        l *= corr;
#pragma unroll
        for (int i = 0; i < 8; ++i) acc[i].x *= corr, acc[i].y *= corr, acc[i].z *= corr, acc[i].w *= corr;
#pragma unroll
        for (int j = 0; j < KC; ++j) {
            if (s[j] == -INFINITY) continue;
            const float p = expf(s[j] - next);
            l += p;
#pragma unroll
            for (int i = 0; i < 8; ++i) {
                const u32 c = part + G * i;
                if (c < h4) {
                    const float4 vv = vs[j * h4 + c];
                    acc[i].x += p * vv.x, acc[i].y += p * vv.y, acc[i].z += p * vv.z, acc[i].w += p * vv.w;
                }
            }
        }
        m = next;
    }
    if (!active) return;
    float4* o = (float4*)(out + (u64)row * qd + head * hd);
    const float inv = 1.f / l;
#pragma unroll
    for (int i = 0; i < 8; ++i) {
        const u32 c = part + G * i;
        if (c < h4) o[c] = make_float4(acc[i].x * inv, acc[i].y * inv, acc[i].z * inv, acc[i].w * inv);
    }
}

#define ENCODER_KERNEL(G, KC)                                                                                    \
    extern "C" __global__ void __launch_bounds__(ENC_ROWS * G)                                                  \
        encoder_attention_g##G(const float* q, const float* k, const float* v, float* out, const u32* tiles,     \
                               u32 n_heads, u32 n_kv_heads, u32 hd, u32 window, float scale) {                  \
        encoder_tile<G, KC>(q, k, v, out, tiles, n_heads, n_kv_heads, hd, window, scale);                       \
    }
ENCODER_KERNEL(1, 16)
ENCODER_KERNEL(2, 16)
ENCODER_KERNEL(4, 16)
ENCODER_KERNEL(8, 16)
