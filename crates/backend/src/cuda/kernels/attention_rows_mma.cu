// Appended to attention.cu (one module, compile.rs MODULES): it uses that
// file's helpers (metadata, splits, the warps' merge, the MMA wrappers).

// ---------------------------------------------------------------- rows on tensor cores (decode)
//
// attention_rows_mma_*: the row kernel's work (a block per listed row, KV
// head and split; the same metadata, splits and merge) on tensor cores, for
// f16 caches, heads of 64 or 128 and up to 8 query heads per KV head. It
// computes transposed, so that the query heads are the MMA's n = 8 side and
// no accumulator is wasted on padding rows: S^T = K Q^T (keys x heads), then
// O^T = V^T P^T (dims x heads), with movmatrix turning the scores'
// accumulator into P^T's operand in registers. Each warp streams its own
// tiles of 16 keys (every ROW_WARPS-th) through shared memory with cp.async.
#define RM_KEYS 16
#define RM_HEADS 8

__device__ __forceinline__ u32 movmatrix_trans(u32 x) {
    u32 y;
    asm volatile("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;" : "=r"(y) : "r"(x));
    return y;
}

__device__ __forceinline__ void ldmatrix_x4(u32* a, const u16* p) {
    const u32 addr = (u32)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(a[0]), "=r"(a[1]), "=r"(a[2]), "=r"(a[3])
                 : "r"(addr));
}

__device__ __forceinline__ void ldmatrix_x4_trans(u32* a, const u16* p) {
    const u32 addr = (u32)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(a[0]), "=r"(a[1]), "=r"(a[2]), "=r"(a[3])
                 : "r"(addr));
}

// Fragment layouts (m16n8k16; g = lane / 4, t = lane % 4): the scores'
// accumulator holds keys g and g + 8 of heads 2t and 2t + 1, the output's
// dims g and g + 8 (of each 16) of the same two heads, so a lane's running
// max and sum are those two heads'.
template <int HD>
__device__ void rows_mma_body(const float* q, const u16* kc, const u16* vc, float* out, const u32* meta,
                              const u32* tables, const u32* rows, u32 n_heads, u32 n_kv_heads, u32 bs, u32 window,
                              float scale, float softcap, u32 split, float* part, u32* done, u16* half, int bf16,
                              X8Out x8, int late) {
    constexpr int PAD = HD + 8;           // a 16-byte pad a row: ldmatrix's 8 rows on distinct banks
    constexpr int TILE = RM_KEYS * PAD;   // u16 of one K (or V) tile
    // Dynamic (host: kv::rows_mma_smem): per warp a ring of three tiles (K
    // or V), then (after the loop) the warps' outputs for the merge.
    // The kernel after it may start now, or with `late` once the keys are
    // read: the output projection's GEMV, started early, loads all its
    // weights before its wait, and those loads then no longer queue ahead of
    // this kernel's (random Llama-3.1-8B Q4_K_M batch 1 on the H200: +0.5%).
    if (!late) pdl_trigger();
    // The step's metadata and block table are the host's (no kernel writes
    // them): read before waiting for the kernel before, which writes q and
    // the newest key, so that their chain of loads (row, its keys' range,
    // the table) overlaps that kernel's end.
    const u32 row = step_input(rows, blockIdx.x), kvh = blockIdx.y;
    const u32 toff = step_input(meta, 3 * row + 2);
    u32 hi = step_input(meta, 3 * row + 1), lo = row_lo(meta, row, window);
    u32 parts;
    if (!split_share(lo, hi, split, parts)) return;
    const bool one_row = gridDim.x == 1;  // (batch 1: kernels/common.cuh `sm_busy`)
    if (one_row) busy_enter();
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int shift = bs && !(bs & (bs - 1)) ? __ffs(bs) - 1 : -1;
    // (Into L1 ahead of the wait: safe only while no kernel writes tables.)
    const u32 ahead = lo + RM_KEYS * (warp + ROW_WARPS * lane);  // lanes 0, 1: the warp's first two tiles
    if (shift >= 0 && lane < 2 && ahead < hi) prefetch_l1(tables + toff + (ahead >> shift));
    pdl_wait();
#ifdef SKIP_ATTN  // (measurement aid: the step without decode attention; outputs wrong)
    if (late) pdl_trigger();
    if (one_row) busy_leave();
    return;
#endif
    extern __shared__ __align__(16) unsigned char smem[];
    __shared__ float wm[ROW_WARPS][RM_HEADS], wl[ROW_WARPS][RM_HEADS];
    const u32 G = n_heads / n_kv_heads;
    const u64 kv_dim = (u64)n_kv_heads * HD;
    u16* tiles = (u16*)smem + warp * 3 * TILE;
    // Q^T as the B operand: head g, dims 2t.. and 2t + 8.. of each k-step;
    // scores in base 2 (log2 e in q's scale, or after the soft cap).
    const float qs = softcap > 0.f ? scale : scale * LOG2E;
    const bool qv = g < (int)G;
    const float* qg = q + (u64)row * n_heads * HD + (u64)(kvh * G + (qv ? g : 0)) * HD;
    u32 qf[HD / 16][2];
#pragma unroll
    for (int ks = 0; ks < HD / 16; ks++) {
        const int d = ks * 16 + 2 * t;
        qf[ks][0] = qv ? pack_f16(qg[d] * qs, qg[d + 1] * qs) : 0u;
        qf[ks][1] = qv ? pack_f16(qg[d + 8] * qs, qg[d + 9] * qs) : 0u;
    }
    // The warp's tiles of 16 keys start at j0 + STRIDE * i. Their halves
    // (K of tile i is half 2i, V half 2i + 1) stream through a ring of three
    // slots, half h into slot h % 3: while one half is used, the next two
    // are in flight. Lane l < 16 looks up the tile's key l; each 16-byte
    // chunk's lane takes it by shuffle. Keys past hi read as zeros (no
    // load), halves past the last tile included, so that `wait_group 2`
    // always means "half h has landed".
    constexpr u32 STRIDE = RM_KEYS * ROW_WARPS;
    const u32 j0 = lo + RM_KEYS * warp;
    auto stage = [&](u32 h) {
        const u32 first = j0 + STRIDE * (h / 2);
        const u32 mine_j = first + (lane & 15);
        const u64 mine = mine_j < hi ? key_slot2(tables, toff, bs, shift, mine_j) * kv_dim + (u64)kvh * HD : 0;
        const u16* src = h & 1 ? vc : kc;
        u16* dst = tiles + (h % 3) * TILE;
#pragma unroll
        for (int i = 0; i < RM_KEYS * HD / 8 / 32; i++) {
            const int c = lane + 32 * i, kk = c / (HD / 8), ch = c % (HD / 8);
            const u64 base = __shfl_sync(0xffffffffu, mine, kk) + ch * 8;
            cp_async16(dst + kk * PAD + ch * 8, src + base, first + kk < hi);
        }
        asm volatile("cp.async.commit_group;");
    };
    trace_mark("attn.q");
    float o[HD / 16][4];
#pragma unroll
    for (int mt = 0; mt < HD / 16; mt++) o[mt][0] = o[mt][1] = o[mt][2] = o[mt][3] = 0.f;
    float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.f, l1 = 0.f;  // heads 2t and 2t + 1
    stage(0);
    stage(1);
    stage(2);
    u32 h = 0;  // the K half of this iteration's tile
    for (u32 jt = j0; jt < hi; jt += STRIDE, h += 2) {
        asm volatile("cp.async.wait_group 2;");
        __syncwarp();
        const u16* kt = tiles + (h % 3) * TILE;
        // S^T: K rows as the A operand (ldmatrix: lanes 0-15 keys 0-15 at
        // dims +0, lanes 16-31 the same keys at dims +8); two chains of k-steps.
        float s2[2][4] = {{0.f, 0.f, 0.f, 0.f}, {0.f, 0.f, 0.f, 0.f}};
#pragma unroll
        for (int ks = 0; ks < HD / 16; ks++) {
            u32 a[4];
            ldmatrix_x4(a, kt + (lane & 15) * PAD + ks * 16 + (lane >> 4) * 8);
            mma_f16(s2[ks & 1], a, qf[ks][0], qf[ks][1]);
        }
        // Every lane is done with K: its slot takes half h + 3; then V.
        __syncwarp();
        stage(h + 3);
        asm volatile("cp.async.wait_group 2;");
        __syncwarp();
        const u16* vt = tiles + ((h + 1) % 3) * TILE;
        float s[4];
#pragma unroll
        for (int i = 0; i < 4; i++) {
            s[i] = s2[0][i] + s2[1][i];
            if (softcap > 0.f) s[i] = softcap * tanhf(s[i] / softcap) * LOG2E;
        }
        if (jt + RM_KEYS > hi) {
            if (jt + g >= hi) s[0] = s[1] = -INFINITY;
            if (jt + g + 8 >= hi) s[2] = s[3] = -INFINITY;
        }
        // Key jt is always in range, so each head's new max is finite.
        float mx0 = fmaxf(s[0], s[2]), mx1 = fmaxf(s[1], s[3]);
#pragma unroll
        for (int x = 4; x < 32; x <<= 1) {
            mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, x));
            mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, x));
        }
        const float n0 = fmaxf(m0, mx0), n1 = fmaxf(m1, mx1);
        const float c0 = fast_exp2(m0 - n0), c1 = fast_exp2(m1 - n1);
        const float p0 = fast_exp2(s[0] - n0), p1 = fast_exp2(s[1] - n1), p2 = fast_exp2(s[2] - n0),
                    p3 = fast_exp2(s[3] - n1);
        // Each lane sums its own keys; the lanes of a head add up at the end.
        l0 = l0 * c0 + p0 + p2;
        l1 = l1 * c1 + p1 + p3;
        m0 = n0;
        m1 = n1;
#pragma unroll
        for (int mt = 0; mt < HD / 16; mt++) {
            o[mt][0] *= c0;
            o[mt][1] *= c1;
            o[mt][2] *= c0;
            o[mt][3] *= c1;
        }
        // P^T's B fragments (keys 2t.. and 2t + 8.. of head g).
        const u32 b0 = movmatrix_trans(pack_f16(p0, p1)), b1 = movmatrix_trans(pack_f16(p2, p3));
        // V^T as the A operand (ldmatrix.trans: lanes 8i..8i+7 address keys
        // (i / 2) * 8.. at dims (i % 2) * 8 of the m-tile).
#pragma unroll
        for (int mt = 0; mt < HD / 16; mt++) {
            u32 a[4];
            ldmatrix_x4_trans(a, vt + ((lane & 7) + (lane >> 4) * 8) * PAD + mt * 16 + ((lane >> 3) & 1) * 8);
            mma_f16(o[mt], a, b0, b1);
        }
        // Every lane is done with V: its slot takes half h + 4.
        __syncwarp();
        stage(h + 4);
    }
    asm volatile("cp.async.wait_group 0;");
    trace_mark("attn.keys");
    if (late) pdl_trigger();
#pragma unroll
    for (int x = 4; x < 32; x <<= 1) {
        l0 += __shfl_xor_sync(0xffffffffu, l0, x);
        l1 += __shfl_xor_sync(0xffffffffu, l1, x);
    }
    __syncthreads();  // the tiles become the warps' outputs
    float(*wacc)[RM_HEADS][HD] = reinterpret_cast<float(*)[RM_HEADS][HD]>(smem);
    if (g == 0) {
        // Natural-log units, as the merges expect.
        wm[warp][2 * t] = m0 * LN2;
        wm[warp][2 * t + 1] = m1 * LN2;
        wl[warp][2 * t] = l0;
        wl[warp][2 * t + 1] = l1;
    }
#pragma unroll
    for (int mt = 0; mt < HD / 16; mt++) {
        wacc[warp][2 * t][mt * 16 + g] = o[mt][0];
        wacc[warp][2 * t + 1][mt * 16 + g] = o[mt][1];
        wacc[warp][2 * t][mt * 16 + g + 8] = o[mt][2];
        wacc[warp][2 * t + 1][mt * 16 + g + 8] = o[mt][3];
    }
    __syncthreads();
    combine_warps<RM_HEADS, HD>(wm, wl, wacc, G, HD, row, kvh, n_heads, parts, part, done, out, half, bf16, x8);
    if (one_row) busy_leave();
}

// The row kernels' arguments (the host launches both alike); `hd` is HD.
#define ROWS_MMA_KERNEL(HD)                                                                                      \
    extern "C" __global__ void __launch_bounds__(32 * ROW_WARPS, 4)                                               \
        attention_rows_mma_##HD(const float* q, const u16* kc, const u16* vc, float* out, const u32* meta,        \
                                const u32* tables, const u32* rows, u32 n_heads, u32 n_kv_heads, u32 hd, u32 bs,  \
                                u32 window, float scale, float softcap, u32 split, float* part, u32* done,        \
                                u16* half, int bf16, signed char* x8q, u32* x8m, int x8o, int late) {                      \
        rows_mma_body<HD>(q, kc, vc, out, meta, tables, rows, n_heads, n_kv_heads, bs, window, scale, softcap,    \
                          split, part, done, half, bf16, X8Out{x8q, x8m, x8o}, late);                                  \
    }
ROWS_MMA_KERNEL(64)
ROWS_MMA_KERNEL(128)
