// Shared helpers, prepended to every kernel source. Self-contained on purpose:
// no toolkit headers (cuda_fp16.h / cuda_bf16.h), so kernels compile wherever
// NVRTC itself is present, with a driver and no toolkit.
typedef unsigned short u16;
typedef unsigned int u32;
typedef unsigned long long u64;
#define INFINITY __int_as_float(0x7f800000)

__device__ __forceinline__ float bf16_to_f32(u16 h) { return __uint_as_float(((u32)h) << 16); }
__device__ __forceinline__ u16 f32_to_bf16(float f) {
    u16 r;
    asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(r) : "f"(f));
    return r;
}
__device__ __forceinline__ float f16_to_f32(u16 h) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
}
__device__ __forceinline__ u16 f32_to_f16(float f) {
    u16 r;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(r) : "f"(f));
    return r;
}

// v in 16 bits: bf16 when `bf16`, else f16 (activations copied for a GEMM).
__device__ __forceinline__ u16 f32_to_half(float v, int bf16) { return bf16 ? f32_to_bf16(v) : f32_to_f16(v); }

// A token id, or a fed id (from 0x80000000: host picks.rs `FED_TOKEN`)
// naming row id - 0x80000000 of the last sampling launch's picks, (token,
// logprob) word pairs: the next decode step launched before the host reads them.
__device__ __forceinline__ u32 token_id(u32 id, const u32* picks) {
    return id >= 0x80000000u ? picks[2 * (id - 0x80000000u)] : id;
}
// Loads of cached keys and values, f32 or f16 (stored as raw bits).
__device__ __forceinline__ float load_kv(const float* p, u64 i) { return p[i]; }
__device__ __forceinline__ float load_kv(const u16* p, u64 i) { return f16_to_f32(p[i]); }

// a x + b y, rounded the same way in every kernel it is compiled into. The
// GEMVs' float sums must not depend on the batch size they are compiled
// for (the batch-invariant mode), but the compiler may contract a x + b y
// into either of two fused multiply-adds, and chose differently for
// gemv_q4_1t_whole_1 and gemv_q4_1t_2 (sixty-third session): the GEMVs
// spell their float arithmetic with intrinsics, which it never contracts.
__device__ __forceinline__ float scaled_pair(float a, float x, float b, float y) {
    return __fmaf_rn(b, y, __fmul_rn(a, x));
}

__device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// Sum over the whole block (any blockDim.x up to 1024); every thread gets it.
__device__ __forceinline__ float block_sum(float v) {
    __shared__ float part[32];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    v = warp_sum(v);
    __syncthreads();
    if (lane == 0) part[warp] = v;
    __syncthreads();
    const int nw = (blockDim.x + 31) >> 5;
    float t = lane < nw ? part[lane] : 0.f;
    t = warp_sum(t);
    return t;
}

// Activations; codes match `Activation` on the host: 0 SiLU, 1 GELU (tanh), 2 GELU (erf).
__device__ __forceinline__ float act_fn(float x, int act) {
    if (act == 0) return x / (1.f + expf(-x));
    if (act == 1) return x / (1.f + expf(-2.f * 0.7978845608f * (x + 0.044715f * x * x * x)));
    return 0.5f * x * (1.f + erff(x * 0.70710678118654752f));
}

// Decode GEMVs run up to three weights that share an input in one launch,
// their rows back to back. Given w, y, m set to the first weight's, moves
// `row` (global) into the weight it falls in; false past the last.
template <typename W>
__device__ __forceinline__ bool pick_weight(u32& row, const W*& w, float*& y, u32& m, const W* w1, const W* w2,
                                            float* y1, float* y2, u32 m1, u32 m2) {
    if (row >= m) {
        row -= m;
        w = w1, y = y1, m = m1;
        if (row >= m) {
            row -= m;
            w = w2, y = y2, m = m2;
        }
    }
    return row < m;
}

// What a GEMV warp adds its rows' sums to: zero, or with `add` (`matmul_add`:
// y is the residual stream) y's values, read by lane 0 as soon as the input
// is ready, long before they are needed (read at the end, they lengthened
// every warp by a load's latency).
template <int N>
__device__ __forceinline__ void start_values(float (&base)[N], const float* y, u32 m, u32 row, int add, u32 lane) {
#pragma unroll
    for (int n = 0; n < N; n++) base[n] = add && lane == 0 ? y[(u64)n * m + row] : 0.f;
}

// Programmatic dependent launch (Hopper and later). A kernel launched with
// it (`Device::launch_pdl`) may start while the kernel before it still runs:
// it must call `pdl_wait()` before it reads anything that kernel wrote or
// writes anything that kernel reads (only immutable weights may be touched
// first). `pdl_trigger()` lets the next such kernel start; a kernel that never
// calls it triggers when it exits. Both are no-ops without the launch
// attribute and before sm_90.
//
// With FERRITE_TRACE defined (`FERRITE_CUDA_TRACE=1`, cuda/trace.rs) the
// first thread of every kernel's first block records, as it leaves the
// wait, when it arrived there, when it left (the kernel before ended) and
// the name of the function that waited: the decode graph's timeline, in
// which each kernel's time is from its release to the next one's.
#ifdef FERRITE_TRACE
#define TRACE_RECORDS 32768
__device__ unsigned long long ferrite_trace[4 * TRACE_RECORDS];
__device__ unsigned int ferrite_trace_n;
__device__ __forceinline__ unsigned long long global_ns() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}
// Whether this thread records (the first of the first block).
__device__ __forceinline__ bool trace_first() {
    return (threadIdx.x | threadIdx.y | threadIdx.z | blockIdx.x | blockIdx.y | blockIdx.z) == 0;
}
// One record: (arrived, left, name in two words).
__device__ __forceinline__ void trace_put(unsigned long long arrived, unsigned long long left, const char* who) {
    // (A ring: the latest records are kept.)
    const unsigned int i = atomicAdd(&ferrite_trace_n, 1u) % TRACE_RECORDS;
    unsigned long long name[2] = {0, 0};
    for (int j = 0; j < 16 && who[j]; j++) name[j / 8] |= (unsigned long long)(unsigned char)who[j] << (8 * (j % 8));
    unsigned long long* r = ferrite_trace + 4 * i;
    r[0] = arrived, r[1] = left, r[2] = name[0], r[3] = name[1];
}
#endif
__device__ __forceinline__ void pdl_wait_at(const char* who) {
#ifdef FERRITE_TRACE
    const bool first = trace_first();
    const unsigned long long arrived = first ? global_ns() : 0;
#endif
#if __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
#ifdef FERRITE_TRACE
    if (first) trace_put(arrived, global_ns(), who);
#else
    (void)who;
#endif
}
#define pdl_wait() pdl_wait_at(__func__)
// A stage inside a kernel on the timeline (`FERRITE_CUDA_TRACE=2`): the
// first thread of the first block records when it got there, as a release
// of `label` (at most 16 characters), so the kernel's span splits at it.
// Each mark costs that thread an atomic's round trip (about 0.6 us on the
// H200), which the stage after it carries.
#if defined(FERRITE_TRACE) && defined(FERRITE_TRACE_MARKS)
__device__ __forceinline__ void trace_mark(const char* label) {
    if (!trace_first()) return;
    const unsigned long long now = global_ns();
    trace_put(now, now, label);
}
#else
#define trace_mark(label) ((void)0)
#endif
// With SM_BUSY (on unless `FERRITE_CUDA_SM_BUSY=0`, cuda/sm_busy.rs): per
// SM, how many blocks of a one-row decode attention run there now, so that
// a batch-1 tile GEMV launched early loads its first weights before its
// wait only on SMs where none runs. On those, its loads would take the
// SM's memory requests ahead of attention's last loads and stores (the
// output projection, launched once attention's keys are read, made them
// take about 4.5 us on an H100). The look costs the GEMV a round trip
// before its first loads, which alone measured +0.6% (a sleep of 300 or
// 1,000 ns there instead: -0.4% and -1.3%); at batch 4 it cost 1.6%.
// `ferrite_busy` is one buffer that the host gives every module; a hint
// only, read relaxed (docs/cuda-journal.md, forty-second session).
#ifdef SM_BUSY
__device__ unsigned int* ferrite_busy;
__device__ __forceinline__ unsigned int sm_index() {
    unsigned int s;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(s));
    return s & 1023u;
}
__device__ __forceinline__ void busy_enter() {
    if (ferrite_busy && threadIdx.x == 0 && threadIdx.y == 0) atomicAdd(ferrite_busy + sm_index(), 1u);
}
// (Every thread of the block: it waits for the others first.)
__device__ __forceinline__ void busy_leave() {
    if (!ferrite_busy) return;
    __syncthreads();
    if (threadIdx.x == 0 && threadIdx.y == 0) atomicSub(ferrite_busy + sm_index(), 1u);
}
__device__ __forceinline__ bool sm_busy() {
    if (!ferrite_busy) return false;
    unsigned int v;
    asm volatile("ld.relaxed.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(ferrite_busy + sm_index()));
    return v != 0;
}
#else
#define busy_enter() ((void)0)
#define busy_leave() ((void)0)
#define sm_busy() false
#endif
// A decode step's input that the host wrote (attention metadata, block
// tables): no kernel writes one, so a kernel may read it before pdl_wait.
__device__ __forceinline__ u32 step_input(const u32* p, u64 i) { return p[i]; }
__device__ __forceinline__ void prefetch_l1(const void* p) { asm volatile("prefetch.L1 [%0];" ::"l"(p)); }
__device__ __forceinline__ void pdl_trigger() {
#if __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// 16 bytes of 16-bit weights streamed past L1 (read once; the small input
// the GEMVs read again and again keeps L1 to itself).
__device__ __forceinline__ uint4 load_stream(const uint4* p) {
    uint4 v;
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p));
    return v;
}

// 16 bytes of quantized blocks (the tile GEMVs), read once a step as "last
// use" (`ld.global.lu`, evicted first): the streamed lines leave L2 before the
// activations and the KV cache that the latency-bound kernels between the
// GEMVs read (Q4_K_M decode +4%; the variants measured are in
// docs/cuda-journal.md, thirty-second session). 16-bit weights keep
// `load_stream`: this load made the bf16 GEMV 2.8% slower.
// `-D WEIGHT_LOAD_NC` restores it here for an A/B.
__device__ __forceinline__ uint4 load_blocks(const uint4* p) {
#ifdef WEIGHT_LOAD_NC
    return load_stream(p);
#else
    uint4 v;
    asm volatile("ld.global.lu.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p));
    return v;
#endif
}

// Starts fetching bytes [p, p + bytes) into L2 (the copy engine's bulk
// prefetch: one instruction, no registers), trimmed to whole 16-byte units.
__device__ __forceinline__ void prefetch_l2(const void* p, u32 bytes) {
#if __CUDA_ARCH__ >= 900
    u64 a;
    asm("cvta.to.global.u64 %0, %1;" : "=l"(a) : "l"(p));
    const u64 s = (a + 15) & ~15ull, e = (a + bytes) & ~15ull;
    if (e > s) asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(s), "r"((u32)(e - s)) : "memory");
#endif
}
