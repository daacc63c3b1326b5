// Why do the batch-1 Q4_K GEMVs' products cost time, when they issue a
// third of what the SMs could? Two guesses, each tested here without the
// engine, on gate/up's shape (Llama-3.1-8B: 1,792 tiles of 16 rows, 16
// super-blocks of 2,304 bytes each, 66 MB a layer, 32 layers' worth so
// that L2 holds none):
//
//   depth   A warp asks for super-block s + 2 only after its products on s
//           (`gemv_tile_body`), so while it computes one set of weights is
//           in flight, not two. "first" asks before the products (a third
//           set of registers); "after" is the engine's order.
//   order   A warp walks its own tile's 36,864 contiguous bytes, so the
//           2,112 warps of a wave read 2,112 places of the 66 MB at once.
//           "sb-major" stores super-block s of every tile together, so the
//           whole GPU reads one window that moves through memory.
//
// The products are stood in for by a dependent chain of WORK multiply-adds
// after every word of the super-block is XORed (so each load is waited
// for as the products wait): 0 is loads alone. Each kernel loads a warp's
// words as `q4k_fetch` does (ld.global.lu, 16 bytes a lane, six loads),
// launches with programmatic dependent launch, its first loads before its
// wait, as the engine's GEMVs do. Prints GB/s for every combination, best
// of five passes over the 32 layers.
//
// On a GPU machine with the CUDA toolkit:
//   nvcc -O3 -arch=sm_90 -o /tmp/gpu-layout scripts/gpu-layout.cu && /tmp/gpu-layout
#include <cstdint>
#include <vector>
#include "gpu-bench.cuh"

typedef uint8_t u8;
typedef uint32_t u32;
typedef uint64_t u64;

constexpr u32 SB_BYTES = 2304, NSB = 16, TILES = 1792, LAYERS = 32, WARPS = 8;
constexpr u64 LAYER_BYTES = (u64)TILES * NSB * SB_BYTES;

struct W {
    uint4 h0, h1, a, b, c, d;
};
__device__ __forceinline__ uint4 ld(const uint4* p) {
    uint4 v;
    asm volatile("ld.global.lu.v4.u32 {%0, %1, %2, %3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
    return v;
}
// Super-block sb of tile t: tile-major (the engine's) or sb-major.
template <bool SB_MAJOR>
__device__ __forceinline__ const uint4* block_of(const u8* base, u32 t, u32 sb) {
    const u64 i = SB_MAJOR ? (u64)sb * TILES + t : (u64)t * NSB + sb;
    return (const uint4*)(base + i * SB_BYTES);
}
__device__ __forceinline__ W fetch(const uint4* b, u32 lane) {
    return W{ld(b + (lane >> 2)), ld(b + 8 + (lane >> 2)), ld(b + 16 + lane),
             ld(b + 48 + lane),   ld(b + 80 + lane),     ld(b + 112 + lane)};
}
__device__ __forceinline__ u32 fold(uint4 v) { return v.x ^ v.y ^ v.z ^ v.w; }
template <int WORK>
__device__ __forceinline__ u32 work(const W& w, u32 acc) {
    u32 v = acc ^ fold(w.h0) ^ fold(w.h1) ^ fold(w.a) ^ fold(w.b) ^ fold(w.c) ^ fold(w.d);
#pragma unroll
    for (int i = 0; i < WORK; i++) v = v * 2654435761u + (v >> 7);
    return v;
}

// FIRST: ask for super-block s + D - 1 before the work on s (D sets);
// otherwise ask for s + D after it (the engine: D = 2).
template <bool SB_MAJOR, bool FIRST, int D, int WORK>
__global__ void __launch_bounds__(32 * WARPS) stream(const u8* base, u32* out) {
    const u32 lane = threadIdx.x & 31, t = blockIdx.x * WARPS + (threadIdx.x >> 5);
    W buf[D];
    constexpr int AHEAD = FIRST ? D - 1 : D;
#pragma unroll
    for (int s = 0; s < AHEAD; s++) buf[s] = fetch(block_of<SB_MAJOR>(base, t, s), lane);
    pdl_wait();
    u32 acc = 0;
#pragma unroll
    for (int s = 0; s < (int)NSB; s++) {
        if (FIRST && s + D - 1 < (int)NSB) buf[(s + D - 1) % D] = fetch(block_of<SB_MAJOR>(base, t, s + D - 1), lane);
        acc = work<WORK>(buf[s % D], acc);
        if (!FIRST && s + D < (int)NSB) buf[s % D] = fetch(block_of<SB_MAJOR>(base, t, s + D), lane);
    }
    pdl_trigger();
    if (acc == 0x9e3779b9u) out[t * 32 + lane] = acc;  // never, but the compiler cannot know
}

template <bool SB_MAJOR, bool FIRST, int D, int WORK>
int run(const u8* w, u32* out, cudaStream_t st, cudaEvent_t e0, cudaEvent_t e1) {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(TILES / WARPS), cfg.blockDim = dim3(32 * WARPS), cfg.stream = st;
    cudaLaunchAttribute at[1];
    at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    at[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = at, cfg.numAttrs = 1;
    float best = 1e30f;
    for (int pass = 0; pass < 6; pass++) {  // the first pass warms up
        CHECK(cudaEventRecord(e0, st));
        for (u32 l = 0; l < LAYERS; l++)
            CHECK(cudaLaunchKernelEx(&cfg, stream<SB_MAJOR, FIRST, D, WORK>, w + l * LAYER_BYTES, out));
        CHECK(cudaEventRecord(e1, st));
        CHECK(cudaEventSynchronize(e1));
        float ms;
        CHECK(cudaEventElapsedTime(&ms, e0, e1));
        if (pass > 0 && ms < best) best = ms;
    }
    printf("| %-8s | %-5s | %d | %4d | %7.1f | %6.2f |\n", SB_MAJOR ? "sb-major" : "tile", FIRST ? "first" : "after",
           D, WORK, LAYERS * LAYER_BYTES / (best * 1e6), best * 1e3 / LAYERS);
    return 0;
}

template <bool SB_MAJOR>
int order(const u8* w, u32* out, cudaStream_t st, cudaEvent_t e0, cudaEvent_t e1) {
    int r = 0;
    r |= run<SB_MAJOR, false, 2, 0>(w, out, st, e0, e1);
    r |= run<SB_MAJOR, false, 2, 48>(w, out, st, e0, e1);
    r |= run<SB_MAJOR, false, 2, 96>(w, out, st, e0, e1);
    r |= run<SB_MAJOR, true, 3, 0>(w, out, st, e0, e1);
    r |= run<SB_MAJOR, true, 3, 48>(w, out, st, e0, e1);
    r |= run<SB_MAJOR, true, 3, 96>(w, out, st, e0, e1);
    r |= run<SB_MAJOR, false, 1, 48>(w, out, st, e0, e1);
    r |= run<SB_MAJOR, false, 3, 48>(w, out, st, e0, e1);
    return r;
}

int main() {
    cudaDeviceProp p;
    CHECK(cudaGetDeviceProperties(&p, 0));
    printf("%s, %d SMs; %u layers of %.1f MB\n", p.name, p.multiProcessorCount, LAYERS, LAYER_BYTES / 1e6);
    u8* w;
    u32* out;
    CHECK(cudaMalloc(&w, LAYERS * LAYER_BYTES));
    CHECK(cudaMalloc(&out, TILES * 32 * sizeof(u32)));
    CHECK(cudaMemset(w, 0x5a, LAYERS * LAYER_BYTES));
    cudaStream_t st;
    cudaEvent_t e0, e1;
    CHECK(cudaStreamCreate(&st));
    CHECK(cudaEventCreate(&e0));
    CHECK(cudaEventCreate(&e1));
    // A plain copy of the same bytes, the roofline's rate (read + written).
    {
        u8* dst;
        const u64 half = LAYERS * LAYER_BYTES / 2;
        CHECK(cudaMalloc(&dst, half));
        float best = 1e30f;
        for (int pass = 0; pass < 4; pass++) {
            CHECK(cudaEventRecord(e0, st));
            CHECK(cudaMemcpyAsync(dst, w, half, cudaMemcpyDeviceToDevice, st));
            CHECK(cudaEventRecord(e1, st));
            CHECK(cudaEventSynchronize(e1));
            float ms;
            CHECK(cudaEventElapsedTime(&ms, e0, e1));
            if (pass > 0 && ms < best) best = ms;
        }
        printf("copy: %.1f GB/s (read + written)\n", 2 * half / (best * 1e6));
        CHECK(cudaFree(dst));
    }
    printf("| order    | ask   | D | work |    GB/s | us/layer |\n|---|---|---|---|---|---|\n");
    if (order<false>(w, out, st, e0, e1) || order<true>(w, out, st, e0, e1)) return 1;
    return 0;
}
