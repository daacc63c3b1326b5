// Paged attention. Keys live in a paged cache (slot = table[t / bs] * bs +
// t % bs) or, with bs == 0, in a contiguous [n, kv_dim] tensor (encoders).
// Per flat row, `meta` holds (lo, hi, offset of the sequence's block table):
// the row sees keys lo..hi of its sequence; a sliding `window` (0: none)
// raises lo to hi - window.
//
// Two kernels share that metadata:
// - attention_rows_*: one block per (listed row, KV head); the heads of a
//   KV head share each key and value load. Keys are split over 4 warps in
//   tiles of 32 (lane = key for scores, lane = dimensions for values), each
//   warp with its own online softmax, merged at the end. Decode and short rows.
// - flash_f16_*: tiles of 64 query rows of one sequence on tensor cores
//   (mma.sync m16n8k16, f16 operands, f32 accumulation), K/V tiles staged in
//   shared memory, online softmax in registers (in base 2). Prefill.
//
// Both write f32 outputs and, when `half` is given, a 16-bit copy (bf16 when
// `bf16`, else f16) for the GEMM that reads them next.

#define ROW_WARPS 4
#define MAX_GROUP 8   // query heads per KV head
#define MAX_HD 256

__device__ __forceinline__ u32 row_lo(const u32* meta, u32 r, u32 window) {
    u32 lo = step_input(meta, 3 * r);
    const u32 hi = step_input(meta, 3 * r + 1);
    if (window && hi > window && hi - window > lo) lo = hi - window;
    return lo;
}

__device__ __forceinline__ u64 key_slot(const u32* tables, u32 toff, u32 bs, u32 t) {
    return bs ? (u64)tables[toff + t / bs] * bs + t % bs : (u64)t;
}

// The same with shifts when bs is a power of two (`shift` = log2 bs, else -1).
__device__ __forceinline__ u64 key_slot2(const u32* tables, u32 toff, u32 bs, int shift, u32 t) {
    if (shift >= 0) return bs ? ((u64)tables[toff + (t >> shift)] << shift) + (t & (bs - 1)) : (u64)t;
    return key_slot(tables, toff, bs, t);
}

__device__ __forceinline__ void store_out(float* out, u16* half, int bf16, u64 at, float v) {
    out[at] = v;
    if (half) half[at] = f32_to_half(v, bf16);
}

__device__ __forceinline__ float warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// Eight consecutive cached values: raw, then as f32.
__device__ __forceinline__ uint4 raw8(const u16* p) { return *(const uint4*)p; }
__device__ __forceinline__ void unpack8(uint4 v, float* f) {
    const u32 w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int i = 0; i < 4; i++) {
        f[2 * i] = f16_to_f32((u16)(w[i] & 0xffffu));
        f[2 * i + 1] = f16_to_f32((u16)(w[i] >> 16));
    }
}
__device__ __forceinline__ void load8(const u16* p, float* f) { unpack8(raw8(p), f); }
__device__ __forceinline__ void load8(const float* p, float* f) {
    const float4 a = *(const float4*)p, b = *(const float4*)(p + 4);
    f[0] = a.x; f[1] = a.y; f[2] = a.z; f[3] = a.w;
    f[4] = b.x; f[5] = b.y; f[6] = b.z; f[7] = b.w;
}

// This lane's `n` (of at most PER) value dimensions of one cached row, zeros after.
template <int PER, typename KT>
__device__ __forceinline__ void load_values(const KT* vc, u64 at, int n, float* v) {
#pragma unroll
    for (int i = 0; i < PER; i++) v[i] = i < n ? load_kv(vc, at + i) : 0.f;
}

// The block's output (query heads kvh G .. of the row, just stored to
// `out`) as the output projection's quantized input, where `x8` asks
// (host: kv.rs `AttnX8`, which checks that they are whole groups).
__device__ __forceinline__ void quantize_heads(const float* out, u32 row, u32 kvh, u32 G, u32 n_heads, u32 hd,
                                               X8Out x8) {
    if (!x8.xq) return;
    __syncthreads();  // every thread's stores to `out` visible to the block
    const u64 base = (u64)row * n_heads * hd + (u64)kvh * G * hd;
    quantize_span(out, base, G * hd, x8, threadIdx.x >> 5, blockDim.x >> 5);
}

// Split-K: the last of a (row, KV head)'s `parts` splits that hold keys
// merges their partials of its G heads (a kernel of its own cost a launch
// per layer and step). `done` counts finished splits per (row, KV head)
// block and is left at zero for the next launch (CUDA graph replays
// included). The merge reads every split's max and sum at once, then every
// output's partials at once: two rounds through L2, whatever G (merging
// head after head cost three rounds a head, most of batch-1 attention at
// short contexts). At most MAX_SPLITS splits (host).
#define MAX_SPLITS 64
__device__ void merge_if_last(const float* part, float* out, u32* done, u32 row, u32 kvh, u32 G, u32 n_heads,
                              u32 hd, u16* half, int bf16, u32 parts, X8Out x8) {
    __shared__ bool last;
    __shared__ float wt[MAX_GROUP][MAX_SPLITS], mx[MAX_GROUP], den[MAX_GROUP];
    // This block's partials, visible to the block that merges them.
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) {
        u32* c = done + blockIdx.x * gridDim.y + blockIdx.y;
        last = atomicAdd(c, 1u) == parts - 1;
        if (last) *c = 0;
    }
    __syncthreads();
    if (!last) return;
    __threadfence();
    const u32 nsplit = gridDim.z;
    // Head g's split z at p + (g * nsplit + z) * (hd + 2); other blocks'
    // writes are read through L2 (__ldcg), never a stale L1 line. Each
    // thread holds up to PAIRS (head, split) maxes and sums (blockDim.x is
    // 32 * ROW_WARPS in both row kernels).
    const float* p = part + ((u64)blockIdx.x * n_heads + kvh * G) * nsplit * (hd + 2);
    constexpr int PAIRS = MAX_GROUP * MAX_SPLITS / (32 * ROW_WARPS);
    float m[PAIRS], l[PAIRS];
#pragma unroll
    for (int j = 0; j < PAIRS; j++) {
        const u32 i = threadIdx.x + j * blockDim.x, g = i / parts, z = i % parts;
        if (i >= G * parts) break;
        const float* ps = p + ((u64)g * nsplit + z) * (hd + 2) + hd;
        m[j] = __ldcg(ps), l[j] = __ldcg(ps + 1);
        wt[g][z] = m[j];
    }
    __syncthreads();
    if (threadIdx.x < G) {
        float v = -INFINITY;
        for (u32 z = 0; z < parts; z++) v = fmaxf(v, wt[threadIdx.x][z]);
        mx[threadIdx.x] = v;
    }
    __syncthreads();
#pragma unroll
    for (int j = 0; j < PAIRS; j++) {
        const u32 i = threadIdx.x + j * blockDim.x, g = i / parts, z = i % parts;
        if (i >= G * parts) break;
        wt[g][z] = m[j] == -INFINITY ? 0.f : expf(m[j] - mx[g]) * l[j];
    }
    __syncthreads();
    if (threadIdx.x < G) {
        float d = 0.f;
        for (u32 z = 0; z < parts; z++) d += wt[threadIdx.x][z];
        den[threadIdx.x] = d;
    }
    __syncthreads();
    for (u32 i = threadIdx.x; i < G * hd; i += blockDim.x) {
        const u32 g = i / hd, d = i % hd;
        const float* pg = p + (u64)g * nsplit * (hd + 2) + d;
        float num = 0.f;
#pragma unroll 8
        for (u32 z = 0; z < parts; z++) num += wt[g][z] * __ldcg(pg + (u64)z * (hd + 2));
        store_out(out, half, bf16, (u64)row * n_heads * hd + (u64)(kvh * G + g) * hd + d, num / den[g]);
    }
    quantize_heads(out, row, kvh, G, n_heads, hd, x8);
}

// With `split` > 0, narrows [lo, hi) to this block's share of its row's
// keys (gridDim.z shares, each a multiple of `split` keys) and sets `parts`
// to the number of shares that hold keys (1: this block writes the output
// itself). False when the share is empty: the block has nothing to do (a
// row without keys runs its first block, as an unsplit launch would).
__device__ bool split_share(u32& lo, u32& hi, u32 split, u32& parts) {
    parts = 1;
    if (!split) return true;
    const u32 len = hi > lo ? hi - lo : 0;
    const u32 per = ((len + gridDim.z - 1) / gridDim.z + split - 1) / split * split;
    parts = per ? (len + per - 1) / per : 1;  // per == 0: no keys
    lo += blockIdx.z * per;
    hi = min(hi, lo + per);
    return lo < hi || (len == 0 && blockIdx.z == 0);
}

// Merges the block's ROW_WARPS online softmaxes (per warp and head: max in
// natural-log units, sum, unnormalized output) into the row's output, or
// into this split's partial (then the last split merges).
template <int GM, int HDM>
__device__ void combine_warps(const float (*wm)[GM], const float (*wl)[GM], const float (*wacc)[GM][HDM], u32 G,
                              u32 hd, u32 row, u32 kvh, u32 n_heads, u32 parts, float* part, u32* done, float* out,
                              u16* half, int bf16, X8Out x8) {
    for (u32 i = threadIdx.x; i < G * hd; i += blockDim.x) {
        const u32 g = i / hd, d = i % hd;
        float mx = -INFINITY;
        for (int w = 0; w < ROW_WARPS; w++) mx = fmaxf(mx, wm[w][g]);
        float num = 0.f, den = 0.f;
        for (int w = 0; w < ROW_WARPS; w++) {
            const float wt = wm[w][g] == -INFINITY ? 0.f : expf(wm[w][g] - mx);
            num += wt * wacc[w][g][d];
            den += wt * wl[w][g];
        }
        if (parts > 1) {
            const u64 at = (((u64)blockIdx.x * n_heads + kvh * G + g) * gridDim.z + blockIdx.z) * (hd + 2);
            part[at + d] = den > 0.f ? num / den : 0.f;
            if (d == 0) {
                part[at + hd] = mx;
                part[at + hd + 1] = den;
            }
        } else {
            store_out(out, half, bf16, (u64)row * n_heads * hd + (u64)(kvh * G + g) * hd + d, num / den);
        }
    }
    trace_mark("attn.out");
    if (parts > 1) merge_if_last(part, out, done, row, kvh, G, n_heads, hd, half, bf16, parts, x8);
    else quantize_heads(out, row, kvh, G, n_heads, hd, x8);
    trace_mark("attn.end");
}

// Split-K (flash decoding): with `split` > 0, block z of gridDim.z takes the
// z-th share of its row's keys (shares a multiple of `split` keys, so that the
// split depends on the row alone) and writes its normalized partial
// output with its running max and sum (hd + 2 floats per row, head and
// split) to `part`; the last split to finish merges them (`merge_if_last`).
// Long contexts with few rows then use the whole GPU instead of a few blocks;
// a row whose keys fit one share (a decode graph's splits are fixed for any
// length) has its first block write the output and the others do nothing.
//
// acc[g] += p_kk[g] * V[kk] over the tile's nk keys (key kk's row at lane
// kk's `base`). f16 heads of 4 values a lane (hd 128): VALUE_BATCH keys'
// values are loaded at once, so their latencies overlap; other shapes one key
// at a time, the next key's values loading while this one's are used.
#define VALUE_BATCH 8
template <int GM, int PER, typename KT>
__device__ __forceinline__ void weigh_values(const KT* vc, u64 base, const float (&p)[GM], float (&acc)[GM][PER],
                                             u32 nk, u32 per, int n_in, u32 G, u32 lane) {
    if (sizeof(KT) == 2 && PER >= 4 && per == 4 && n_in == 4) {
        const u16* v16 = (const u16*)vc;
        for (u32 k0 = 0; k0 < nk; k0 += VALUE_BATCH) {
            uint2 raw[VALUE_BATCH];
#pragma unroll
            for (int j = 0; j < VALUE_BATCH; j++) {
                const u64 vb = __shfl_sync(0xffffffffu, base, (k0 + j) & 31) + lane * 4;
                raw[j] = k0 + j < nk ? *(const uint2*)(v16 + vb) : make_uint2(0u, 0u);
            }
#pragma unroll
            for (int j = 0; j < VALUE_BATCH; j++) {
                if (k0 + j >= nk) break;
                const float v[4] = {f16_to_f32((u16)(raw[j].x & 0xffffu)), f16_to_f32((u16)(raw[j].x >> 16)),
                                    f16_to_f32((u16)(raw[j].y & 0xffffu)), f16_to_f32((u16)(raw[j].y >> 16))};
#pragma unroll
                for (int g = 0; g < GM; g++) {
                    if (g >= G) break;
                    const float pk = __shfl_sync(0xffffffffu, p[g], k0 + j);
#pragma unroll
                    for (int i = 0; i < 4; i++) acc[g][i] += pk * v[i];
                }
            }
        }
        return;
    }
    float next[PER];
    load_values<PER>(vc, __shfl_sync(0xffffffffu, base, 0) + lane * per, n_in, next);
    for (u32 kk = 0; kk < nk; kk++) {
        float v[PER];
#pragma unroll
        for (int i = 0; i < PER; i++) v[i] = next[i];
        if (kk + 1 < nk) load_values<PER>(vc, __shfl_sync(0xffffffffu, base, kk + 1) + lane * per, n_in, next);
#pragma unroll
        for (int g = 0; g < GM; g++) {
            if (g >= G) break;
            const float pk = __shfl_sync(0xffffffffu, p[g], kk);
#pragma unroll
            for (int i = 0; i < PER; i++) acc[g][i] += pk * v[i];
        }
    }
}

// One block per (listed row, KV head, split). GM and PER bound the query
// heads per KV head and the value dimensions per lane (hd <= 32 * PER): the
// small instance keeps its accumulators in few registers, so a key's loads
// all go out at once.
template <int GM, int PER, typename KT>
__device__ void attend_rows(const float* q, const KT* kc, const KT* vc, float* out, const u32* meta,
                            const u32* tables, const u32* rows, u32 n_heads, u32 n_kv_heads, u32 hd, u32 bs,
                            u32 window, float scale, float softcap, u32 split, float* part, u32* done, u16* half,
                            int bf16, X8Out x8) {
    constexpr int HDM = 32 * PER;
    const u32 row = rows[blockIdx.x], kvh = blockIdx.y;
    const u32 G = n_heads / n_kv_heads;
    const u32 toff = meta[3 * row + 2];
    u32 hi = meta[3 * row + 1], lo = row_lo(meta, row, window);
    u32 parts;
    if (!split_share(lo, hi, split, parts)) return;
    const u64 kv_dim = (u64)n_kv_heads * hd;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const u32 per = (hd + 31) / 32;  // value dimensions per lane
    const int shift = bs && !(bs & (bs - 1)) ? __ffs(bs) - 1 : -1;
    __shared__ float qs[GM][HDM];
    __shared__ float wm[ROW_WARPS][GM], wl[ROW_WARPS][GM];
    __shared__ float wacc[ROW_WARPS][GM][HDM];
    // f16 heads of 128 in the small instance: each warp's key tile (one
    // 16-byte pad a row keeps the lanes' row reads off each other's banks).
    constexpr bool STAGE = sizeof(KT) == 2 && PER == 4;
    __shared__ uint4 ks[STAGE ? ROW_WARPS : 1][STAGE ? 32 : 1][17];
    for (u32 i = threadIdx.x; i < G * hd; i += blockDim.x) {
        const u32 g = i / hd, d = i % hd;
        qs[g][d] = q[(u64)row * n_heads * hd + (u64)(kvh * G + g) * hd + d] * scale;
    }
    __syncthreads();
    float m[GM], l[GM], acc[GM][PER];
#pragma unroll
    for (int g = 0; g < GM; g++) {
        m[g] = -INFINITY;
        l[g] = 0.f;
#pragma unroll
        for (int i = 0; i < PER; i++) acc[g][i] = 0.f;
    }
    for (u32 t0 = lo + 32 * warp; t0 < hi; t0 += 32 * ROW_WARPS) {
        const u32 t = t0 + lane;
        const bool valid = t < hi;
        const u32 nk = min(32u, hi - t0);
        float s[GM];
#pragma unroll
        for (int g = 0; g < GM; g++) s[g] = 0.f;
        u64 base = 0;
        if (valid) base = key_slot2(tables, toff, bs, shift, t) * kv_dim + (u64)kvh * hd;
        if (STAGE && hd == 128) {
            // The warp's 32 f16 keys staged through shared memory: each load
            // takes two whole keys (coalesced), where a lane loading its own
            // key touched 32 lines per load. Then lane = key as before.
            __syncwarp();
#pragma unroll
            for (int c = 0; c < 16; c++) {
                const u32 kk = 2 * c + (lane >> 4);
                const u64 kb = __shfl_sync(0xffffffffu, base, kk);
                ks[warp][kk][lane & 15] = kk < nk ? raw8((const u16*)kc + kb + 8 * (lane & 15)) : make_uint4(0u, 0u, 0u, 0u);
            }
            __syncwarp();
            if (valid) {
#pragma unroll
                for (int c = 0; c < 16; c++) {
                    float k8[8];
                    unpack8(ks[warp][lane][c], k8);
#pragma unroll
                    for (int g = 0; g < GM; g++) {
                        if (g < G) {
#pragma unroll
                            for (int e = 0; e < 8; e++) s[g] += qs[g][8 * c + e] * k8[e];
                        }
                    }
                }
            }
        } else if (valid) {
            // Unrolled: the key's loads go out together, not one latency each.
#pragma unroll 4
            for (u32 d = 0; d < hd; d += 8) {
                float k8[8];
                load8(kc + base + d, k8);
#pragma unroll
                for (int g = 0; g < GM; g++) {
                    if (g < G) {
#pragma unroll
                        for (int e = 0; e < 8; e++) s[g] += qs[g][d + e] * k8[e];
                    }
                }
            }
        }
        float p[GM];
#pragma unroll
        for (int g = 0; g < GM; g++) {
            p[g] = 0.f;
            if (g >= G) continue;
            float sg = s[g];
            if (softcap > 0.f) sg = softcap * tanhf(sg / softcap);
            sg = valid ? sg : -INFINITY;
            const float mn = fmaxf(m[g], warp_max(sg));
            const float corr = expf(m[g] - mn);
            p[g] = valid ? expf(sg - mn) : 0.f;
            l[g] = l[g] * corr + warp_sum(p[g]);
            m[g] = mn;
#pragma unroll
            for (int i = 0; i < PER; i++) acc[g][i] *= corr;
        }
        // Key kk's row start comes from the lane that scored it (no second
        // table lookup).
        const int n_in = min((int)per, (int)hd - (int)(lane * per));
        weigh_values<GM, PER>(vc, base, p, acc, nk, per, n_in, G, lane);
    }
    // Constant indices only: a runtime index would put acc in local memory.
#pragma unroll
    for (int g = 0; g < GM; g++) {
        if (g >= G) break;
        if (lane == 0) {
            wm[warp][g] = m[g];
            wl[warp][g] = l[g];
        }
#pragma unroll
        for (int i = 0; i < PER; i++)
            if (i < per && lane * per + i < hd) wacc[warp][g][lane * per + i] = acc[g][i];
    }
    __syncthreads();
    combine_warps<GM, HDM>(wm, wl, wacc, G, hd, row, kvh, n_heads, parts, part, done, out, half, bf16, x8);
}

#define ROWS_KERNEL(NAME, GM, PER, KT)                                                                           \
    extern "C" __global__ void __launch_bounds__(32 * ROW_WARPS, 4)                                               \
        NAME(const float* q, const KT* kc, const KT* vc, float* out, const u32* meta, const u32* tables,          \
             const u32* rows, u32 n_heads, u32 n_kv_heads, u32 hd, u32 bs, u32 window, float scale, float softcap,    \
             u32 split, float* part, u32* done, u16* half, int bf16, signed char* x8q, u32* x8m, int x8o) {           \
        pdl_trigger();                                                                                            \
        pdl_wait();                                                                                               \
        attend_rows<GM, PER, KT>(q, kc, vc, out, meta, tables, rows, n_heads, n_kv_heads, hd, bs, window, scale,  \
                                 softcap, split, part, done, half, bf16, X8Out{x8q, x8m, x8o});                   \
    }
ROWS_KERNEL(attention_rows_f32, MAX_GROUP, MAX_HD / 32, float)
ROWS_KERNEL(attention_rows_f16, MAX_GROUP, MAX_HD / 32, u16)
// Heads of up to 128 with up to 4 query heads per KV head (Llama 3 8B and 70B, Qwen, SmolLM2).
ROWS_KERNEL(attention_rows_f32_small, 4, 4, float)
ROWS_KERNEL(attention_rows_f16_small, 4, 4, u16)

// ---------------------------------------------------------------- flash (prefill)

#define FA_ROWS 64  // 4 warps x 16 rows

// 16 bytes global -> shared without registers; zeros when !in.
__device__ __forceinline__ void cp_async16(void* smem, const void* gmem, bool in) {
    const u32 dst = (u32)__cvta_generic_to_shared(smem);
    const int n = in ? 16 : 0;
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst), "l"(gmem), "r"(n));
}

__device__ __forceinline__ u32 pack_f16(float a, float b) {
    return (u32)f32_to_f16(a) | ((u32)f32_to_f16(b) << 16);
}

#define LOG2E 1.4426950408889634f
#define LN2 0.6931471805599453f

// 2^x in one instruction (exp2f also scales results below 2^-126 back from
// denormals, which cost a softmax ~10 instructions an element); 2^-inf = 0.
__device__ __forceinline__ float fast_exp2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

// Two adjacent outputs (an even index): one 8-byte store, and one 4-byte
// store of their 16-bit copy. A null `out` writes the copy alone (prefill,
// where only the output projection's GEMM reads it: `CudaTensor`).
__device__ __forceinline__ void store_pair(float* out, u16* half, int bf16, u64 at, float a, float b) {
    if (out) *(float2*)(out + at) = make_float2(a, b);
    if (half) *(u32*)(half + at) = (u32)f32_to_half(a, bf16) | ((u32)f32_to_half(b, bf16) << 16);
}

// Not volatile: registers in and out only, so the compiler may interleave
// independent MMAs (volatile asm keeps its order, one dependent chain at a time).
__device__ __forceinline__ void mma_f16(float* c, const u32* a, u32 b0, u32 b1) {
    asm(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Lane layout of m16n8k16: g = lane / 4 picks rows g and g + 8 (A, C) or
// column g (B); t = lane % 4 picks the pairs of k (or C columns) 2t, 2t+1 and
// 2t+8, 2t+9.
//
// Blocks take (tile, head) pairs in the order of the host's tile list, the
// heads of a tile next to each other (they share its keys through L2); the
// host lists the tiles with the most keys first, so that the last blocks to
// run are short ones. KEYS keys (a multiple of 32) are staged a barrier and
// scored in sub-tiles of 32 (the registers of a 32-key tile). Each thread
// stages the same column chunk of KEYS * HD / 8 / 128 keys, whose
// block-table entries it loads a tile ahead (`tb`), so no warp waits on them
// (this and the order: prefill 8 x 2,048 +2-3%).
//
// WG (sm_90a): the scores and the outputs on wgmma, which reads K and V from
// shared memory: each key's 64-dimension halves are 128-byte rows (half h
// of key j at (h * KEYS + j) * 128 bytes), 128-byte swizzled, which serve
// both as K-major keys and as N-major values. The whole warpgroup computes
// every sub-tile any of its rows sees (rows that see none of it mask it);
// the output wgmmas of a tile are waited for at the next one's start.
template <int HD, int KEYS, bool WG>
__device__ void flash_body(const float* q, const u16* kc, const u16* vc, float* out, const u32* meta,
                           const u32* tables, const u32* tiles, u32 n_heads, u32 n_kv_heads, u32 bs, u32 window,
                           float scale, float softcap, u16* half, int bf16, const u16* qh) {
    constexpr int CH = HD / 8;               // 16-byte chunks per key
    constexpr int PASS_KEYS = 128 / CH;      // keys one pass of the block stages
    constexpr int PASSES = KEYS / PASS_KEYS; // passes per tile (table entries a thread keeps)
    constexpr int STRIDE = HD + 8;           // u16 per staged key (padding: no bank conflicts)
    constexpr int BUF = WG ? KEYS * HD : KEYS * STRIDE; // u16 per buffer
    constexpr int SUB = 32;                  // keys scored at once (wgmma: n = 32)
    constexpr int NB = SUB / 8;              // their 8-key score fragments
    extern __shared__ __align__(1024) u16 fa_smem[];
    u16* Ks = fa_smem;                       // [2][KEYS][STRIDE], WG: [2][CH][KEYS][8]
    u16* Vs = fa_smem + 2 * KEYS * STRIDE;   // the same
    const u32 head = blockIdx.x % n_heads, tile = blockIdx.x / n_heads;
    const u32 row0 = tiles[2 * tile], nrows = tiles[2 * tile + 1];
    const u32 kvh = head / (n_heads / n_kv_heads);
    const u64 kv_dim = (u64)n_kv_heads * HD, q_stride = (u64)n_heads * HD;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const u32 toff = meta[3 * row0 + 2];
    const int shift = bs && !(bs & (bs - 1)) ? __ffs(bs) - 1 : -1;
    const u32 klo = row_lo(meta, row0, window), khi = meta[3 * (row0 + nrows - 1) + 1];
    // This warp's two rows per lane, and what each sees.
    const u32 ra = warp * 16 + g, rb = ra + 8;
    const bool va = ra < nrows, vb = rb < nrows;
    const u32 lo_a = va ? row_lo(meta, row0 + ra, window) : 0xffffffffu, hi_a = va ? meta[3 * (row0 + ra) + 1] : 0;
    const u32 lo_b = vb ? row_lo(meta, row0 + rb, window) : 0xffffffffu, hi_b = vb ? meta[3 * (row0 + rb) + 1] : 0;
    const u64 qa = (u64)(row0 + ra) * q_stride + (u64)head * HD;
    const u64 qb = (u64)(row0 + rb) * q_stride + (u64)head * HD;
    // Scores in base 2 (exp2 is one instruction): log2(e) goes into q's
    // scale, or after the soft cap's tanh when there is one. q is f32, or
    // bf16 where `qh` is given (prefill: only its bf16 copy was written).
    const float qs = softcap > 0.f ? scale : scale * LOG2E;
    // q[at], q[at + 1] (at even) scaled, as an f16 pair.
    auto q2 = [&](u64 at) {
        if (qh) {
            const u32 w = *(const u32*)(qh + at);
            return pack_f16(__uint_as_float(w << 16) * qs, __uint_as_float(w & 0xffff0000u) * qs);
        }
        const float2 f = *(const float2*)(q + at);
        return pack_f16(f.x * qs, f.y * qs);
    };
    u32 qf[HD / 16][4];
#pragma unroll
    for (int ks = 0; ks < HD / 16; ks++) {
        const int d = ks * 16 + 2 * t;
        qf[ks][0] = va ? q2(qa + d) : 0u;
        qf[ks][1] = vb ? q2(qb + d) : 0u;
        qf[ks][2] = va ? q2(qa + d + 8) : 0u;
        qf[ks][3] = vb ? q2(qb + d + 8) : 0u;
    }
    float o[HD / 8][4];
#pragma unroll
    for (int n = 0; n < HD / 8; n++) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f;
    float m_a = -INFINITY, m_b = -INFINITY, l_a = 0.f, l_b = 0.f;
    // Keys any of this warp's rows can see: the same for all its lanes, so
    // skipping a tile never splits the warp before its shuffles.
    u32 w_lo = min(lo_a, lo_b), w_hi = max(hi_a, hi_b);
    // Keys every row of the warp sees: tiles inside need no mask. A row past
    // the tile's end (lo max, hi 0) empties it, so those tiles are masked.
    u32 in_lo = max(lo_a, lo_b), in_hi = min(hi_a, hi_b);
    for (int o = 16; o > 0; o >>= 1) {
        w_lo = min(w_lo, __shfl_xor_sync(0xffffffffu, w_lo, o));
        w_hi = max(w_hi, __shfl_xor_sync(0xffffffffu, w_hi, o));
        in_lo = max(in_lo, __shfl_xor_sync(0xffffffffu, in_lo, o));
        in_hi = min(in_hi, __shfl_xor_sync(0xffffffffu, in_hi, o));
    }
    // This thread's chunk of each key it stages: key my_key + p * PASS_KEYS of a tile.
    const u32 my_key = threadIdx.x / CH, my_ch = threadIdx.x % CH;
    // Block-table entries of this thread's keys of the tile at key j0 (bs > 0).
    u32 tb[PASSES];
    auto fetch = [&](u32 j0) {
#pragma unroll
        for (int p = 0; p < PASSES; p++) {
            const u32 j = min(j0 + my_key + p * PASS_KEYS, khi - 1);
            tb[p] = bs ? tables[toff + (shift >= 0 ? j >> shift : j / bs)] : 0u;
        }
    };
    // Stages the K/V tile at key j0 (its entries in tb) into buffer `buf`;
    // keys past khi read as zeros.
    // (Slots and the row offset in 32 bits, one wide multiply a key: the
    // staging's address arithmetic is a large share of the loop's instructions.)
    const u32 kv_dim32 = n_kv_heads * HD;
    const u64 kv_off = (u64)kvh * HD + my_ch * 8;
    auto stage = [&](u32 j0, int buf) {
#pragma unroll
        for (int p = 0; p < PASSES; p++) {
            const u32 kj = my_key + p * PASS_KEYS, j = j0 + kj;
            const bool in = j < khi;
            const u32 slot = !bs ? j : shift >= 0 ? (tb[p] << shift) + (j & (bs - 1)) : tb[p] * bs + j % bs;
            const u64 base = in ? (u64)slot * kv_dim32 + kv_off : 0;
            const u32 at = WG ? buf * BUF + ((my_ch >> 3) * KEYS + kj) * 64 + (((my_ch & 7) ^ (kj & 7)) * 8)
                              : (buf * KEYS + kj) * STRIDE + my_ch * 8;
            cp_async16(Ks + at, kc + base, in);
            cp_async16(Vs + at, vc + base, in);
        }
        asm volatile("cp.async.commit_group;");
    };
    fetch(klo);
    stage(klo, 0);
    fetch(klo + KEYS);
    int buf = 0;
    for (u32 j0 = klo; j0 < khi; j0 += KEYS, buf ^= 1) {
        if (WG) {
            // The last tile's output wgmmas read the buffer staged next.
            wg_wait();
            wg_keep(o);
        }
        if (j0 + KEYS < khi) {
            stage(j0 + KEYS, buf ^ 1);
            fetch(j0 + 2 * KEYS);
        } else {
            asm volatile("cp.async.commit_group;");
        }
        asm volatile("cp.async.wait_group 1;");
        // wgmma reads shared memory through the async proxy.
        if (WG) wg_proxy_fence();
        __syncthreads();
        // Every warp reaches the barrier below, working or not.
#pragma unroll
        for (int sub = 0; sub < KEYS / SUB; sub++) {
            const u32 s0 = j0 + sub * SUB;
            if (WG ? s0 >= khi : !(s0 < w_hi && s0 + SUB > w_lo)) continue;
            const u32 sub_at = WG ? sub * SUB * 64 : sub * SUB * STRIDE;
            const u16* Kt = Ks + buf * BUF + sub_at;
            const u16* Vt = Vs + buf * BUF + sub_at;
            float s[NB][4];
#pragma unroll
            for (int n = 0; n < NB; n++) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.f;
            if (WG) {
                // K-major keys: the next 8 keys 1,024 bytes on, k-steps 32 bytes
                // apart in a row, the second 64 dimensions KEYS * 128 bytes on.
                wg_fence();
#pragma unroll
                for (int ks = 0; ks < HD / 16; ks++) {
                    const u64 d = wg_desc(Kt + (ks >> 2) * KEYS * 64 + (ks & 3) * 16, 16, 1024);
                    wgmma_n32(s, qf[ks], d, ks > 0);
                }
                wg_commit();
                wg_wait();
                wg_keep(s);
            }
            // k-steps outside, key groups inside: consecutive MMAs are independent.
#pragma unroll
            for (int ks = 0; ks < (WG ? 0 : HD / 16); ks += 2) {
                u32 b[4][4];
#pragma unroll
                for (int n = 0; n < 4; n++) {
                    // ldmatrix: lanes 8i..8i+7 address keys n*8.. at column (ks*16 + 8i):
                    // B fragments (b0, b1) of k-steps ks and ks + 1.
                    const u32 addr = (u32)__cvta_generic_to_shared(Kt + (n * 8 + (lane & 7)) * STRIDE + ks * 16 + (lane >> 3) * 8);
                    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                                 : "=r"(b[n][0]), "=r"(b[n][1]), "=r"(b[n][2]), "=r"(b[n][3])
                                 : "r"(addr));
                }
#pragma unroll
                for (int n = 0; n < 4; n++) mma_f16(s[n], qf[ks], b[n][0], b[n][1]);
#pragma unroll
                for (int n = 0; n < 4; n++) mma_f16(s[n], qf[ks + 1], b[n][2], b[n][3]);
            }
            if (softcap > 0.f) {
#pragma unroll
                for (int n = 0; n < NB; n++)
#pragma unroll
                    for (int i = 0; i < 4; i++) s[n][i] = softcap * tanhf(s[n][i] / softcap) * LOG2E;
            }
            if (s0 < in_lo || s0 + SUB > in_hi) {
#pragma unroll
                for (int n = 0; n < NB; n++) {
#pragma unroll
                    for (int i = 0; i < 4; i++) {
                        const u32 key = s0 + n * 8 + 2 * t + (i & 1);
                        const bool ok = i < 2 ? (key >= lo_a && key < hi_a) : (key >= lo_b && key < hi_b);
                        if (!ok) s[n][i] = -INFINITY;
                    }
                }
            }
            float mx_a = -INFINITY, mx_b = -INFINITY;
#pragma unroll
            for (int n = 0; n < NB; n++) {
                mx_a = fmaxf(mx_a, fmaxf(s[n][0], s[n][1]));
                mx_b = fmaxf(mx_b, fmaxf(s[n][2], s[n][3]));
            }
            mx_a = fmaxf(mx_a, __shfl_xor_sync(0xffffffffu, mx_a, 1));
            mx_a = fmaxf(mx_a, __shfl_xor_sync(0xffffffffu, mx_a, 2));
            mx_b = fmaxf(mx_b, __shfl_xor_sync(0xffffffffu, mx_b, 1));
            mx_b = fmaxf(mx_b, __shfl_xor_sync(0xffffffffu, mx_b, 2));
            const float nm_a = fmaxf(m_a, mx_a), nm_b = fmaxf(m_b, mx_b);
            const float c_a = nm_a == -INFINITY ? 1.f : fast_exp2(m_a - nm_a);
            const float c_b = nm_b == -INFINITY ? 1.f : fast_exp2(m_b - nm_b);
            // A row that has seen no key subtracts 0 (its scores are all -inf).
            const float sub_a = nm_a == -INFINITY ? 0.f : nm_a, sub_b = nm_b == -INFINITY ? 0.f : nm_b;
            // A max rarely moves once a row has seen many keys: skip the
            // rescale when it moved for no row of the warp.
            const bool rescale = __any_sync(0xffffffffu, c_a != 1.f || c_b != 1.f);
            float sum_a = 0.f, sum_b = 0.f;
#pragma unroll
            for (int n = 0; n < NB; n++) {
#pragma unroll
                for (int i = 0; i < 4; i++) {
                    const float p = fast_exp2(s[n][i] - (i < 2 ? sub_a : sub_b));
                    s[n][i] = p;
                    if (i < 2) sum_a += p;
                    else sum_b += p;
                }
            }
            sum_a += __shfl_xor_sync(0xffffffffu, sum_a, 1);
            sum_a += __shfl_xor_sync(0xffffffffu, sum_a, 2);
            sum_b += __shfl_xor_sync(0xffffffffu, sum_b, 1);
            sum_b += __shfl_xor_sync(0xffffffffu, sum_b, 2);
            l_a = l_a * c_a + sum_a;
            l_b = l_b * c_b + sum_b;
            m_a = nm_a;
            m_b = nm_b;
            if (rescale) {
#pragma unroll
                for (int n = 0; n < HD / 8; n++) {
                    o[n][0] *= c_a;
                    o[n][1] *= c_a;
                    o[n][2] *= c_b;
                    o[n][3] *= c_b;
                }
            }
            if (WG) {
                // N-major values: the next 64 dimensions KEYS * 128 bytes on, the
                // next 8 keys 1,024.
                u32 a[SUB / 16][4];
#pragma unroll
                for (int kk = 0; kk < SUB / 16; kk++) {
                    a[kk][0] = pack_f16(s[2 * kk][0], s[2 * kk][1]);
                    a[kk][1] = pack_f16(s[2 * kk][2], s[2 * kk][3]);
                    a[kk][2] = pack_f16(s[2 * kk + 1][0], s[2 * kk + 1][1]);
                    a[kk][3] = pack_f16(s[2 * kk + 1][2], s[2 * kk + 1][3]);
                }
                wg_fence();
#pragma unroll
                for (int kk = 0; kk < SUB / 16; kk++) {
                    const u64 d = wg_desc(Vt + kk * 16 * 64, KEYS * 128, 1024);
                    if constexpr (HD == 128) wgmma_n128_t(o, a[kk], d, 1);
                    else wgmma_n64_t(o, a[kk], d, 1);
                }
                wg_commit();
            }
#pragma unroll
            for (int kk = 0; kk < (WG ? 0 : 2); kk++) {
                u32 a[4];
                a[0] = pack_f16(s[2 * kk][0], s[2 * kk][1]);
                a[1] = pack_f16(s[2 * kk][2], s[2 * kk][3]);
                a[2] = pack_f16(s[2 * kk + 1][0], s[2 * kk + 1][1]);
                a[3] = pack_f16(s[2 * kk + 1][2], s[2 * kk + 1][3]);
                // ldmatrix.trans: lanes 0-15 address keys kk*16 + (lane % 16) at
                // columns n*8 (matrices 0, 1) and lanes 16-31 the same keys at
                // columns n*8 + 8 (matrices 2, 3): B fragments of two n-tiles.
                const int key = kk * 16 + (lane & 15);
#pragma unroll
                for (int n = 0; n < HD / 8; n += 2) {
                    const u32 addr = (u32)__cvta_generic_to_shared(Vt + key * STRIDE + n * 8 + (lane >> 4) * 8);
                    u32 b0, b1, b2, b3;
                    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
                                 : "=r"(b0), "=r"(b1), "=r"(b2), "=r"(b3)
                                 : "r"(addr));
                    mma_f16(o[n], a, b0, b1);
                    mma_f16(o[n + 1], a, b2, b3);
                }
            }
        }
        // The next iteration's stage() overwrites the other buffer only; this
        // one is refilled two iterations on, after everyone is done with it.
        __syncthreads();
    }
    if (WG) {
        wg_wait();
        wg_keep(o);
    }
    asm volatile("cp.async.wait_group 0;");
    const u64 oa = (u64)(row0 + ra) * q_stride + (u64)head * HD, ob = (u64)(row0 + rb) * q_stride + (u64)head * HD;
    const float ia = 1.f / l_a, ib = 1.f / l_b;
#pragma unroll
    for (int n = 0; n < HD / 8; n++) {
        const int d = n * 8 + 2 * t;
        if (va) store_pair(out, half, bf16, oa + d, o[n][0] * ia, o[n][1] * ia);
        if (vb) store_pair(out, half, bf16, ob + d, o[n][2] * ib, o[n][3] * ib);
    }
}

// Dynamic shared memory: two buffers of K and V, KEYS keys of HD + 8 halves
// (`kv::flash_smem` on the host).
#define FLASH_KERNEL(NAME, HD, KEYS, MINB, WG)                                                                  \
    extern "C" __global__ void __launch_bounds__(128, MINB)                                                     \
        NAME(const float* q, const u16* kc, const u16* vc, float* out, const u32* meta, const u32* tables,      \
             const u32* tiles, u32 n_heads, u32 n_kv_heads, u32 bs, u32 window, float scale, float softcap,     \
             u16* half, int bf16, const u16* qh) {                                                              \
        if (WG && !FLASH_WG) __trap();                                                                          \
        pdl_trigger();                                                                                          \
        pdl_wait();                                                                                             \
        flash_body<HD, KEYS, WG>(q, kc, vc, out, meta, tables, tiles, n_heads, n_kv_heads, bs, window, scale,   \
                                 softcap, half, bf16, qh);                                                      \
    }
// hd 128 at three blocks an SM (at most 168 registers: attention 64 ms
// against 80 ms with two blocks, 68 ms with four, prefill 8 x 2,048 of
// Llama 3 8B). 64 keys a barrier (the same registers) measured no faster:
// prefill 40,105 and 39,841 tok/s against 40,048 and 40,149 with 32.
FLASH_KERNEL(flash_f16_64, 64, 32, 1, false)
FLASH_KERNEL(flash_f16_128, 128, 32, 3, false)
// wgmma (sm_90a): attention 39 ms against 58 on mma.sync (prefill 8 x
// 2,048, with the staging and exp2 of the same build); 64 keys a barrier
// measured the same (41,222 and 41,188 tok/s against 41,418 and 41,279).
FLASH_KERNEL(flash_wg_64, 64, 32, 1, true)
FLASH_KERNEL(flash_wg_128, 128, 32, 3, true)
