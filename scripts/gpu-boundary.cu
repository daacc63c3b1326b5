// What a dependency between two steps of a decode costs on the GPU, apart
// from any work: a chain of dependent kernels (as a decode step's graph
// runs them) against one persistent kernel whose blocks synchronize
// between the steps. Each step is a block per SM, each block reading a
// word another block wrote in the step before (so every step depends on
// the one before across blocks), timed over many steps with CUDA events.
//
// On a GPU machine with the CUDA toolkit (no Rust needed):
//   nvcc -O2 -arch=sm_90 -o /tmp/gpu-boundary scripts/gpu-boundary.cu && /tmp/gpu-boundary
// It prints microseconds per step for:
//   graph        kernels captured in a graph, each waiting for the last
//   graph+pdl    the same launched for programmatic dependent launch
//                (each lets the next start at once and waits for it with
//                griddepcontrol.wait, as ferrite's kernels do)
//   pdl-late     the same, each letting the next start after its work
//   pdl-2/SM     graph+pdl with two blocks an SM
//   barrier      one kernel, all blocks meeting at a grid-wide barrier
//   counter      one kernel, each block adding its arrival to one counter
//                and waiting until the whole step has
#include "gpu-bench.cuh"

// One step as a kernel: block b reads the word block b + 1 wrote. With
// LATE the next kernel may start only after that (as ferrite's GEMVs let
// it after their loop), else at once.
template <bool LATE>
__global__ void step_kernel(const float* x, float* y) {
    if (!LATE) pdl_trigger();
    pdl_wait();
    if (threadIdx.x == 0) y[blockIdx.x] = __ldcg(x + (blockIdx.x + 1) % gridDim.x) + 1.f;
    if (LATE) pdl_trigger();
}

// Step s of a persistent kernel's block b: its word, from the one block
// b + 1 wrote in step s - 1 (the two halves of buf in turn).
__device__ __forceinline__ void step_word(float* buf, int s) {
    const unsigned nb = gridDim.x, b = blockIdx.x;
    const float* x = buf + (s & 1) * nb;
    buf[((s + 1) & 1) * nb + b] = __ldcg(x + (b + 1) % nb) + 1.f;
}

// All steps in one kernel, a grid-wide barrier between them (a counter
// and a generation word; the last block to arrive opens the next step).
__global__ void barrier_kernel(float* buf, int steps, unsigned* count, unsigned* gen) {
    const unsigned nb = gridDim.x;
    for (int s = 0; s < steps; s++) {
        if (threadIdx.x == 0) {
            step_word(buf, s);
            const unsigned g = *(volatile unsigned*)gen;
            __threadfence();
            if (atomicAdd(count, 1u) == nb - 1) {
                *count = 0;
                __threadfence();
                atomicAdd(gen, 1u);
            } else {
                while (*(volatile unsigned*)gen == g) {
                }
            }
            __threadfence();
        }
        __syncthreads();
    }
}

// All steps in one kernel, each block counting its arrival in one
// monotonic counter and waiting until every block of the step has.
__global__ void counter_kernel(float* buf, int steps, unsigned* count) {
    const unsigned nb = gridDim.x;
    for (int s = 0; s < steps; s++) {
        if (threadIdx.x == 0) {
            step_word(buf, s);
            __threadfence();
            atomicAdd(count, 1u);
            while (*(volatile unsigned*)count < nb * (s + 1)) {
            }
            __threadfence();
        }
        __syncthreads();
    }
}

int main() {
    int sms = 0;
    CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    const int steps = 512, threads = 256;
    float* buf;
    unsigned *count, *gen;
    CHECK(cudaMalloc(&buf, 4 * sms * sizeof(float)));
    CHECK(cudaMalloc(&count, sizeof(unsigned)));
    CHECK(cudaMalloc(&gen, sizeof(unsigned)));
    CHECK(cudaMemset(buf, 0, 4 * sms * sizeof(float)));
    cudaStream_t st;
    CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    cudaEvent_t t0, t1;
    CHECK(cudaEventCreate(&t0));
    CHECK(cudaEventCreate(&t1));
    float ms = 0.f;
    printf("%d SMs, %d steps of %d blocks x %d threads\n", sms, steps, sms, threads);

    // 0: no PDL; 1: PDL, the next started at once; 2: started after the work;
    // 3: as 1 with two blocks an SM.
    for (int pdl = 0; pdl < 4; pdl++) {
        const int blocks = pdl == 3 ? 2 * sms : sms;
        cudaGraph_t graph;
        cudaGraphExec_t exec;
        CHECK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
        for (int s = 0; s < steps; s++) {
            cudaLaunchConfig_t cfg = {};
            cfg.gridDim = dim3(blocks);
            cfg.blockDim = dim3(threads);
            cfg.stream = st;
            cudaLaunchAttribute attr;
            attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
            attr.val.programmaticStreamSerializationAllowed = 1;
            cfg.attrs = &attr;
            cfg.numAttrs = pdl > 0;
            const float* x = buf + (s & 1) * 2 * sms;
            float* y = buf + ((s + 1) & 1) * 2 * sms;
            if (pdl == 2) CHECK(cudaLaunchKernelEx(&cfg, step_kernel<true>, x, y));
            else CHECK(cudaLaunchKernelEx(&cfg, step_kernel<false>, x, y));
        }
        CHECK(cudaStreamEndCapture(st, &graph));
        CHECK(cudaGraphInstantiate(&exec, graph, 0));
        for (int r = 0; r < 3; r++) CHECK(cudaGraphLaunch(exec, st));
        CHECK(cudaEventRecord(t0, st));
        const int reps = 10;
        for (int r = 0; r < reps; r++) CHECK(cudaGraphLaunch(exec, st));
        CHECK(cudaEventRecord(t1, st));
        CHECK(cudaEventSynchronize(t1));
        CHECK(cudaEventElapsedTime(&ms, t0, t1));
        const char* names[4] = {"graph", "graph+pdl", "pdl-late", "pdl-2/SM"};
        printf("%-11s %.3f us a step\n", names[pdl], 1000.f * ms / (reps * steps));
        CHECK(cudaGraphExecDestroy(exec));
        CHECK(cudaGraphDestroy(graph));
    }

    for (int kind = 0; kind < 2; kind++) {
        float best = 1e30f;
        for (int r = 0; r < 5; r++) {
            CHECK(cudaMemsetAsync(count, 0, sizeof(unsigned), st));
            CHECK(cudaMemsetAsync(gen, 0, sizeof(unsigned), st));
            CHECK(cudaEventRecord(t0, st));
            if (kind == 0) barrier_kernel<<<sms, threads, 0, st>>>(buf, steps, count, gen);
            else counter_kernel<<<sms, threads, 0, st>>>(buf, steps, count);
            CHECK(cudaGetLastError());
            CHECK(cudaEventRecord(t1, st));
            CHECK(cudaEventSynchronize(t1));
            CHECK(cudaEventElapsedTime(&ms, t0, t1));
            if (r > 0 && ms < best) best = ms;
        }
        printf("%-11s %.3f us a step\n", kind == 0 ? "barrier" : "counter", 1000.f * best / steps);
    }
    float h[2] = {0.f, 0.f};
    CHECK(cudaMemcpy(h, buf, 2 * sizeof(float), cudaMemcpyDeviceToHost));
    printf("(values %.0f %.0f)\n", h[0], h[1]);
    return 0;
}
