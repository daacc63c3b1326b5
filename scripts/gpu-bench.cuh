// What the standalone GPU measurements (gpu-boundary.cu, gpu-stream.cu)
// share: a CUDA call that fails ends the program with its message, and the
// programmatic-dependent-launch instructions ferrite's kernels use.
#pragma once
#include <cstdio>
#include <cuda_runtime.h>

#define CHECK(x)                                                                              \
    do {                                                                                      \
        cudaError_t e = (x);                                                                  \
        if (e != cudaSuccess) {                                                               \
            fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e)); \
            return 1;                                                                         \
        }                                                                                     \
    } while (0)

// Wait for the kernel before (its memory visible); let the next start.
__device__ __forceinline__ void pdl_wait() {
#if __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
__device__ __forceinline__ void pdl_trigger() {
#if __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}
