// How short can a batch-1 decode layer's attention half be after its wait,
// with its weights already in shared memory? The forty-fifth session's
// design (docs/cuda-journal.md) runs the half as one launch of clusters,
// one or two a KV head, exchanging through distributed shared memory
// instead of L2; it only pays if the stages after the wait take a few
// microseconds a layer (the target leaves about 2.3 us for the whole
// half, forty-sixth session). This measures that schedule on its own,
// Llama-3.1-8B's shape, before any weights stream through it:
//
//   before the wait  every block copies its share of the weights (4-bit
//                    values, random) and of the cached keys and values
//                    into shared memory, while the kernel before (a
//                    stand-in that waits 40 us, then writes x) runs
//   after the wait   input: x (4,096 floats) read, normed, quantized to 8
//                    bits (every block for itself); q/k/v: the block's rows
//                    on tensor cores (m16n8k32, the 4-bit values unpacked
//                    as the Q4_K kernels do); their sums sent to every
//                    block of the cluster, one cluster barrier; RoPE;
//                    attention over the block's share of the context, the
//                    partial states sent to every block, a second barrier,
//                    merged; the output quantized; the output projection's
//                    rows for the cluster's columns, added to the residual
//                    by red.add.
//
// The values are random and the outputs not checked: what it measures is
// the time from the wait's release to the last block's end (each block
// stamps %globaltimer), and block 0's stages. Cluster sizes 16 (a KV head a
// cluster) and 8 (two a KV head, each with the head's k and v), 4, 8 or 16
// warps a block, contexts of 64 and 512 keys, each with its products and
// without them (work "none": the data moves and barriers alone, the floor
// of the schedule); at 16 warps and 64 keys also with the exchanges
// through global memory (stores, a fence and a counter, as the chain of
// kernels and the window kernel exchange) instead of the cluster's shared
// memory, to show what distributed shared memory saves; first how many
// clusters fit at once
// (cudaOccupancyMaxActiveClusters: a cluster that does not fit runs in a
// second wave).
//
// On a GPU machine with the CUDA toolkit:
//   nvcc -O3 -arch=sm_90a -o /tmp/gpu-attn-half scripts/gpu-attn-half.cu && /tmp/gpu-attn-half
#include <algorithm>
#include <cooperative_groups.h>
#include <cstdint>
#include <vector>
#include "gpu-bench.cuh"

namespace cg = cooperative_groups;
typedef uint32_t u32;
typedef uint64_t u64;

constexpr int HIDDEN = 4096, HEADS = 32, KV = 8, HD = 128, G = HEADS / KV;
constexpr int STAMPS = 8;       // a block's stage marks (the last its end)
constexpr u64 SPIN_NS = 40000;  // the kernel before: long enough for every copy

__device__ __forceinline__ u64 now_ns() {
    u64 t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

// The layer's shape as one cluster of C blocks sees it.
struct Shape {
    int C;          // blocks a cluster
    int heads;      // query heads a cluster (G, or G / 2 with two clusters a KV head)
    int rows;       // q/k/v rows a block: (heads + 2) * HD / C
    int orows;      // output rows a block: HIDDEN / C
    int ocols;      // the output projection's columns a cluster: heads * HD
    int ctx;        // cached keys
};
__host__ __device__ inline Shape shape_of(int C, int ctx) {
    const int heads = C == 16 ? G : G / 2;
    return Shape{C, heads, (heads + 2) * HD / C, HIDDEN / C, heads * HD, ctx};
}
// Shared memory, in bytes, by region.
struct Layout {
    u32 w, ow, kv, xq, rows, parts, red, total;
};
__host__ __device__ inline Layout layout_of(const Shape& s) {
    Layout l;
    const u32 keys = (s.ctx + s.C - 1) / s.C;
    l.w = 0;
    l.ow = l.w + s.rows * HIDDEN / 2;                      // 4-bit q/k/v rows
    l.kv = l.ow + s.orows * s.ocols / 2;                   // 4-bit output rows
    l.xq = l.kv + keys * 2 * HD * 2;                       // f16 cached K and V
    l.rows = l.xq + HIDDEN;                                // the 8-bit input (also the output's)
    l.parts = l.rows + (s.heads + 2) * HD * 4;             // the cluster's q/k/v sums, then its outputs
    l.red = l.parts + s.C * s.heads * (HD + 2) * 4;        // every block's partial states
    // Reductions; the output rows' sums (before them the block's q/k/v sums
    // and its warps' attention states, 16 warps at most).
    l.total = l.red + 64 * 4 + 4 * (u32)max(s.orows, 16 * (HD + 2));
    return l;
}

// ------------------------------------------------------------------ tensor-core rows
__device__ __forceinline__ void mma_s8(const u32 (&a)[4], u32 b0, u32 b1, int (&c)[4]) {
    asm volatile("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};"
                 : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
// Rows [16 t, 16 t + 16) of a 4-bit matrix of k columns times the 8-bit
// input, chunks [c0, c1) of 32 columns, added to sums[] by the lanes
// holding column 0 (shared-memory atomics: the warps of a row add in any
// order; the values are not checked). The matrix is laid out as the tile
// GEMVs' (quant/repack.rs): a lane's 8 bytes of a 16 x 32 chunk (rows g and
// g + 8) next to the other lanes', so a warp's load is 256 contiguous bytes.
__device__ void tile_rows(const unsigned char* w, int k, int t, int c0, int c1, const signed char* x, float* sums) {
    const int lane = threadIdx.x & 31, g = lane >> 2, i = lane & 3;
    float acc0 = 0.f, acc1 = 0.f;
    for (int c = c0; c < c1; c++) {
        const uint2 ww = ((const uint2*)w)[((u64)t * (k / 32) + c) * 32 + lane];
        const u32 wa = ww.x, wb = ww.y;
        const u32 a[4] = {wa & 0x0f0f0f0fu, wb & 0x0f0f0f0fu, (wa >> 4) & 0x0f0f0f0fu, (wb >> 4) & 0x0f0f0f0fu};
        const u32 b0 = *(const u32*)(x + 32 * c + 4 * i), b1 = *(const u32*)(x + 32 * c + 16 + 4 * i);
        int acc[4] = {0, 0, 0, 0};
        mma_s8(a, b0, b1, acc);
        const float d = 1.f / 64.f;  // (a chunk's scale, as Q4_K's per 32 values)
        acc0 += d * (float)acc[0];
        acc1 += d * (float)acc[2];
    }
    if (i == 0) {
        atomicAdd(sums + 16 * t + g, acc0);
        atomicAdd(sums + 16 * t + g + 8, acc1);
    }
}
// A matrix's rows (tiles of 16) times x, items (tile, 8 chunks) over the warps.
__device__ void rows_times(const unsigned char* w, int rows, int k, const signed char* x, float* sums) {
    const int warp = threadIdx.x >> 5, warps = blockDim.x >> 5, per = 8, chunks = k / 32;
    const int items = rows / 16 * (chunks / per);
    for (int it = warp; it < items; it += warps) {
        const int t = it / (chunks / per), c0 = (it % (chunks / per)) * per;
        tile_rows(w, k, t, c0, c0 + per, x, sums);
    }
}

// The block's sum of v over its threads.
__device__ float block_sum(float v, float* red) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, warps = blockDim.x >> 5;
    __syncthreads();
    if (lane == 0) red[warp] = v;
    __syncthreads();
    float s = 0.f;
    for (int w = 0; w < warps; w++) s += red[w];
    return s;
}
// A warp's 32 values (one a lane) as 8-bit values scaled by their largest
// magnitude (the Q8 blocks the GEMVs read).
__device__ __forceinline__ signed char quantize_lane(float x) {
    float m = fabsf(x);
    for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
    return (signed char)__float2int_rn(m > 0.f ? x * 127.f / m : 0.f);
}
// n floats as 8-bit values, a scale per 32.
__device__ void quantize(const float* v, int n, signed char* q) {
    const int lane = threadIdx.x & 31;
    for (int c = threadIdx.x >> 5; c < n / 32; c += blockDim.x >> 5) q[32 * c + lane] = quantize_lane(v[32 * c + lane]);
}

// ------------------------------------------------------------------ exchanges
// The block's slice [off, off + n) of a buffer of `total` floats in shared
// memory, given to every block of the cluster, each then holding the whole.
// Through distributed shared memory (the slice written into every block's
// copy, one cluster barrier), or (`l2`) through global memory as the chain
// of kernels and the window kernel exchange: the slice stored to the
// cluster's buffer, a fence and an arrival counted, every block waiting for
// the cluster's count and reading the buffer back past L1.
__device__ __forceinline__ u32 load_acquire(const u32* p) {
    u32 v;
    asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}
__device__ void publish(cg::cluster_group& cl, float* buf, int off, int n, int total, bool l2, float* gbuf,
                        u32* count) {
    const int tid = threadIdx.x, nt = blockDim.x, C = (int)cl.num_blocks();
    if (!l2) {
        for (int r = 0; r < C; r++) {
            if (r == (int)cl.block_rank()) continue;
            float* dst = cl.map_shared_rank(buf, r);
            for (int i = tid; i < n; i += nt) dst[off + i] = buf[off + i];
        }
        cl.sync();
        return;
    }
    for (int i = tid; i < n; i += nt) gbuf[off + i] = buf[off + i];
    __syncthreads();
    if (tid == 0) {
        __threadfence();
        atomicAdd(count, 1u);
        while (load_acquire(count) < (u32)C) {
        }
    }
    __syncthreads();
    for (int i = tid; i < total; i += nt)
        if (i < off || i >= off + n) buf[i] = __ldcg(gbuf + i);
    __syncthreads();
}

// ------------------------------------------------------------------ the kernels
// The kernel before: lets the next start at once, waits SPIN_NS, writes x.
__global__ void before(float* x, u64* end) {
    pdl_trigger();
    const u64 t0 = now_ns();
    while (now_ns() - t0 < SPIN_NS) {
    }
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < HIDDEN; i += gridDim.x * blockDim.x)
        x[i] = 0.01f * (float)((i * 37) % 101);
    if (threadIdx.x == 0) atomicMax((unsigned long long*)end, (unsigned long long)now_ns());
}

__global__ void __launch_bounds__(512) attn_half(const unsigned char* weights, const uint16_t* cache, const float* x,
                                                 float* out, u64* stamps, int C, int ctx, int work, int l2,
                                                 float* gbuf, u32* counts, const u64* end) {
    extern __shared__ __align__(16) unsigned char sm[];
    cg::cluster_group cl = cg::this_cluster();
    const Shape s = shape_of(C, ctx);
    const Layout L = layout_of(s);
    const int rank = (int)cl.block_rank(), cluster = blockIdx.x / C, tid = threadIdx.x, nt = blockDim.x;
    const int warp = tid >> 5, lane = tid & 31, warps = nt >> 5;
    float* red = (float*)(sm + L.red);
    float* osum = red + 64;
    // Before the wait: the block's weights and cached keys (not written by
    // the kernel before), and every block of the cluster started.
    {
        const uint4* src = (const uint4*)(weights + (u64)blockIdx.x * L.kv);
        for (u32 i = tid; i < L.kv / 16; i += nt) ((uint4*)sm)[i] = src[i];
        const uint4* kv = (const uint4*)(cache + (u64)blockIdx.x * (L.xq - L.kv) / 2);
        for (u32 i = tid; i < (L.xq - L.kv) / 16; i += nt) ((uint4*)(sm + L.kv))[i] = kv[i];
        for (int i = tid; i < s.orows; i += nt) osum[i] = 0.f;
    }
    cl.sync();
    pdl_wait();
    // The kernel before's end, as this block sees it after the wait (stamp
    // 7): the release's reference, and proof that the wait waited for it.
    const u64 before_end = threadIdx.x == 0 ? *(volatile const u64*)end : 0;
    u64 mark[STAMPS];
    int m = 0;
    mark[m++] = now_ns();
    // Input: x normed and quantized, from one load of it (thread i holds
    // x[i + j nt]: warp w's lanes chunk w + j warps of 32).
    signed char* xq = (signed char*)(sm + L.xq);
    float* rows = (float*)(sm + L.rows);  // the cluster's q, k, v sums (heads + 2 rows of HD)
    constexpr int MAX_PER = HIDDEN / 128;
    const int per = HIDDEN / nt;
    float xv[MAX_PER], ss = 0.f;
#pragma unroll
    for (int j = 0; j < MAX_PER; j++) xv[j] = j < per ? x[tid + j * nt] : 0.f;
#pragma unroll
    for (int j = 0; j < MAX_PER; j++) ss += xv[j] * xv[j];
    const float f = rsqrtf(block_sum(ss, red) / HIDDEN + 1e-5f);
#pragma unroll
    for (int j = 0; j < MAX_PER; j++) {
        if (j >= per) break;
        xq[tid + j * nt] = quantize_lane(xv[j] * f);
    }
    float* mine = osum;  // (the block's q/k/v sums, before the output rows use it)
    for (int i = tid; i < s.rows; i += nt) mine[i] = 0.f;
    __syncthreads();
    mark[m++] = now_ns();
    // q/k/v: the block's rows, sent to every block of the cluster.
    if (work) rows_times(sm + L.w, s.rows, HIDDEN, xq, mine);
    __syncthreads();
    for (int i = tid; i < s.rows; i += nt) rows[rank * s.rows + i] = mine[i];
    const int nrows = (s.heads + 2) * HD, nparts = C * s.heads * (HD + 2);
    float* grows = gbuf + (u64)cluster * (nrows + nparts);  // (the cluster's, through L2)
    publish(cl, rows, rank * s.rows, s.rows, nrows, l2, grows, counts + 2 * cluster);
    mark[m++] = now_ns();
    // RoPE on q and k (rotate-half pairs), the step's position 1000.
    for (int i = tid; i < (s.heads + 1) * HD / 2; i += nt) {
        const int h = i / (HD / 2), d = i % (HD / 2);
        float sn, cs;
        __sincosf(1000.f * __powf(500000.f, -2.f * d / HD), &sn, &cs);
        const float a = rows[h * HD + d], b = rows[h * HD + d + HD / 2];
        rows[h * HD + d] = a * cs - b * sn;
        rows[h * HD + d + HD / 2] = b * cs + a * sn;
    }
    __syncthreads();
    // Attention: the block's share of the keys (the step's own key in the
    // last block), warp w on head w % heads; partial states to every block.
    const int keys = (ctx + C - 1) / C, k0 = rank * keys, k1 = min(ctx, k0 + keys);
    const uint16_t* kc = (const uint16_t*)(sm + L.kv);
    const float* q = rows;
    const float *knew = rows + s.heads * HD, *vnew = knew + HD;
    float* parts = (float*)(sm + L.parts);  // [C][heads][HD + 2]
    const int h = warp % s.heads, step = max(1, warps / s.heads);
    float mx = -1e30f, sum = 0.f, o[4] = {0.f, 0.f, 0.f, 0.f}, qv[4];
    for (int e = 0; e < 4; e++) qv[e] = q[h * HD + 4 * lane + e] * 0.0884f;
    for (int j = k0 + warp / s.heads; work && j <= k1; j += step) {
        const bool own = j == k1;
        if (own && rank != C - 1) break;
        float dot = 0.f, v[4];
        for (int e = 0; e < 4; e++) {
            const int d = 4 * lane + e;
            const float kk = own ? knew[d] : __half2float(__ushort_as_half(kc[(j - k0) * 2 * HD + d]));
            v[e] = own ? vnew[d] : __half2float(__ushort_as_half(kc[(j - k0) * 2 * HD + HD + d]));
            dot += qv[e] * kk;
        }
        for (int o2 = 16; o2 > 0; o2 >>= 1) dot += __shfl_xor_sync(0xffffffffu, dot, o2);
        const float nm = fmaxf(mx, dot), c = __expf(mx - nm), p = __expf(dot - nm);
        sum = sum * c + p;
        for (int e = 0; e < 4; e++) o[e] = o[e] * c + p * v[e];
        mx = nm;
    }
    // The warps of a head merged in order through the output rows' buffer.
    float* st = osum;  // [warps][HD + 2]
    __syncthreads();
    for (int e = 0; e < 4; e++) st[warp * (HD + 2) + 4 * lane + e] = o[e];
    if (lane == 0) st[warp * (HD + 2) + HD] = mx, st[warp * (HD + 2) + HD + 1] = sum;
    __syncthreads();
    for (int i = tid; i < s.heads * HD; i += nt) {
        const int hh = i / HD, d = i % HD;
        float M = -1e30f, S = 0.f, O = 0.f;
        for (int w = hh; w < warps; w += s.heads) {
            const float wm = st[w * (HD + 2) + HD], nm = fmaxf(M, wm), a = __expf(M - nm), b = __expf(wm - nm);
            S = S * a + st[w * (HD + 2) + HD + 1] * b;
            O = O * a + st[w * (HD + 2) + d] * b;
            M = nm;
        }
        float* mine_part = parts + (rank * s.heads + hh) * (HD + 2);
        mine_part[d] = O;
        if (d == 0) mine_part[HD] = M, mine_part[HD + 1] = S;
    }
    __syncthreads();
    const int slice = s.heads * (HD + 2);
    publish(cl, parts, rank * slice, slice, nparts, l2, grows + nrows, counts + 2 * cluster + 1);
    mark[m++] = now_ns();
    // The cluster's outputs merged over its blocks, quantized.
    float* outs = rows;  // (q/k/v are used)
    for (int i = tid; i < s.heads * HD; i += nt) {
        const int hh = i / HD, d = i % HD;
        float M = -1e30f, S = 0.f, O = 0.f;
        for (int r = 0; r < C; r++) {
            const float* p = parts + (r * s.heads + hh) * (HD + 2);
            const float nm = fmaxf(M, p[HD]), a = __expf(M - nm), b = __expf(p[HD] - nm);
            S = S * a + p[HD + 1] * b;
            O = O * a + p[d] * b;
            M = nm;
        }
        outs[i] = S > 0.f ? O / S : 0.f;
    }
    __syncthreads();
    quantize(outs, s.ocols, xq);
    for (int i = tid; i < s.orows; i += nt) osum[i] = 0.f;
    __syncthreads();
    mark[m++] = now_ns();
    // The output projection: the block's rows over the cluster's columns,
    // added to the residual.
    if (work) rows_times(sm + L.ow, s.orows, s.ocols, xq, osum);
    __syncthreads();
    const int head0 = cluster * s.heads;  // (the cluster's columns; rows by rank)
    for (int i = tid; i < s.orows; i += nt) atomicAdd(out + rank * s.orows + i, osum[i] + 1e-9f * head0);
    mark[m++] = now_ns();
    if (tid == 0) {
        u64* my = stamps + (u64)blockIdx.x * STAMPS;
        for (int i = 0; i < m; i++) my[i] = mark[i];
        my[STAMPS - 1] = before_end;
    }
}

// ------------------------------------------------------------------ host
int main() {
    int dev = 0, sms = 0, optin = 0;
    CHECK(cudaGetDevice(&dev));
    CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
    cudaDeviceProp prop;
    CHECK(cudaGetDeviceProperties(&prop, dev));
    printf("%s, %d SMs; one attention half of Llama-3.1-8B at batch 1, us from the wait's release\n", prop.name,
           sms);
    const int blocks = 128;  // 8 KV heads x 16, or 16 clusters of 8
    unsigned char* weights;
    uint16_t* cache;
    float *x, *out;
    u64 *stamps, *end;
    const size_t wbytes = (size_t)blocks * 256 * 1024;
    CHECK(cudaMalloc(&weights, wbytes));
    CHECK(cudaMalloc(&cache, wbytes));
    CHECK(cudaMemset(weights, 0x5a, wbytes));
    CHECK(cudaMemset(cache, 0x21, wbytes));
    CHECK(cudaMalloc(&x, HIDDEN * 4));
    CHECK(cudaMalloc(&out, HIDDEN * 4));
    CHECK(cudaMalloc(&stamps, blocks * STAMPS * 8));
    CHECK(cudaMalloc(&end, 8));
    float* gbuf;  // the clusters' exchange buffers through L2 (at most 8 x 36 KB)
    u32* counts;
    CHECK(cudaMalloc(&gbuf, (size_t)blocks * 64 * 1024));
    CHECK(cudaMalloc(&counts, 2 * blocks * 4));
    CHECK(cudaFuncSetAttribute(attn_half, cudaFuncAttributeNonPortableClusterSizeAllowed, 1));
    CHECK(cudaFuncSetAttribute(attn_half, cudaFuncAttributeMaxDynamicSharedMemorySize, optin));
    // Both kernels prefer the most shared memory an SM has, so that the
    // half's blocks may start beside the kernel before's.
    CHECK(cudaFuncSetAttribute(attn_half, cudaFuncAttributePreferredSharedMemoryCarveout, 100));
    CHECK(cudaFuncSetAttribute(before, cudaFuncAttributePreferredSharedMemoryCarveout, 100));
    cudaStream_t stream;
    CHECK(cudaStreamCreate(&stream));
    printf("| cluster | warps | keys | work | exchange | smem KB | clusters at once | median | p90 | release | input | "
           "q/k/v + send | attention + send | merge | output |\n");
    printf("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
    // work 0: the stages' data moves and barriers alone, no products; l2:
    // the exchanges through global memory instead of the cluster's.
    struct Config {
        int C, warps, ctx, work, l2;
    };
    std::vector<Config> configs;
    for (int C : {16, 8})
        for (int warps : {4, 8, 16})
            for (int ctx : {64, 512})
                for (int work : {1, 0}) configs.push_back(Config{C, warps, ctx, work, 0});
    for (int C : {16, 8})
        for (int work : {1, 0}) configs.push_back(Config{C, 16, 64, work, 1});
    for (const Config& c : configs) {
        const int C = c.C, warps = c.warps, ctx = c.ctx, work = c.work, l2 = c.l2;
        const Shape s = shape_of(C, ctx);
        const Layout L = layout_of(s);
        if ((int)L.total > optin || warps < s.heads) continue;
        cudaLaunchConfig_t cfg = {};
        cfg.gridDim = dim3(blocks);
        cfg.blockDim = dim3(32 * warps);
        cfg.dynamicSmemBytes = L.total;
        cfg.stream = stream;
        cudaLaunchAttribute attr[2];
        attr[0].id = cudaLaunchAttributeClusterDimension;
        attr[0].val.clusterDim.x = C, attr[0].val.clusterDim.y = 1, attr[0].val.clusterDim.z = 1;
        attr[1].id = cudaLaunchAttributeProgrammaticStreamSerialization;
        attr[1].val.programmaticStreamSerializationAllowed = 1;
        cfg.attrs = attr;
        cfg.numAttrs = 1;
        int fit = 0;
        CHECK(cudaOccupancyMaxActiveClusters(&fit, attn_half, &cfg));
        cfg.numAttrs = 2;
        std::vector<double> total;
        std::vector<double> stage(STAMPS, 0.0);
        std::vector<u64> h(blocks * STAMPS);
        const int runs = 120, warm = 20;
        for (int it = 0; it < runs; it++) {
            CHECK(cudaMemsetAsync(end, 0, 8, stream));
            CHECK(cudaMemsetAsync(counts, 0, 2 * blocks * 4, stream));
            before<<<sms, 32, 0, stream>>>(x, end);
            CHECK(cudaGetLastError());
            CHECK(cudaLaunchKernelEx(&cfg, attn_half, (const unsigned char*)weights, (const uint16_t*)cache,
                                     (const float*)x, out, stamps, C, ctx, work, l2, gbuf, counts,
                                     (const u64*)end));
            CHECK(cudaStreamSynchronize(stream));
            CHECK(cudaMemcpy(h.data(), stamps, h.size() * 8, cudaMemcpyDeviceToHost));
            const u64 e = h[STAMPS - 1];  // (the kernel before's end, as block 0 read it after its wait)
            if (e == 0) {
                fprintf(stderr, "the kernel before had not ended when the half's wait returned\n");
                return 1;
            }
            if (it < warm) continue;
            u64 last = 0, first = ~0ull;
            for (int b = 0; b < blocks; b++) {
                last = std::max(last, h[b * STAMPS + 5]);
                first = std::min(first, h[b * STAMPS]);
            }
            total.push_back((double)(last - first) * 1e-3);
            stage[0] += (double)((long long)h[0] - (long long)e) * 1e-3;
            for (int i = 1; i < 6; i++) stage[i] += (double)(h[i] - h[i - 1]) * 1e-3;
        }
        std::sort(total.begin(), total.end());
        const double n = (double)total.size();
        const double median = total[total.size() / 2], p90 = total[total.size() * 9 / 10];
        printf("| %d | %d | %d | %s | %s | %u | %d | %.2f | %.2f | %.2f | %.2f | %.2f | %.2f | %.2f | %.2f |\n", C,
               warps, ctx, work ? "yes" : "none", l2 ? "L2" : "cluster", L.total / 1024, fit, median, p90,
               stage[0] / n, stage[1] / n, stage[2] / n, stage[3] / n, stage[4] / n, stage[5] / n);
    }
    return 0;
}
