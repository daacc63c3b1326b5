// Hopper's warpgroup MMA (wgmma) for the flash kernel (attention.cu, which
// the module list joins to this file: compile.rs MODULES).

// ---------------------------------------------------------------- wgmma (sm_90a)
//
// Hopper's warpgroup MMA: the block's 4 warps multiply together, A (q or the
// probabilities) from registers in the layout of mma.sync's A fragment (warp
// w: rows 16w..16w+15), B (keys or values) read by the tensor cores straight
// from shared memory, once for the whole warpgroup (mma.sync needs it in
// every warp's registers: 4x the shared-memory reads, which bounded the
// flash kernel). The accumulators keep mma.sync's C layout, 8 columns a
// fragment. Arch-specific (compiled for sm_90a only): FLASH_WG is 0 for
// every other target and the kernels that need it trap there.
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define FLASH_WG 1
#else
#define FLASH_WG 0
#endif

// A shared-memory matrix in 128-byte swizzled rows (16-byte chunk c of
// row r of a 1,024-byte-aligned 8-row atom stored at chunk c ^ r): its
// start and the two byte strides `lbo` and `sbo` between groups of rows
// (PTX "matrix descriptor", "canonical layouts": their meaning depends on
// the major-ness), in 16-byte units. (Unswizzled core matrices measured
// slower than mma.sync: 38,018 tok/s prefill against 39,053.)
__device__ __forceinline__ u64 wg_desc(const void* smem, u32 lbo, u32 sbo) {
    const u32 a = (u32)__cvta_generic_to_shared(smem);
    return (u64)((a >> 4) & 0x3fffu) | ((u64)((lbo >> 4) & 0x3fffu) << 16) | ((u64)((sbo >> 4) & 0x3fffu) << 32) |
           (1ull << 62);
}

// One synchronizing instruction as a function, a no-op without wgmma.
#if FLASH_WG
#define WG_SYNC(NAME, INSTR) \
    __device__ __forceinline__ void NAME() { asm volatile(INSTR ::: "memory"); }
#else
#define WG_SYNC(NAME, INSTR) \
    __device__ __forceinline__ void NAME() {}
#endif
// Orders the registers' writes before the next wgmma reads them.
WG_SYNC(wg_fence, "wgmma.fence.sync.aligned;")
// Makes this thread's shared-memory writes (cp.async) visible to wgmma's reads.
WG_SYNC(wg_proxy_fence, "fence.proxy.async.shared::cta;")
// Closes a group of wgmmas; `wg_wait` waits for all of them, after which
// `wg_keep` stops the compiler from reading their accumulators earlier.
WG_SYNC(wg_commit, "wgmma.commit_group.sync.aligned;")
WG_SYNC(wg_wait, "wgmma.wait_group.sync.aligned 0;")

template <int N>
__device__ __forceinline__ void wg_keep(float (&d)[N][4]) {
#pragma unroll
    for (int n = 0; n < N; n++)
#pragma unroll
        for (int i = 0; i < 4; i++) asm volatile("" : "+f"(d[n][i])::"memory");
}

// d (m64 x N, f32) += a (m64 x k16, f16 in registers) x b (k16 x N, f16 in
// shared memory); `acc` 0 overwrites d. `_t`: b is stored N-major (values:
// each key's dimensions contiguous), else K-major (keys: the same).
__device__ __forceinline__ void wgmma_n32(float (&d)[4][4], const u32 (&a)[4], u64 b, int acc) {
#if FLASH_WG
    asm volatile(
        "{\n.reg .pred p;\n"
        "setp.ne.b32 p, %21, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n32k16.f32.f16.f16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, "
        "{%16, %17, %18, %19}, %20, p, 1, 1, 0;\n}\n"
        : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]),
          "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(acc));
#endif
}

__device__ __forceinline__ void wgmma_n64_t(float (&d)[8][4], const u32 (&a)[4], u64 b, int acc) {
#if FLASH_WG
    asm volatile(
        "{\n.reg .pred p;\n"
        "setp.ne.b32 p, %37, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
        "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "
        "{%32, %33, %34, %35}, %36, p, 1, 1, 1;\n}\n"
        : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]),
          "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]),
          "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]),
          "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(acc));
#endif
}

__device__ __forceinline__ void wgmma_n128_t(float (&d)[16][4], const u32 (&a)[4], u64 b, int acc) {
#if FLASH_WG
    asm volatile(
        "{\n.reg .pred p;\n"
        "setp.ne.b32 p, %69, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
        "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
        "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
        "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, "
        "{%64, %65, %66, %67}, %68, p, 1, 1, 1;\n}\n"
        : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]),
          "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]),
          "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]),
          "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3]),
          "+f"(d[8][0]), "+f"(d[8][1]), "+f"(d[8][2]), "+f"(d[8][3]), "+f"(d[9][0]), "+f"(d[9][1]), "+f"(d[9][2]), "+f"(d[9][3]),
          "+f"(d[10][0]), "+f"(d[10][1]), "+f"(d[10][2]), "+f"(d[10][3]), "+f"(d[11][0]), "+f"(d[11][1]), "+f"(d[11][2]), "+f"(d[11][3]),
          "+f"(d[12][0]), "+f"(d[12][1]), "+f"(d[12][2]), "+f"(d[12][3]), "+f"(d[13][0]), "+f"(d[13][1]), "+f"(d[13][2]), "+f"(d[13][3]),
          "+f"(d[14][0]), "+f"(d[14][1]), "+f"(d[14][2]), "+f"(d[14][3]), "+f"(d[15][0]), "+f"(d[15][1]), "+f"(d[15][2]), "+f"(d[15][3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(acc));
#endif
}
