// Every layer of a one-row decode step in one persistent kernel (host:
// cuda/decode_layers.rs; off unless FERRITE_CUDA_PERSISTENT=1), for Llama-
// shaped models whose matrices are all Q4_K or Q6_K tiles (Q4_K_M). Compiled
// after gemv_tile.cu, whose tensor-core steps (`q4k_step`, `q6k_step`) it
// runs, and rope_kv.cuh, whose RoPE and KV write its q/k/v epilogue is.
//
// Why: in the chain of kernels a layer is about nine dependent stages, and
// the weights stream only while a GEMV runs its loop (docs/cuda-journal.md).
// Here a block an SM keeps one warp copying the block's next weight chunks
// into a ring of shared-memory slots (bulk copies, mbarriers) whatever stage
// the other warps are in, so the waits between stages overlap the stream.
//
// A layer's stages, each split into items shared out over the blocks (block
// b takes items b, b + grid, ...):
//   qkv     a 16-row tile of q, k or v; RoPE and the KV write in its epilogue
//   attn    (KV head, part of the context): partial softmax sums, merged by
//           the last of the KV head's parts to arrive
//   oproj   a tile of the output projection, added to the residual x
//   gateup  a tile of gate and the same of up: act(gate) * up
//   down    a tile of the down projection, added to x
// Each block builds a stage's 8-bit input itself (norm and `store_sb`, from
// L2) into shared memory. A counter per layer and stage, to which every
// block adds its arrival, is the only synchronization between blocks: a
// stage starts once the counter of the stage before it reaches the grid.
// Data written inside the kernel is read past L1 (`__ldcg`): L1 is not
// coherent between SMs. A wait that lasts 5 s traps (an error, not a hang).

#define DL_STAGES 5
#define DL_SLOT 36864    // a ring slot: 16 Q4_K super-blocks of a tile (or 10 Q6_K)
#define DL_MAX_RING 5
#define DL_MAX_WARPS 16  // computing warps (the streaming warp is one more)
#define DL_MAX_K 16384   // the longest input a stage quantizes
#define DL_MAX_HD 128
#define DL_IN_BATCH 4    // super-blocks of a stage's input a warp loads at once
#define DL_KEYS 4        // keys a warp of attention loads at once

enum { DL_QKV, DL_ATTN, DL_OPROJ, DL_GATEUP, DL_DOWN };
enum { M_Q, M_K, M_V, M_O, M_GATE, M_UP, M_DOWN, M_COUNT };

// A layer as the host lays it out (decode_layers.rs `layer_words`).
struct DlMat {
    const u8* w;  // tiles of 16 rows (quant/repack.rs)
    u32 type;     // 0 Q4_K, 1 Q6_K
    u32 rows;
};
struct DlLayer {
    DlMat m[M_COUNT];
    const float *attn_norm, *ffn_norm;
    u16 *kc, *vc;  // the layer's f16 cache
};

struct DlArgs {
    const DlLayer* layers;
    u32 n_layers;
    float *x, *q, *attn, *parts, *h;
    u32* count;  // n_layers x (DL_STAGES + n_kv): stage arrivals, then attention parts done; zero at
                 // the start, zeroed again by the last block
    const u32 *pos, *slots, *meta, *tables;
    const float* inv_freq;
    u32 hidden, n_heads, n_kv, hd, ffn, bs, nparts, ring;
    float eps, scale;
    int act;
};

extern __shared__ __align__(128) unsigned char dl_smem[];

// ------------------------------------------------------------------ primitives
__device__ __forceinline__ u32 dl_smem_addr(const void* p) { return (u32)__cvta_generic_to_shared(p); }
__device__ __forceinline__ u64 dl_now() {
    u64 t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}
__device__ __forceinline__ void dl_check_wait(u64 start) {
    if (dl_now() - start > 5000000000ull) __trap();
}
__device__ __forceinline__ void dl_mbar_init(u64* bar, u32 count) {
#if __CUDA_ARCH__ >= 900
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(dl_smem_addr(bar)), "r"(count) : "memory");
#endif
}
__device__ __forceinline__ void dl_mbar_arrive(u64* bar) {
#if __CUDA_ARCH__ >= 900
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(dl_smem_addr(bar)) : "memory");
#endif
}
__device__ __forceinline__ void dl_mbar_wait(u64* bar, u32 parity) {
#if __CUDA_ARCH__ >= 900
    const u64 start = dl_now();
    for (;;) {
        u32 done;
        asm volatile(
            "{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }"
            : "=r"(done)
            : "r"(dl_smem_addr(bar)), "r"(parity)
            : "memory");
        if (done) return;
        dl_check_wait(start);
    }
#endif
}
// `bytes` from global src into shared dst, completing on `bar` (which
// expects them).
__device__ __forceinline__ void dl_copy(void* dst, const void* src, u32 bytes, u64* bar) {
#if __CUDA_ARCH__ >= 900
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(dl_smem_addr(bar)), "r"(bytes)
                 : "memory");
    u64 g;
    asm("cvta.to.global.u64 %0, %1;" : "=l"(g) : "l"(src));
    asm volatile(
        "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
            dl_smem_addr(dst)),
        "l"(g), "r"(bytes), "r"(dl_smem_addr(bar))
        : "memory");
#endif
}
// Until every block has arrived at counter c (thread 0 of the computing warps).
__device__ __forceinline__ void dl_wait_count(const u32* c, u32 target) {
    const u64 start = dl_now();
    for (;;) {
        u32 now;
        asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(now) : "l"(c) : "memory");
        if (now >= target) return;
        dl_check_wait(start);
    }
}
// The computing warps' own barrier (the streaming warp never joins it).
__device__ __forceinline__ u32 dl_warps() { return blockDim.x / 32 - 1; }
__device__ __forceinline__ void dl_sync() { asm volatile("bar.sync 1, %0;" ::"r"(dl_warps() * 32) : "memory"); }

// ------------------------------------------------------------------ shared memory
// Offsets (bytes) of the dynamic shared memory; the host sizes it the same
// way (decode_layers.rs `smem_bytes`).
struct DlSmem {
    u64 *full, *empty;  // a slot's bytes have landed / every computing warp is done with it
    unsigned char* ring;
    signed char* xq;    // the stage's input, 8-bit (`store_sb`)
    u32* meta;          // its super-blocks' steps, shifts and sums
    float* ss;          // its super-blocks' sums of squares (normed inputs)
    float4* red;        // the warps' partial sums (a float4 a lane; two buffers), or attention's states
    float* small;       // attention's maxima, sums and flags
};
__device__ __forceinline__ DlSmem dl_layout(u32 ring) {
    DlSmem s;
    s.full = (u64*)dl_smem;
    s.empty = s.full + DL_MAX_RING;
    s.ring = dl_smem + 128;
    s.xq = (signed char*)(s.ring + (u64)ring * DL_SLOT);
    s.meta = (u32*)(s.xq + DL_MAX_K);
    s.ss = (float*)(s.meta + DL_MAX_K / 256 * 8);
    s.red = (float4*)(s.ss + DL_MAX_K / 256);
    s.small = (float*)(s.red + 2 * DL_MAX_WARPS * 32);
    return s;
}

// The ring's barriers (thread 0), before any warp goes its way.
__device__ __forceinline__ void dl_init(u32 ring) {
    const DlSmem S = dl_layout(ring);
    if (threadIdx.x == 0) {
        for (u32 i = 0; i < ring; i++) dl_mbar_init(S.full + i, 1), dl_mbar_init(S.empty + i, dl_warps());
#if __CUDA_ARCH__ >= 900
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
#endif
    }
    __syncthreads();
}

// ------------------------------------------------------------------ items and chunks
__device__ __forceinline__ u32 dl_tiles(const DlMat& m) { return m.rows / 16; }
__device__ __forceinline__ u32 dl_items(const DlArgs& a, const DlLayer& L, int s) {
    switch (s) {
        case DL_QKV: return dl_tiles(L.m[M_Q]) + dl_tiles(L.m[M_K]) + dl_tiles(L.m[M_V]);
        case DL_ATTN: return a.n_kv * a.nparts;
        case DL_OPROJ: return dl_tiles(L.m[M_O]);
        case DL_GATEUP: return dl_tiles(L.m[M_GATE]);
        default: return dl_tiles(L.m[M_DOWN]);
    }
}
// The items of stage s this block takes.
__device__ __forceinline__ u32 dl_mine(u32 items) {
    return blockIdx.x < items ? (items - 1 - blockIdx.x) / gridDim.x + 1 : 0;
}
// Matrix u (0, or 1 for up) of item `item` of a weight stage, and its tile.
__device__ __forceinline__ u32 dl_mat(const DlLayer& L, int s, u32 item, u32 u, u32& tile) {
    tile = item;
    if (s == DL_QKV) {
        const u32 tq = dl_tiles(L.m[M_Q]), tk = dl_tiles(L.m[M_K]);
        if (item < tq) return M_Q;
        if (item < tq + tk) return tile = item - tq, M_K;
        return tile = item - tq - tk, M_V;
    }
    if (s == DL_OPROJ) return M_O;
    if (s == DL_GATEUP) return u ? M_UP : M_GATE;
    return M_DOWN;
}
__device__ __forceinline__ u32 dl_mats(int s) { return s == DL_GATEUP ? 2 : 1; }
// The input length (the matrices' k) of a weight stage.
__device__ __forceinline__ u32 dl_k(const DlArgs& a, int s) {
    return s == DL_OPROJ ? a.n_heads * a.hd : s == DL_DOWN ? a.ffn : a.hidden;
}
// Bytes of a tile super-block, and super-blocks of a chunk.
__device__ __forceinline__ u32 dl_block(u32 type) { return type ? 3360 : 2304; }
__device__ __forceinline__ u32 dl_chunk_sbs(u32 type) { return DL_SLOT / dl_block(type); }

// ------------------------------------------------------------------ the streaming warp
// Every weight chunk of the block, stage after stage, into the ring (lane 0).
__device__ __forceinline__ void dl_stream(const DlArgs& a) {
    const DlSmem S = dl_layout(a.ring);
    if ((threadIdx.x & 31) != 0) return;
    u32 n = 0;
    for (u32 l = 0; l < a.n_layers; l++) {
        const DlLayer& L = a.layers[l];
        for (int s = 0; s < DL_STAGES; s++) {
            if (s == DL_ATTN) continue;
            const u32 mine = dl_mine(dl_items(a, L, s)), nsb = dl_k(a, s) / 256;
            for (u32 j = 0; j < mine; j++)
                for (u32 u = 0; u < dl_mats(s); u++) {
                    u32 tile;
                    const DlMat& M = L.m[dl_mat(L, s, blockIdx.x + j * gridDim.x, u, tile)];
                    const u32 block = dl_block(M.type), per = dl_chunk_sbs(M.type);
                    const u8* src = M.w + (u64)tile * nsb * block;
                    for (u32 c = 0; c * per < nsb; c++, n++) {
                        const u32 slot = n % a.ring;
                        if (n >= a.ring) dl_mbar_wait(S.empty + slot, (n / a.ring - 1) & 1);
                        const u32 bytes = min(per, nsb - c * per) * block;
#ifndef DL_NO_COPY
                        dl_copy(S.ring + (u64)slot * DL_SLOT, src + (u64)c * per * block, bytes, S.full + slot);
#else  // (measurement aid: the computing side on stale slots, no weights read)
                        (void)bytes, (void)src;
                        dl_mbar_arrive(S.full + slot);
#endif
                    }
                }
        }
    }
}

// ------------------------------------------------------------------ inputs
// n values of src as an 8-bit input (`store_sb`) into xq / meta, times the
// norm's weights where `nw` (their sums of squares in ss), by warp `warp` of
// `step` (every lane of each); the caller syncs before reading them.
__device__ __forceinline__ void dl_input_warps(signed char* xq, u32* meta, float* ss, const float* src, const float* nw,
                                               u32 n, u32 warp, u32 step) {
    const u32 lane = threadIdx.x & 31, nsb = n / 256;
    // Up to DL_IN_BATCH super-blocks a warp at a time, their loads all out
    // before the first is quantized: one L2 round trip a batch, not one a
    // super-block (the down projection's input is 56 super-blocks).
    for (u32 g0 = warp; g0 < nsb; g0 += DL_IN_BATCH * step) {
        float4 x[DL_IN_BATCH][2], w[DL_IN_BATCH][2];
#pragma unroll
        for (int b = 0; b < DL_IN_BATCH; b++) {
            // Past the input, the warp's first super-block again: clamped
            // to the last one, each warp would ask L2 for that one KB up to
            // three times more, thousands of times over the grid at once.
            const u32 g = g0 + b * step < nsb ? g0 + b * step : g0;
            const float* p = src + 256 * g + 8 * lane;
            x[b][0] = __ldcg((const float4*)p), x[b][1] = __ldcg((const float4*)(p + 4));
            if (nw) {
                w[b][0] = __ldg((const float4*)(nw + 256 * g + 8 * lane));
                w[b][1] = __ldg((const float4*)(nw + 256 * g + 8 * lane + 4));
            }
        }
#pragma unroll
        for (int b = 0; b < DL_IN_BATCH; b++) {
            const u32 g = g0 + b * step;
            if (g >= nsb) break;
            float v[8] = {x[b][0].x, x[b][0].y, x[b][0].z, x[b][0].w, x[b][1].x, x[b][1].y, x[b][1].z, x[b][1].w};
            if (nw) {
                float sq = 0.f;
#pragma unroll
                for (int e = 0; e < 8; e++) sq += v[e] * v[e];
                sq = warp_sum(sq);
                if (lane == 0) ss[g] = sq;
                const float wr[8] = {w[b][0].x, w[b][0].y, w[b][0].z, w[b][0].w,
                                     w[b][1].x, w[b][1].y, w[b][1].z, w[b][1].w};
#pragma unroll
                for (int e = 0; e < 8; e++) v[e] *= wr[e];
            }
            store_sb(g, lane, v, xq, meta);
        }
    }
}
// The RMS norm's factor of n values from their super-blocks' sums of
// squares (the same order, so the same value, in every thread).
__device__ __forceinline__ float dl_norm_factor(const float* ss, u32 n, float eps) {
    float sq = 0.f;
    for (u32 g = 0; g < n / 256; g++) sq += ss[g];
    return rsqrtf(sq / n + eps);
}
// The stage's input into S.xq / S.meta (every computing warp): n values of
// src, times the norm's weights where `nw`; returns the norm's factor (1
// without), the same in every thread.
__device__ __forceinline__ float dl_input(const DlSmem& S, const float* src, const float* nw, u32 n, float eps) {
    dl_input_warps(S.xq, S.meta, S.ss, src, nw, n, threadIdx.x >> 5, dl_warps());
    dl_sync();
    return nw ? dl_norm_factor(S.ss, n, eps) : 1.f;
}

// ------------------------------------------------------------------ weight stages
// A lane's weights of one super-block from a slot (the layouts of
// `q4k_fetch` and `q6k_fetch`, gemv_tile.cu).
__device__ __forceinline__ Q4kW dl_q4k(const unsigned char* sb, u32 lane) {
    const uint4* b = (const uint4*)sb;
    Q4kW w;
    w.ha = b[lane >> 2], w.hb = b[8 + (lane >> 2)];
#pragma unroll
    for (int j = 0; j < 4; j++) w.p[j] = b[16 + 32 * j + lane];
    return w;
}
__device__ __forceinline__ Q6kW dl_q6k(const unsigned char* sb, u32 lane) {
    const uint4* b = (const uint4*)sb;
    Q6kW w;
#pragma unroll
    for (int j = 0; j < 4; j++) w.lo[j] = b[32 * j + lane];
    w.hi[0] = b[128 + lane], w.hi[1] = b[160 + lane];
    w.sa = b[192 + (lane >> 2)], w.sb = b[200 + (lane >> 2)];
    w.d = ((const u32*)(b + 208))[lane >> 2];
    return w;
}

// Super-block sb of the stage's input as a lane's fragments: 64 bytes of
// 8-bit values, the step and shifts (h), the sums (bs).
struct DlIn {
    uint4 x[4], h, bs;
};
__device__ __forceinline__ DlIn dl_in_at(const signed char* xq, const u32* meta, u32 sb, u32 i) {
    const uint4* xs = (const uint4*)(xq + 256 * sb + 64 * i);
    const uint4* m = (const uint4*)meta;
    return DlIn{{xs[0], xs[1], xs[2], xs[3]}, m[2 * sb], m[2 * sb + 1]};
}
__device__ __forceinline__ DlIn dl_in(const DlSmem& S, u32 sb, u32 i) { return dl_in_at(S.xq, S.meta, sb, i); }

// Super-blocks j and j2 (when `two`) of a slot's chunk of type T, whose first
// is super-block sb0 of the tile, into the lane's sums: both read from shared
// memory before either's products (two in flight, as the chain's registers).
template <int T>
__device__ __forceinline__ void dl_pair(const DlSmem& S, const unsigned char* base, u32 sb0, u32 j, u32 j2, bool two,
                                        u32 lane, float (&acc)[4]) {
    const u32 block = dl_block(T), i = lane & 3;
    const u32 jb = two ? j2 : j;
    const DlIn xa = dl_in(S, sb0 + j, i), xb = dl_in(S, sb0 + jb, i);
    if (T == 0) {
        const Q4kW wa = dl_q4k(base + j * block, lane), wb = dl_q4k(base + jb * block, lane);
        q4k_step<1>(wa, xa.x, xa.h, xa.bs, xa.h, xa.bs, acc);
        if (two) q4k_step<1>(wb, xb.x, xb.h, xb.bs, xb.h, xb.bs, acc);
    } else {
        const Q6kW wa = dl_q6k(base + j * block, lane), wb = dl_q6k(base + jb * block, lane);
        q6k_step<1>(wa, xa.x, xa.h, xa.h, acc);
        if (two) q6k_step<1>(wb, xb.x, xb.h, xb.h, acc);
    }
}

// One tile of matrix M against the stage's input: its chunks from the ring
// (`n`: the block's chunks consumed so far), each warp taking super-blocks
// w, w + warps, ... of each; warp 0 returns the tile's sums (lane (g, i):
// rows g and g + 8 in [0] and [2]), summed over the warps in a fixed order.
// The warps' partial sums go to one of two buffers by the tile's parity
// (`tiles`: the block's tiles so far), so that one barrier a tile serves:
// a buffer is written again only two tiles later, past the next barrier,
// which warp 0 reaches once it has read it.
__device__ __forceinline__ void dl_tile(const DlSmem& S, const DlMat& M, u32 nsb, u32 ring, u32& n, u32& tiles,
                                        float (&out)[4]) {
    const u32 lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = dl_warps();
    const u32 per = dl_chunk_sbs(M.type);
    float acc[4] = {0.f, 0.f, 0.f, 0.f};
    for (u32 c = 0; c * per < nsb; c++, n++) {
        const u32 slot = n % ring, cnt = min(per, nsb - c * per);
        dl_mbar_wait(S.full + slot, (n / ring) & 1);
        const unsigned char* base = S.ring + (u64)slot * DL_SLOT;
#ifndef DL_NO_MATH  // (measurement aid: the stream and the schedule without the tiles' arithmetic)
        for (u32 j = warp; j < cnt; j += 2 * nw) {
            if (M.type == 0) dl_pair<0>(S, base, c * per, j, j + nw, j + nw < cnt, lane, acc);
            else dl_pair<1>(S, base, c * per, j, j + nw, j + nw < cnt, lane, acc);
        }
#else
        (void)base;
#endif
        __syncwarp();
        if (lane == 0) dl_mbar_arrive(S.empty + slot);
    }
    float4* red = S.red + (tiles++ & 1) * DL_MAX_WARPS * 32;
    red[warp * 32 + lane] = make_float4(acc[0], acc[1], acc[2], acc[3]);
    dl_sync();
    if (warp == 0) {
        for (u32 w = 1; w < nw; w++) {
            const float4 p = red[w * 32 + lane];
            acc[0] += p.x, acc[1] += p.y, acc[2] += p.z, acc[3] += p.w;
        }
#pragma unroll
        for (int e = 0; e < 4; e++) out[e] = acc[e];
    }
}

// Item `item` of weight stage s of layer l (`f`: the input norm's factor).
// What warp 0's epilogue reads (the residual's rows, RoPE's angles) is
// asked for before the tile, so that no round trip follows its products.
__device__ __forceinline__ void dl_weights(const DlArgs& a, const DlSmem& S, u32 l, int s, u32 item, float f, u32& n,
                                           u32& tiles) {
    const DlLayer& L = a.layers[l];
    const u32 lane = threadIdx.x & 31, g = lane >> 2, nsb = dl_k(a, s) / 256;
    u32 tile = 0;
    const u32 mi = dl_mat(L, s, item, 0, tile), row = 16 * tile + g, m = L.m[mi].rows;
    const bool lead = threadIdx.x < 32;  // warp 0: the epilogue
    const u32 kv_dim = a.n_kv * a.hd, which = mi;  // M_Q, M_K, M_V are 0, 1, 2
    const RopeKv rk{a.pos, a.inv_freq, a.slots, L.kc, L.vc, a.hd, kv_dim};
    RopeKvLane rl{};
    float base[2] = {0.f, 0.f};
    if (lead && s == DL_QKV) rl = rope_kv_lane(rk, which, row, m);
    if (lead && (s == DL_OPROJ || s == DL_DOWN) && (lane & 3) == 0)
        base[0] = __ldcg(a.x + row), base[1] = __ldcg(a.x + row + 8);
    float r[2][4];
    dl_tile(S, L.m[mi], nsb, a.ring, n, tiles, r[0]);
    if (s == DL_GATEUP) dl_tile(S, L.m[M_UP], nsb, a.ring, n, tiles, r[1]);
    if (!lead) return;
    if (s == DL_QKV) {
        rope_kv_rows2(rk, rl, which, row, m, r[0][0] * f, r[0][2] * f, (lane & 3) == 0, a.q);
        return;
    }
    if ((lane & 3) != 0) return;
#pragma unroll
    for (int h = 0; h < 2; h++) {
        const u32 rr = row + 8 * h;
        const float v = r[0][2 * h];
        if (s == DL_GATEUP) a.h[rr] = act_fn(v * f, a.act) * (r[1][2 * h] * f);
        else a.x[rr] = base[h] + v;  // oproj, down: added to the residual
    }
}

// ------------------------------------------------------------------ attention
// A lane's E values (2 or 4, the rest zero) of a cached key and value at
// element `at` of the layer's caches. The step's own key was written by this
// kernel (`fresh`: read past L1); older ones by earlier steps.
__device__ __forceinline__ void dl_kv(const DlLayer& L, u64 at, bool fresh, u32 E, float (&k)[4], float (&v)[4]) {
    if (E == 4) {
        const uint2 kb = fresh ? __ldcg((const uint2*)(L.kc + at)) : *(const uint2*)(L.kc + at);
        const uint2 vb = fresh ? __ldcg((const uint2*)(L.vc + at)) : *(const uint2*)(L.vc + at);
        const u32 kw[2] = {kb.x, kb.y}, vw[2] = {vb.x, vb.y};
#pragma unroll
        for (int e = 0; e < 4; e++) {
            k[e] = f16_to_f32((u16)(kw[e / 2] >> (16 * (e & 1))));
            v[e] = f16_to_f32((u16)(vw[e / 2] >> (16 * (e & 1))));
        }
    } else {
        const u32 kb = fresh ? __ldcg((const u32*)(L.kc + at)) : *(const u32*)(L.kc + at);
        const u32 vb = fresh ? __ldcg((const u32*)(L.vc + at)) : *(const u32*)(L.vc + at);
        k[0] = f16_to_f32((u16)kb), k[1] = f16_to_f32((u16)(kb >> 16)), k[2] = k[3] = 0.f;
        v[0] = f16_to_f32((u16)vb), v[1] = f16_to_f32((u16)(vb >> 16)), v[2] = v[3] = 0.f;
    }
}

// Head `warp`'s states from its R warps (warps warp, warp + G, ...: their
// outputs in st, hd apart, their maxima and sums in small[w] and
// small[DL_MAX_WARPS + w]) merged in order: the maximum, the sum and the
// lane's E = hd / 32 outputs (the rest zero).
__device__ __forceinline__ void dl_merge_states(const float* st, const float* small, u32 warp, u32 G, u32 R, u32 hd,
                                                float& mx, float& tot, float (&out)[4]) {
    const u32 lane = threadIdx.x & 31, E = hd / 32;
    mx = -1e30f, tot = 0.f;
    for (u32 r = 0; r < R; r++) mx = fmaxf(mx, small[r * G + warp]);
#pragma unroll
    for (u32 e = 0; e < 4; e++) out[e] = 0.f;
    for (u32 r = 0; r < R; r++) {
        const u32 w = r * G + warp;
        const float c = __expf(small[w] - mx);
        tot += small[DL_MAX_WARPS + w] * c;
#pragma unroll
        for (u32 e = 0; e < 4; e++)
            if (e < E) out[e] += st[w * hd + E * lane + e] * c;
    }
}
// Head h's state of part p (a warp's: its lane's E = hd / 32 outputs) into
// `parts` for `dl_merge_parts`.
__device__ __forceinline__ void dl_store_part(float* parts, u32 p, u32 n_heads, u32 h, u32 hd, float mx, float tot,
                                              const float (&out)[4]) {
    const u32 lane = threadIdx.x & 31, E = hd / 32;
    float* dst = parts + ((u64)p * n_heads + h) * (hd + 2);
    if (lane == 0) dst[0] = mx, dst[1] = tot;
#pragma unroll
    for (u32 e = 0; e < 4; e++)
        if (e < E) dst[2 + E * lane + e] = out[e];
}
// Output d of head hh merged over the np parts' states in `parts` (per part
// and head: the maximum, the sum, hd outputs; written by other blocks).
__device__ __forceinline__ float dl_merge_parts(const float* parts, u32 np, u32 n_heads, u32 hh, u32 hd, u32 d) {
    float mx = -1e30f;
    for (u32 j = 0; j < np; j++) mx = fmaxf(mx, __ldcg(parts + ((u64)j * n_heads + hh) * (hd + 2)));
    float den = 0.f, num = 0.f;
    for (u32 j = 0; j < np; j++) {
        const float* src = parts + ((u64)j * n_heads + hh) * (hd + 2);
        const float c = __expf(__ldcg(src) - mx);
        den += __ldcg(src + 1) * c;
        num += __ldcg(src + 2 + d) * c;
    }
    return num / den;
}

// Item (KV head kvh, part p) of layer l: the G query heads of the KV head
// over the part's keys, warp w taking head w % G and keys r, r + R, ... of
// the part (r = w / G, R = warps / G); each head's R states merged in order
// into the part's (max, sum, output) in `parts`. The last part of the KV
// head to finish merges all of them into `attn`.
__device__ __forceinline__ void dl_attention(const DlArgs& a, const DlSmem& S, u32 l, u32 item) {
    const u32 lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = dl_warps();
    const u32 G = a.n_heads / a.n_kv, R = nw / G, kvh = item / a.nparts, p = item % a.nparts;
    const u32 hd = a.hd, E = hd / 32, kv_dim = a.n_kv * hd, h = kvh * G + warp % G;
    const DlLayer& L = a.layers[l];
    const u32 lo = a.meta[0], hi = a.meta[1], off = a.meta[2], len = hi - lo;
    const u32 t0 = lo + (u32)((u64)len * p / a.nparts), t1 = lo + (u32)((u64)len * (p + 1) / a.nparts);
    float q[4] = {0.f, 0.f, 0.f, 0.f}, o[4] = {0.f, 0.f, 0.f, 0.f}, m = -1e30f, sum = 0.f;
#pragma unroll
    for (u32 e = 0; e < 4; e++)
        if (e < E) q[e] = __ldcg(a.q + h * hd + E * lane + e) * a.scale;
    if (warp < G * R) {
        // DL_KEYS keys a round: their cache rows (the block table) first,
        // then their values, then the math, so that a round waits on two
        // round trips rather than two a key.
        for (u32 t = t0 + warp / G; t < t1; t += DL_KEYS * R) {
            u64 at[DL_KEYS];
#pragma unroll
            for (int b = 0; b < DL_KEYS; b++) {
                const u32 tb = min(t + b * R, t1 - 1);
                const u64 slot = (u64)a.tables[off + tb / a.bs] * a.bs + tb % a.bs;
                at[b] = slot * kv_dim + kvh * hd + E * lane;
            }
            float k[DL_KEYS][4], v[DL_KEYS][4];
#pragma unroll
            for (int b = 0; b < DL_KEYS; b++) dl_kv(L, at[b], min(t + b * R, t1 - 1) + 1 == hi, E, k[b], v[b]);
#pragma unroll
            for (int b = 0; b < DL_KEYS; b++) {
                if (t + b * R >= t1) break;
                float dot = 0.f;
#pragma unroll
                for (int e = 0; e < 4; e++) dot += q[e] * k[b][e];  // (zeros past E)
                dot = warp_sum(dot);
                const float mn = fmaxf(m, dot), c = __expf(m - mn), pr = __expf(dot - mn);
                sum = sum * c + pr;
#pragma unroll
                for (int e = 0; e < 4; e++) o[e] = o[e] * c + pr * v[b][e];
                m = mn;
            }
        }
    }
    float* st = (float*)S.red;  // warps x hd outputs
#pragma unroll
    for (u32 e = 0; e < 4; e++)
        if (e < E) st[warp * hd + E * lane + e] = o[e];
    if (lane == 0) S.small[warp] = m, S.small[DL_MAX_WARPS + warp] = sum;
    dl_sync();
    if (warp < G) {  // head kvh * G + warp: its R states in order
        float mx, tot, out[4];
        dl_merge_states(st, S.small, warp, G, R, hd, mx, tot, out);
        dl_store_part(a.parts, p, a.n_heads, h, hd, mx, tot, out);
    }
    __threadfence();
    dl_sync();
    u32* done = a.count + (u64)a.n_layers * DL_STAGES + (u64)l * a.n_kv + kvh;
    if (threadIdx.x == 0) {
        __threadfence();
        S.small[2 * DL_MAX_WARPS] = atomicAdd(done, 1u) + 1 == a.nparts ? 1.f : 0.f;
        __threadfence();
    }
    dl_sync();
    if (S.small[2 * DL_MAX_WARPS] != 0.f) {  // the KV head's last part: merge all of them
        __threadfence();
        for (u32 t = threadIdx.x; t < G * hd; t += 32 * nw)
            a.attn[kvh * G * hd + t] = dl_merge_parts(a.parts, a.nparts, a.n_heads, kvh * G + t / hd, hd, t % hd);
    }
    dl_sync();
}

// Block 0's phases of stage s on the decode timeline (`FERRITE_CUDA_TRACE=2`,
// cuda/trace.rs): its wait for the stage before, the stage (a weight
// stage's input build), a weight stage's tiles.
enum { DL_MARK_WAIT, DL_MARK_STAGE, DL_MARK_TILES };
__device__ __forceinline__ void dl_mark(int s, int phase) {
#if defined(FERRITE_TRACE) && defined(FERRITE_TRACE_MARKS)
    const char* const names[3][DL_STAGES] = {
        {"dl.wait.qkv", "dl.wait.attn", "dl.wait.oproj", "dl.wait.gateup", "dl.wait.down"},
        {"dl.qkv", "dl.attn", "dl.oproj", "dl.gateup", "dl.down"},
        {"dl.tiles.qkv", "", "dl.tiles.oproj", "dl.tiles.gateup", "dl.tiles.down"}};
    trace_mark(names[phase][s]);
#else
    (void)s, (void)phase;
#endif
}

// ------------------------------------------------------------------ the computing warps
__device__ __forceinline__ void dl_compute(const DlArgs& a) {
    const DlSmem S = dl_layout(a.ring);
    u32 n = 0, tiles = 0;
    for (u32 l = 0; l < a.n_layers; l++) {
        const DlLayer& L = a.layers[l];
        for (int s = 0; s < DL_STAGES; s++) {
            const u32 mine = dl_mine(dl_items(a, L, s));
            if (mine > 0) {
                dl_mark(s, DL_MARK_WAIT);
                if (threadIdx.x == 0 && (l > 0 || s > 0)) {
                    const u32 prev = s > 0 ? l * DL_STAGES + s - 1 : (l - 1) * DL_STAGES + DL_DOWN;
                    dl_wait_count(a.count + prev, gridDim.x);
                    __threadfence();
                }
                dl_mark(s, DL_MARK_STAGE);
                dl_sync();
                if (s == DL_ATTN) {
                    for (u32 j = 0; j < mine; j++) dl_attention(a, S, l, blockIdx.x + j * gridDim.x);
                } else {
                    const float* src = s == DL_OPROJ ? a.attn : s == DL_DOWN ? a.h : a.x;
                    const float* nw = s == DL_QKV ? L.attn_norm : s == DL_GATEUP ? L.ffn_norm : nullptr;
                    const float f = dl_input(S, src, nw, dl_k(a, s), a.eps);
                    dl_mark(s, DL_MARK_TILES);
                    for (u32 j = 0; j < mine; j++) dl_weights(a, S, l, s, blockIdx.x + j * gridDim.x, f, n, tiles);
                }
                __threadfence();
                dl_sync();
            }
            if (threadIdx.x == 0) {
                __threadfence();
                const u32 arrived = atomicAdd(a.count + l * DL_STAGES + s, 1u) + 1;
                // The last block at the last stage: no block reads a counter
                // any more, so it zeroes them for the next step (no memset
                // between the kernel and the one before it).
                if (l + 1 == a.n_layers && s == DL_DOWN && arrived == gridDim.x)
                    for (u32 i = 0; i < a.n_layers * (DL_STAGES + a.n_kv); i++) a.count[i] = 0;
            }
        }
    }
}

#define DL_ARGS                                                                                              \
    const DlLayer *layers, u32 n_layers, float *x, float *q, float *attn, float *parts, float *h, u32 *count,      \
        const u32 *pos, const u32 *slots, const u32 *meta, const u32 *tables, const float *inv_freq, u32 hidden,   \
        u32 n_heads, u32 n_kv, u32 hd, u32 ffn, u32 bs, u32 nparts, u32 ring, float eps, float scale, int act
__device__ __forceinline__ void decode_layers_body(DL_ARGS) {
    const DlArgs a{layers, n_layers, x, q, attn, parts, h, count, pos, slots, meta, tables, inv_freq,
                   hidden, n_heads, n_kv, hd, ffn, bs, nparts, ring, eps, scale, act};
    dl_init(a.ring);
    if (threadIdx.x >= 32 * dl_warps()) {  // the streaming warp: weights alone, which no kernel before writes
        dl_stream(a);
        return;
    }
    pdl_wait();
    dl_compute(a);
}
// Two instances by the most computing warps a block runs (8 or 16): an SM's
// registers are four files, one per quarter of its warps, so 17 warps may
// hold 96 registers each (the tile steps spill) and 9 warps 168.
#define DECODE_LAYERS(W)                                                                        \
    extern "C" __global__ void __launch_bounds__(32 * (W + 1), 1) decode_layers_##W(DL_ARGS) { \
        decode_layers_body(layers, n_layers, x, q, attn, parts, h, count, pos, slots, meta, tables, inv_freq,  \
                           hidden, n_heads, n_kv, hd, ffn, bs, nparts, ring, eps, scale, act);     \
    }
DECODE_LAYERS(8)
DECODE_LAYERS(16)
