// Decode-sized matmuls: y[n, m] = x[n, k] · W[m, k]^T for n <= 8, with W in
// bf16 or f16 and x in f32. Memory-bound: one warp streams one weight row in
// 16-byte loads (kept out of L1, so the small x stays there) and applies it
// to all n input rows. Requires k % 8 == 0 (checked on the host).
//
// Launched with programmatic dependent launch: the next kernel may start
// (and wait for this one) once a warp of every block has read its row. Measured on the H200 at batch 1, starting the
// weight loads before waiting for x gained nothing: issuing the first four
// loads per lane early was 1% slower, and prefetching rows into L2 (as the
// quantized GEMVs do) was slower at every size, by 10% for whole rows.

__device__ __forceinline__ void unpack_bf16(u32 v, float& a, float& b) {
    a = __uint_as_float(v << 16);
    b = __uint_as_float(v & 0xffff0000u);
}

__device__ __forceinline__ void unpack_f16(u32 v, float& a, float& b) {
    a = f16_to_f32((u16)(v & 0xffffu));
    b = f16_to_f32((u16)(v >> 16));
}

// Eight 16-bit weights (bf16 when BF16, else f16) as floats.
template <bool BF16>
__device__ __forceinline__ void unpack8w(uint4 v, float* f) {
    const u32 w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int i = 0; i < 4; i++) {
        if (BF16) unpack_bf16(w[i], f[2 * i], f[2 * i + 1]);
        else unpack_f16(w[i], f[2 * i], f[2 * i + 1]);
    }
}

// Eight weights f times eight inputs (a, b).
__device__ __forceinline__ float dot8(const float* f, float4 a, float4 b) {
    return f[0] * a.x + f[1] * a.y + f[2] * a.z + f[3] * a.w + f[4] * b.x + f[5] * b.y + f[6] * b.z + f[7] * b.w;
}

// acc[n] += eight weights f times x[n, 8i .. 8i + 8], for the n input rows.
template <int N>
__device__ __forceinline__ void fma8(float (&acc)[N], const float* f, const float* x, u32 k, u32 i) {
#pragma unroll
    for (int n = 0; n < N; n++) {
        const float4* xr = (const float4*)(x + (u64)n * k) + 2 * i;
        acc[n] += dot8(f, xr[0], xr[1]);
    }
}

// sq[n] += the squares of x[n, 8i .. 8i + 8] (NORM: an RMS norm whose
// weights were folded into W, `fold_norm` on the host; the loads are the
// ones `fma8` makes, from L1).
template <int N>
__device__ __forceinline__ void square8(float (&sq)[N], const float* x, u32 k, u32 i) {
#pragma unroll
    for (int n = 0; n < N; n++) {
        const float4* xr = (const float4*)(x + (u64)n * k) + 2 * i;
        const float4 a = xr[0], b = xr[1];
        sq[n] += a.x * a.x + a.y * a.y + a.z * a.z + a.w * a.w + b.x * b.x + b.y * b.y + b.z * b.z + b.w * b.w;
    }
}

// The RMS norm's scale of a row of k values whose squares sum, over the
// warp's lanes, to `sq`: it factors out of each dot product of the normed
// row with the folded weights.
__device__ __forceinline__ float norm_scale(float sq, u32 k, float eps) { return rsqrtf(warp_sum(sq) / k + eps); }

// One input row (n = 1), one weight row per warp. Up to three weights
// sharing the input (q, k, v): rows 0..m0 of the grid belong to w0, the next
// m1 to w1, the next m2 to w2. NORM: x is the un-normed input of weights
// with the norm folded in (`square8`).
template <int N, bool BF16, bool NORM = false>
__device__ void gemv_row_body(const u16* w0, const u16* w1, const u16* w2, float* y0, float* y1, float* y2,
                              u32 m0, u32 m1, u32 m2, const float* x, u32 k, int add, float eps) {
    u32 row = (blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    const u32 lane = threadIdx.x & 31;
    const u16* w = w0;
    float* y = y0;
    u32 m = m0;
    if (!pick_weight(row, w, y, m, w1, w2, y1, y2, m1, m2)) return;
    const uint4* wr = (const uint4*)(w + (u64)row * k);
    pdl_wait();
    float acc[N], base[N], sq[N];
    start_values<N>(base, y, m, row, add, lane);
#pragma unroll
    for (int n = 0; n < N; n++) acc[n] = sq[n] = 0.f;
    float f[8];
#pragma unroll 4
    for (u32 i = lane; i < k / 8; i += 32) {
        unpack8w<BF16>(load_stream(wr + i), f);
        fma8<N>(acc, f, x, k, i);
        if (NORM) square8<N>(sq, x, k, i);
    }
    pdl_trigger();
#pragma unroll
    for (int n = 0; n < N; n++) {
        float s = warp_sum(acc[n]);
        if (NORM) s *= norm_scale(sq[n], k, eps);
        if (lane == 0) y[(u64)n * m + row] = base[n] + s;
    }
}

// n > 1 input rows: two weight rows per warp (`gemv_rows_per_warp` on the
// host), so that each input load from L1 serves both (with one row per warp,
// batch 4 ran at 44% of the roofline, its input loads saturating L1; batch 8
// at 22%). Each row's sums run as in gemv_row_body.
template <int N, bool BF16, int R = 2>
__device__ void gemv_pair_body(const u16* w0, const u16* w1, const u16* w2, float* y0, float* y1, float* y2,
                               u32 m0, u32 m1, u32 m2, const float* x, u32 k, int add, float) {
    const u32 warp = (blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    const u32 lane = threadIdx.x & 31;
    pdl_wait();
    const uint4* wr[R];
    float* yr[R];
    u32 mr[R], rows[R];
    bool ok[R];
#pragma unroll
    for (int r = 0; r < R; r++) {
        rows[r] = warp * R + r;
        const u16* w = w0;
        yr[r] = y0, mr[r] = m0;
        ok[r] = pick_weight(rows[r], w, yr[r], mr[r], w1, w2, y1, y2, m1, m2);
        // Rows past the last (only ever after a valid one) re-read the first.
        wr[r] = ok[r] ? (const uint4*)(w + (u64)rows[r] * k) : wr[0];
    }
    if (!ok[0]) return;
    float acc[R][N], base[R][N];
#pragma unroll
    for (int r = 0; r < R; r++) {
        start_values<N>(base[r], yr[r], mr[r], rows[r], add && ok[r], lane);
#pragma unroll
        for (int n = 0; n < N; n++) acc[r][n] = 0.f;
    }
#pragma unroll(4 / R)
    for (u32 i = lane; i < k / 8; i += 32) {
        float f[R][8];
#pragma unroll
        for (int r = 0; r < R; r++) unpack8w<BF16>(load_stream(wr[r] + i), f[r]);
#pragma unroll
        for (int n = 0; n < N; n++) {
            const float4* xr = (const float4*)(x + (u64)n * k) + 2 * i;
            const float4 a = xr[0], b = xr[1];
#pragma unroll
            for (int r = 0; r < R; r++) acc[r][n] += dot8(f[r], a, b);
        }
    }
    pdl_trigger();
#pragma unroll
    for (int r = 0; r < R; r++)
#pragma unroll
        for (int n = 0; n < N; n++) {
            const float s = warp_sum(acc[r][n]);
            if (lane == 0 && ok[r]) yr[r][(u64)n * mr[r] + rows[r]] = base[r][n] + s;
        }
}

// `add`: the sums added to y instead of written (`start_values`); `eps`:
// the folded norm's, read by the `gemv_norm_*` kernels alone.
#define GEMV_ARGS                                                                                   \
    const u16 *w0, const u16 *w1, const u16 *w2, float *y0, float *y1, float *y2, u32 m0, u32 m1, u32 m2, \
        const float *x, u32 k, int add, float eps
#define GEMV(N, BODY)                                                              \
    extern "C" __global__ void gemv_bf16_##N(GEMV_ARGS) {                          \
        BODY<N, true>(w0, w1, w2, y0, y1, y2, m0, m1, m2, x, k, add, eps);         \
    }                                                                              \
    extern "C" __global__ void gemv_f16_##N(GEMV_ARGS) {                           \
        BODY<N, false>(w0, w1, w2, y0, y1, y2, m0, m1, m2, x, k, add, eps);        \
    }
extern "C" __global__ void gemv_norm_bf16_1(GEMV_ARGS) {
    gemv_row_body<1, true, true>(w0, w1, w2, y0, y1, y2, m0, m1, m2, x, k, add, eps);
}
extern "C" __global__ void gemv_norm_f16_1(GEMV_ARGS) {
    gemv_row_body<1, false, true>(w0, w1, w2, y0, y1, y2, m0, m1, m2, x, k, add, eps);
}
GEMV(1, gemv_row_body)
GEMV(2, gemv_pair_body)
GEMV(3, gemv_pair_body)
GEMV(4, gemv_pair_body)
GEMV(5, gemv_pair_body)
GEMV(6, gemv_pair_body)
GEMV(7, gemv_pair_body)
GEMV(8, gemv_pair_body)

// Gate and up projections sharing the input, with the gated activation:
// y[n, m] = act(x · Wg^T) * (x · Wu^T), for decode's MLP (one launch and no
// gate and up outputs instead of two GEMV outputs and `glu`). One warp per
// row pair: each input load serves both rows, and each row's sum is formed
// as in `gemv_row_body` (NORM too).
template <int N, bool BF16, bool NORM = false>
__device__ void gemv_glu_body(const u16* wg, const u16* wu, float* y, u32 m, const float* x, u32 k, int act,
                              float eps) {
    const u32 row = (blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    const u32 lane = threadIdx.x & 31;
    if (row >= m) return;
    const uint4* gr = (const uint4*)(wg + (u64)row * k);
    const uint4* ur = (const uint4*)(wu + (u64)row * k);
    pdl_wait();
    float ag[N], au[N], sq[N];
#pragma unroll
    for (int n = 0; n < N; n++) ag[n] = au[n] = sq[n] = 0.f;
    float g[8], u[8];
#pragma unroll 2
    for (u32 i = lane; i < k / 8; i += 32) {
        unpack8w<BF16>(load_stream(gr + i), g);
        unpack8w<BF16>(load_stream(ur + i), u);
        fma8<N>(ag, g, x, k, i);
        fma8<N>(au, u, x, k, i);
        if (NORM) square8<N>(sq, x, k, i);
    }
    pdl_trigger();
#pragma unroll
    for (int n = 0; n < N; n++) {
        const float r = NORM ? norm_scale(sq[n], k, eps) : 1.f;
        const float gs = warp_sum(ag[n]) * r, us = warp_sum(au[n]) * r;
        if (lane == 0) y[(u64)n * m + row] = act_fn(gs, act) * us;
    }
}

#define GEMV_GLU_ARGS const u16 *wg, const u16 *wu, float *y, u32 m, const float *x, u32 k, int act, float eps
#define GEMV_GLU(N)                                                                    \
    extern "C" __global__ void gemv_glu_bf16_##N(GEMV_GLU_ARGS) {                      \
        gemv_glu_body<N, true>(wg, wu, y, m, x, k, act, eps);                      \
    }                                                                                  \
    extern "C" __global__ void gemv_glu_f16_##N(GEMV_GLU_ARGS) {                       \
        gemv_glu_body<N, false>(wg, wu, y, m, x, k, act, eps);                     \
    }
extern "C" __global__ void gemv_glu_norm_bf16_1(GEMV_GLU_ARGS) {
    gemv_glu_body<1, true, true>(wg, wu, y, m, x, k, act, eps);
}
extern "C" __global__ void gemv_glu_norm_f16_1(GEMV_GLU_ARGS) {
    gemv_glu_body<1, false, true>(wg, wu, y, m, x, k, act, eps);
}
GEMV_GLU(1)
GEMV_GLU(2)
GEMV_GLU(3)
GEMV_GLU(4)
GEMV_GLU(5)
GEMV_GLU(6)
GEMV_GLU(7)
GEMV_GLU(8)
