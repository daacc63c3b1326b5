// ---------------------------------------------------------------- flash on wgmma, pipelined (sm_90a)
//
// The compile list joins this file after attention.cu (compile.rs MODULES),
// whose helpers it uses. flash_wgp_*: flash_body's wgmma path (same tiles,
// shared-memory layout and softmax) with the softmax of the next tile run
// while this tile's output wgmmas are on the tensor cores. Tile j's
// iteration, its probabilities P_j computed by the one before:
//   1. wait for tile j + 1's K/V (staged an iteration ago); one barrier;
//   2. stage tile j + 2 (three buffers: the one it takes held tile j - 1,
//      whose wgmmas every warp has waited for before the barrier);
//   3. issue tile j + 1's score wgmmas, then O += P_j V_j;
//   4. wait for the scores alone; softmax into P_{j+1};
//   5. wait for the output; rescale it for tile j + 1's maxima.
// The wgmmas in flight never have their registers written meanwhile (ptxas
// serializes every wgmma of a kernel where they are: its warning C7515).
#define WGP_KEYS 32
#define WGP_BUFS 3

template <int HD>
__device__ void flash_wgp_body(const float* q, const u16* kc, const u16* vc, float* out, const u32* meta,
                               const u32* tables, const u32* tiles, u32 n_heads, u32 n_kv_heads, u32 bs, u32 window,
                               float scale, float softcap, u16* half, int bf16, const u16* qh) {
    constexpr int KEYS = WGP_KEYS;
    constexpr int CH = HD / 8;               // 16-byte chunks per key
    constexpr int PASS_KEYS = 128 / CH;      // keys one pass of the block stages
    constexpr int PASSES = KEYS / PASS_KEYS; // passes per tile (table entries a thread keeps)
    constexpr int BUF = KEYS * HD;           // u16 per buffer
    extern __shared__ __align__(1024) u16 fa_smem[];
    u16* Ks = fa_smem;                       // [WGP_BUFS][CH / 8][KEYS][64], swizzled
    u16* Vs = fa_smem + WGP_BUFS * BUF;      // the same
    const u32 head = blockIdx.x % n_heads, tile = blockIdx.x / n_heads;
    const u32 row0 = tiles[2 * tile], nrows = tiles[2 * tile + 1];
    const u32 kvh = head / (n_heads / n_kv_heads);
    const u64 q_stride = (u64)n_heads * HD;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const u32 toff = meta[3 * row0 + 2];
    const int shift = bs && !(bs & (bs - 1)) ? __ffs(bs) - 1 : -1;
    const u32 klo = row_lo(meta, row0, window), khi = meta[3 * (row0 + nrows - 1) + 1];
    const u32 ra = warp * 16 + g, rb = ra + 8;
    const bool va = ra < nrows, vb = rb < nrows;
    const u32 lo_a = va ? row_lo(meta, row0 + ra, window) : 0xffffffffu, hi_a = va ? meta[3 * (row0 + ra) + 1] : 0;
    const u32 lo_b = vb ? row_lo(meta, row0 + rb, window) : 0xffffffffu, hi_b = vb ? meta[3 * (row0 + rb) + 1] : 0;
    const u64 qa = (u64)(row0 + ra) * q_stride + (u64)head * HD;
    const u64 qb = (u64)(row0 + rb) * q_stride + (u64)head * HD;
    const float qs = softcap > 0.f ? scale : scale * LOG2E;
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
    // Keys every row of the warp sees: tiles inside need no mask.
    u32 in_lo = max(lo_a, lo_b), in_hi = min(hi_a, hi_b);
    for (int o = 16; o > 0; o >>= 1) {
        in_lo = max(in_lo, __shfl_xor_sync(0xffffffffu, in_lo, o));
        in_hi = min(in_hi, __shfl_xor_sync(0xffffffffu, in_hi, o));
    }
    const u32 my_key = threadIdx.x / CH, my_ch = threadIdx.x % CH;
    u32 tb[PASSES];
    auto fetch = [&](u32 j0) {
#pragma unroll
        for (int p = 0; p < PASSES; p++) {
            const u32 j = min(j0 + my_key + p * PASS_KEYS, khi - 1);
            tb[p] = bs ? tables[toff + (shift >= 0 ? j >> shift : j / bs)] : 0u;
        }
    };
    const u32 kv_dim32 = n_kv_heads * HD;
    const u64 kv_off = (u64)kvh * HD + my_ch * 8;
    auto stage = [&](u32 j0, int buf) {
#pragma unroll
        for (int p = 0; p < PASSES; p++) {
            const u32 kj = my_key + p * PASS_KEYS, j = j0 + kj;
            const bool in = j < khi;
            const u32 slot = !bs ? j : shift >= 0 ? (tb[p] << shift) + (j & (bs - 1)) : tb[p] * bs + j % bs;
            const u64 base = in ? (u64)slot * kv_dim32 + kv_off : 0;
            const u32 at = buf * BUF + ((my_ch >> 3) * KEYS + kj) * 64 + (((my_ch & 7) ^ (kj & 7)) * 8);
            cp_async16(Ks + at, kc + base, in);
            cp_async16(Vs + at, vc + base, in);
        }
        asm volatile("cp.async.commit_group;");
    };
    // The score wgmmas of the tile in buffer `buf` into s (flash_body's descriptors).
    auto score = [&](float (&s)[4][4], int buf) {
        const u16* Kt = Ks + buf * BUF;
        wg_fence();
#pragma unroll
        for (int ks = 0; ks < HD / 16; ks++) {
            const u64 d = wg_desc(Kt + (ks >> 2) * KEYS * 64 + (ks & 3) * 16, 16, 1024);
            wgmma_n32(s, qf[ks], d, 0 < ks);
        }
        wg_commit();
    };
    // The online softmax of the scores of keys k0.. into P (packed f16, the
    // output wgmma's A operand); the factors c_a, c_b that rescale the
    // output (true where one is not 1 for some row of the warp).
    float c_a = 1.f, c_b = 1.f;
    auto softmax = [&](float (&s)[4][4], u32 k0, u32 (&pk)[2][4]) {
        if (softcap > 0.f) {
#pragma unroll
            for (int n = 0; n < 4; n++)
#pragma unroll
                for (int i = 0; i < 4; i++) s[n][i] = softcap * tanhf(s[n][i] / softcap) * LOG2E;
        }
        if (k0 < in_lo || k0 + KEYS > in_hi) {
#pragma unroll
            for (int n = 0; n < 4; n++) {
#pragma unroll
                for (int i = 0; i < 4; i++) {
                    const u32 key = k0 + n * 8 + 2 * t + (i & 1);
                    const bool ok = i < 2 ? (key >= lo_a && key < hi_a) : (key >= lo_b && key < hi_b);
                    if (!ok) s[n][i] = -INFINITY;
                }
            }
        }
        float mx_a = -INFINITY, mx_b = -INFINITY;
#pragma unroll
        for (int n = 0; n < 4; n++) {
            mx_a = fmaxf(mx_a, fmaxf(s[n][0], s[n][1]));
            mx_b = fmaxf(mx_b, fmaxf(s[n][2], s[n][3]));
        }
        mx_a = fmaxf(mx_a, __shfl_xor_sync(0xffffffffu, mx_a, 1));
        mx_a = fmaxf(mx_a, __shfl_xor_sync(0xffffffffu, mx_a, 2));
        mx_b = fmaxf(mx_b, __shfl_xor_sync(0xffffffffu, mx_b, 1));
        mx_b = fmaxf(mx_b, __shfl_xor_sync(0xffffffffu, mx_b, 2));
        const float nm_a = fmaxf(m_a, mx_a), nm_b = fmaxf(m_b, mx_b);
        c_a = nm_a == -INFINITY ? 1.f : fast_exp2(m_a - nm_a);
        c_b = nm_b == -INFINITY ? 1.f : fast_exp2(m_b - nm_b);
        // A row that has seen no key subtracts 0 (its scores are all -inf).
        const float sub_a = nm_a == -INFINITY ? 0.f : nm_a, sub_b = nm_b == -INFINITY ? 0.f : nm_b;
        float sum_a = 0.f, sum_b = 0.f;
#pragma unroll
        for (int n = 0; n < 4; n++) {
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
#pragma unroll
        for (int kk = 0; kk < 2; kk++) {
            pk[kk][0] = pack_f16(s[2 * kk][0], s[2 * kk][1]);
            pk[kk][1] = pack_f16(s[2 * kk][2], s[2 * kk][3]);
            pk[kk][2] = pack_f16(s[2 * kk + 1][0], s[2 * kk + 1][1]);
            pk[kk][3] = pack_f16(s[2 * kk + 1][2], s[2 * kk + 1][3]);
        }
        // A max rarely moves once a row has seen many keys.
        return __any_sync(0xffffffffu, c_a != 1.f || c_b != 1.f);
    };
    // Tiles 0 and 1 in flight, tile 0 landed (an empty group stands in for
    // a missing tile 1); tile 0's scores and probabilities.
    fetch(klo);
    stage(klo, 0);
    fetch(klo + KEYS);
    if (klo + KEYS < khi) {
        stage(klo + KEYS, 1);
        fetch(klo + 2 * KEYS);
    } else {
        asm volatile("cp.async.commit_group;");
    }
    asm volatile("cp.async.wait_group 1;");
    wg_proxy_fence();
    __syncthreads();
    float s[4][4];
    u32 p[2][4], pn[2][4];
    score(s, 0);
    wg_wait();
    wg_keep(s);
    softmax(s, klo, p);
    // O += P V_j, V_j in buffer `buf`.
    auto output = [&](u32 buf) {
        const u16* Vt = Vs + buf * BUF;
        wg_fence();
#pragma unroll
        for (int kk = 0; kk < 2; kk++) {
            const u64 d = wg_desc(Vt + kk * 16 * 64, KEYS * 128, 1024);
            if constexpr (HD == 128) wgmma_n128_t(o, p[kk], d, 1);
            else wgmma_n64_t(o, p[kk], d, 1);
        }
        wg_commit();
    };
    // Tile j (at j0, in buffer buf, its probabilities in p) when a tile
    // follows: see the top. (No wgmma is issued on a condition: ptxas then
    // no longer knows which group a wait retires, and serializes them all.)
    u32 j0 = klo, buf = 0;
    bool rescale = false;
    // Tile j - 1's output wgmmas done: rescale for tile j's maxima; P_j.
    // (At the loop's top, a block of its own: where the softmax before it
    // shares a block with the wait, ptxas schedules the wait first.)
    auto retire = [&]() {
        wg_wait();
        wg_keep(o);
        wg_keep(p);
        if (rescale) {
#pragma unroll
            for (int n = 0; n < HD / 8; n++) {
                o[n][0] *= c_a;
                o[n][1] *= c_a;
                o[n][2] *= c_b;
                o[n][3] *= c_b;
            }
        }
#pragma unroll
        for (int kk = 0; kk < 2; kk++)
#pragma unroll
            for (int i = 0; i < 4; i++) p[kk][i] = pn[kk][i];
    };
    for (; j0 + KEYS < khi; j0 += KEYS, buf = buf == WGP_BUFS - 1 ? 0 : buf + 1) {
        if (j0 != klo) retire();
        asm volatile("cp.async.wait_group 0;");
        wg_proxy_fence();
        __syncthreads();
        const u32 next = buf == WGP_BUFS - 1 ? 0 : buf + 1, after = next == WGP_BUFS - 1 ? 0 : next + 1;
        if (j0 + 2 * KEYS < khi) {
            stage(j0 + 2 * KEYS, after);
            fetch(j0 + 3 * KEYS);
        }
        score(s, next);
        output(buf);
        wg_wait1();
        wg_keep(s);
        rescale = softmax(s, j0 + KEYS, pn);
        wg_keep(pn);
    }
    if (j0 != klo) retire();
    // The last tile (landed: waited for by the last iteration or the prologue).
    output(buf);
    wg_wait();
    wg_keep(o);
    asm volatile("cp.async.wait_group 0;");
    const float ia = 1.f / l_a, ib = 1.f / l_b;
#pragma unroll
    for (int n = 0; n < HD / 8; n++) {
        const int d = n * 8 + 2 * t;
        if (va) store_pair(out, half, bf16, qa + d, o[n][0] * ia, o[n][1] * ia);
        if (vb) store_pair(out, half, bf16, qb + d, o[n][2] * ib, o[n][3] * ib);
    }
}

// Dynamic shared memory: WGP_BUFS buffers of K and V (`kv::flash_smem`).
#define FLASH_WGP_KERNEL(NAME, HD, MINB)                                                                             \
    extern "C" __global__ void __launch_bounds__(128, MINB)                                                     \
        NAME(const float* q, const u16* kc, const u16* vc, float* out, const u32* meta,              \
                       const u32* tables, const u32* tiles, u32 n_heads, u32 n_kv_heads, u32 bs, u32 window,    \
                       float scale, float softcap, u16* half, int bf16, const u16* qh) {                        \
        if (!FLASH_WG) __trap();                                                                                \
        pdl_trigger();                                                                                          \
        pdl_wait();                                                                                             \
        flash_wgp_body<HD>(q, kc, vc, out, meta, tables, tiles, n_heads, n_kv_heads, bs, window, scale,        \
                           softcap, half, bf16, qh);                                                            \
    }
FLASH_WGP_KERNEL(flash_wgp_64, 64, 1)
FLASH_WGP_KERNEL(flash_wgp_128, 128, 3)
FLASH_WGP_KERNEL(flash_wgq_128, 128, 2)
