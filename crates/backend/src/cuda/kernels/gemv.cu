// Decode-sized matmuls: y[n, m] = x[n, k] · W[m, k]^T for n <= 8, with W in
// bf16 or f16 and x in f32. Memory-bound: one warp streams one weight row in
// 16-byte loads (kept out of L1, so the small x stays there) and applies it
// to all n input rows. Requires k % 8 == 0 (checked on the host).

__device__ __forceinline__ uint4 load_stream(const uint4* p) {
    uint4 v;
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p));
    return v;
}

__device__ __forceinline__ void unpack_bf16(u32 v, float& a, float& b) {
    a = __uint_as_float(v << 16);
    b = __uint_as_float(v & 0xffff0000u);
}

__device__ __forceinline__ void unpack_f16(u32 v, float& a, float& b) {
    a = f16_to_f32((u16)(v & 0xffffu));
    b = f16_to_f32((u16)(v >> 16));
}

// Up to three weights sharing the input (q, k, v): rows 0..m0 of the grid
// belong to w0, the next m1 to w1, the next m2 to w2.
template <int N, bool BF16>
__device__ void gemv_body(const u16* w0, const u16* w1, const u16* w2, float* y0, float* y1, float* y2, u32 m0,
                          u32 m1, u32 m2, const float* x, u32 k) {
    u32 row = (blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    const u32 lane = threadIdx.x & 31;
    const u16* w = w0;
    float* y = y0;
    u32 m = m0;
    if (!pick_weight(row, w, y, m, w1, w2, y1, y2, m1, m2)) return;
    const uint4* wr = (const uint4*)(w + (u64)row * k);
    float acc[N];
#pragma unroll
    for (int n = 0; n < N; n++) acc[n] = 0.f;
    const u32 chunks = k / 8;
#pragma unroll 4
    for (u32 i = lane; i < chunks; i += 32) {
        const uint4 v = load_stream(wr + i);
        float f[8];
        if (BF16) {
            unpack_bf16(v.x, f[0], f[1]);
            unpack_bf16(v.y, f[2], f[3]);
            unpack_bf16(v.z, f[4], f[5]);
            unpack_bf16(v.w, f[6], f[7]);
        } else {
            unpack_f16(v.x, f[0], f[1]);
            unpack_f16(v.y, f[2], f[3]);
            unpack_f16(v.z, f[4], f[5]);
            unpack_f16(v.w, f[6], f[7]);
        }
#pragma unroll
        for (int n = 0; n < N; n++) {
            const float4* xr = (const float4*)(x + (u64)n * k) + 2 * i;
            const float4 a = xr[0], b = xr[1];
            acc[n] += f[0] * a.x + f[1] * a.y + f[2] * a.z + f[3] * a.w + f[4] * b.x + f[5] * b.y + f[6] * b.z +
                      f[7] * b.w;
        }
    }
#pragma unroll
    for (int n = 0; n < N; n++) {
        const float s = warp_sum(acc[n]);
        if (lane == 0) y[(u64)n * m + row] = s;
    }
}

#define GEMV_ARGS                                                                                   \
    const u16 *w0, const u16 *w1, const u16 *w2, float *y0, float *y1, float *y2, u32 m0, u32 m1, u32 m2, \
        const float *x, u32 k
#define GEMV(N)                                                                    \
    extern "C" __global__ void gemv_bf16_##N(GEMV_ARGS) {                          \
        gemv_body<N, true>(w0, w1, w2, y0, y1, y2, m0, m1, m2, x, k);              \
    }                                                                              \
    extern "C" __global__ void gemv_f16_##N(GEMV_ARGS) {                           \
        gemv_body<N, false>(w0, w1, w2, y0, y1, y2, m0, m1, m2, x, k);             \
    }
GEMV(1)
GEMV(2)
GEMV(3)
GEMV(4)
GEMV(5)
GEMV(6)
GEMV(7)
GEMV(8)
