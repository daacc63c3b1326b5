// A layer's attention half of a one-row decode step in one launch (host:
// cuda/decode_window.rs; off unless FERRITE_CUDA_PERSISTENT=1 and
// FERRITE_CUDA_PERSISTENT_WINDOW=1 or 2): the input norm and quantization, the
// q/k/v tiles with RoPE and the KV write, decode attention and the output
// projection added to the residual. The layer's MLP then runs as the chain
// of kernels runs it. Compiled after decode_layers.cu, whose primitives
// (bulk copies, mbarriers, waits, the input build, the tile readers and the
// layer table) it uses.
//
// Why: in the chain this stretch takes about 17.6 us a layer for weights
// the copy rate moves in 5.5 (Llama-3.1-8B Q4_K_M, docs/cuda-journal.md),
// and they fit the GPU's shared memory. So every block asks for all of its
// weight tiles at once, before it waits for the kernel before, and the
// stages depend on each other per KV head rather than grid-wide:
//   - every block with q/k/v tiles builds the normed 8-bit input itself,
//     then counts that it has read x (the output tiles add to x once every
//     such block has);
//   - q/k/v tiles b, b + grid, ... run with the chain's RoPE/KV epilogue
//     and are counted done per KV head;
//   - attention items (KV head, part of the context) go to blocks b <
//     n_kv x nparts; a step uses as many parts as its length needs. Cached
//     keys load before the wait for the KV head's q/k/v tiles. The last
//     part to finish merges the parts and quantizes the KV head's outputs
//     as the output projection's input (whole super-blocks: G x hd a
//     multiple of 256), then flags the KV head ready;
//   - output-projection tiles go from the grid's other end (blocks with a
//     q/k/v tile fewer take one more); each warp waits only for the KV
//     heads its super-blocks read;
//   - where asked (`fq`), the MLP's input: each super-block of x, once its
//     16 output tiles are added, normed and quantized by a warp as the
//     chain's gate/up GEMV reads it (with its sum of squares), so that no
//     kernel of its own stands between this one and that GEMV.
// No wait is grid-wide; the last block to finish zeroes the counters.
// Measured (H100): correct, but 0.82-0.84x the chain's speed in every
// request order below; kept, off by default, as the record. Started beside
// the down GEMV (down on half of each SM, so the tiles arrive before the
// wait; H200, forty-sixth session) its stages after the wait still took
// about 30 us a layer: not the tiles but this chain of stages is the cost.

#define DW_MAX_WARPS 16  // warps a block at most (16 or 8: `decode_window_8`, below)
#define DW_MAX_TILES 16
#define DW_KEYS 4  // keys a warp of attention loads at once
// Variants to measure (`FERRITE_CUDA_DEFINES`, scripts/gpu-window.sh):
// rounds of keys a warp a part of the context takes (more parts, more merges
// the fewer), and DW_COUNT_EACH: each q/k/v tile counted done for its KV
// head as soon as warp 0 has stored it (a fence a tile), not all of the
// block's after one fence.
#ifndef DW_PART_ROUNDS
#define DW_PART_ROUNDS 2
#endif
// When the tiles are asked for (the stages' small loads wait behind the
// tiles in flight, H100 trace: the input build 2-7 us, the q/k/v tiles done
// 9.5 us after it): 0 all before the wait for the kernel before; 1 the
// q/k/v tiles then, the output tiles once the block's q/k/v are done; 2 the
// q/k/v tiles after the input build, the output tiles as 1.
#ifndef DW_REQUEST_ORDER
#define DW_REQUEST_ORDER 0
#endif
// DW_REQUEST_AHEAD=K (instead of an order): K tiles a block in flight at
// most, tile t + K asked for once tile t has arrived (132 SMs x one 36 KB
// tile is already about a microsecond of the copy rate: a queue that short
// delays the stages' own loads by no more than that). Measured: K = 1 or 2
// 0.836x the chain, orders 1 and 2 0.82x, against 0.816x all at once: a
// block's tiles then arrive one after another at its SM's share of the
// bandwidth, so q/k/v still take 11 us.
#ifndef DW_REQUEST_AHEAD
#define DW_REQUEST_AHEAD 0
#endif

// The counters (3 n_kv + 2 + hidden / 256 words, zero at the start): per KV
// head its q/k/v tiles done, its attention parts done and its output ready;
// the blocks that have read x and the blocks done; per super-block of x its
// output tiles added.
struct DwCount {
    u32 *qkv, *parts, *ready, *xread, *done, *ffn;
};
__device__ __forceinline__ DwCount dw_count(u32* c, u32 n_kv) {
    return DwCount{c, c + n_kv, c + 2 * n_kv, c + 3 * n_kv, c + 3 * n_kv + 1, c + 3 * n_kv + 2};
}
__device__ __forceinline__ u32 dw_count_words(u32 n_kv, u32 hidden) { return 3 * n_kv + 2 + hidden / 256; }

struct DwArgs {
    const DlLayer* L;
    float *x, *q, *parts;
    signed char* oq;  // the output projection's input (`store_sb`), n_heads x hd values
    u32* ometa;
    DwCount c;
    const u32 *pos, *slots, *meta, *tables;
    const float* inv_freq;
    u32 hidden, n_heads, n_kv, hd, bs, nparts, tile_bytes;
    float eps, scale;
    signed char* fq;  // the MLP's input (`store_sb`, with its squares), or null: not made here
    u32* fmeta;
    float* fss;
};

// Offsets of the dynamic shared memory (decode_window.rs `fixed_bytes`
// sizes the part after the tiles the same way).
struct DwSmem {
    u64* bar;              // a barrier a tile
    unsigned char* tiles;  // the block's tiles, in the order they are taken
    signed char* xq;       // the normed 8-bit input
    u32* meta;
    float* ss;
    float4* red;  // the warps' partial sums (two buffers), or attention's states
    float* small;
};
__device__ __forceinline__ DwSmem dw_layout(const DwArgs& a) {
    DwSmem s;
    const u32 nsb = a.hidden / 256;
    s.bar = (u64*)dl_smem;
    s.tiles = dl_smem + 8 * DW_MAX_TILES;
    s.xq = (signed char*)(s.tiles + a.tile_bytes);
    s.meta = (u32*)(s.xq + a.hidden);
    s.ss = (float*)(s.meta + 8 * nsb);
    s.red = (float4*)(s.ss + 4 * ((nsb + 3) / 4));
    s.small = (float*)(s.red + 2 * DW_MAX_WARPS * 32);
    return s;
}

// Warps a block (the instance's: 16 or 8).
__device__ __forceinline__ u32 dw_warps() { return blockDim.x >> 5; }

// ------------------------------------------------------------------ the block's tiles
__device__ __forceinline__ u32 dw_qkv_tiles(const DlLayer& L) {
    return dl_tiles(L.m[M_Q]) + dl_tiles(L.m[M_K]) + dl_tiles(L.m[M_V]);
}
// How many of `tiles` the block takes from `first` on, a grid apart (its
// q/k/v tiles from b, its output tiles from grid - 1 - b).
__device__ __forceinline__ u32 dw_mine(u32 tiles, u32 first) {
    return first < tiles ? (tiles - 1 - first) / gridDim.x + 1 : 0;
}
// The block's t-th tile: its matrix, its tile within it, and its input's
// super-blocks.
__device__ __forceinline__ u32 dw_tile(const DwArgs& a, u32 t, u32 nqkv, u32& tile, u32& nsb) {
    if (t < nqkv) {
        nsb = a.hidden / 256;
        return dl_mat(*a.L, DL_QKV, blockIdx.x + t * gridDim.x, 0, tile);
    }
    nsb = a.n_heads * a.hd / 256;
    tile = gridDim.x - 1 - blockIdx.x + (t - nqkv) * gridDim.x;
    return M_O;
}

// Thread 0: a barrier each for the block's tiles.
__device__ __forceinline__ void dw_init_barriers(const DwSmem& S, u32 ntiles) {
    if (threadIdx.x != 0) return;
    for (u32 t = 0; t < ntiles; t++) dl_mbar_init(S.bar + t, 1);
#if __CUDA_ARCH__ >= 900
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
#endif
}
// The block's t-th tile: its matrix, its tile within it and its bytes.
__device__ __forceinline__ const DlMat& dw_tile_at(const DwArgs& a, u32 t, u32 nqkv, u32& tile, u32& bytes) {
    u32 nsb;
    const DlMat& M = a.L->m[dw_tile(a, t, nqkv, tile, nsb)];
    bytes = nsb * dl_block(M.type);
    return M;
}
// Thread 0: the block's tiles t0 .. t1 asked for (at byte `off` of the
// tiles; weights only, so it may run before the wait for the kernel before).
__device__ __forceinline__ void dw_request(const DwArgs& a, const DwSmem& S, u32 t0, u32 t1, u32 nqkv, u64 off) {
    if (threadIdx.x != 0) return;
    for (u32 t = t0; t < t1; t++) {
        u32 tile, bytes;
        const DlMat& M = dw_tile_at(a, t, nqkv, tile, bytes);
        dl_copy(S.tiles + off, M.w + (u64)tile * bytes, bytes, S.bar + t);
        off += bytes;
    }
}
// Thread 0, once tile t has arrived: tile t + DW_REQUEST_AHEAD asked for
// (at the sum of the bytes of the tiles before it).
__device__ __forceinline__ void dw_request_next(const DwArgs& a, const DwSmem& S, u32 t, u32 ntiles, u32 nqkv) {
#if DW_REQUEST_AHEAD > 0
    const u32 next = t + DW_REQUEST_AHEAD;
    if (threadIdx.x != 0 || next >= ntiles) return;
    u64 off = 0;
    for (u32 i = 0; i < next; i++) {
        u32 tile, bytes;
        dw_tile_at(a, i, nqkv, tile, bytes);
        off += bytes;
    }
    dw_request(a, S, next, next + 1, nqkv, off);
#endif
}

// One super-block of a tile in shared memory against an input's fragments.
__device__ __forceinline__ void dw_sb(const unsigned char* sb, u32 type, const DlIn& in, u32 lane,
                                      float (&acc)[4]) {
    if (type == 0) q4k_step<1>(dl_q4k(sb, lane), in.x, in.h, in.bs, in.h, in.bs, acc);
    else q6k_step<1>(dl_q6k(sb, lane), in.x, in.h, in.h, acc);
}

// The warps' sums of a tile, summed in a fixed order by warp 0 (lane (g, i):
// rows g and g + 8 in [0] and [2]); two buffers by the tile's parity, so one
// block barrier a tile serves (see `dl_tile`).
__device__ __forceinline__ void dw_reduce(const DwSmem& S, u32 t, float (&acc)[4]) {
    const u32 lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    float4* red = S.red + (t & 1) * DW_MAX_WARPS * 32;
    red[warp * 32 + lane] = make_float4(acc[0], acc[1], acc[2], acc[3]);
    __syncthreads();
    if (warp != 0) return;
#pragma unroll
    for (u32 w = 1; w < DW_MAX_WARPS; w++) {  // (a constant bound: a loop to dw_warps() spills)
        if (w >= dw_warps()) break;
        const float4 p = red[w * 32 + lane];
        acc[0] += p.x, acc[1] += p.y, acc[2] += p.z, acc[3] += p.w;
    }
}

// The KV head whose attention reads tile `tile` of q, k or v (matrix mi).
__device__ __forceinline__ u32 dw_tile_kv_head(const DwArgs& a, u32 mi, u32 tile) {
    const u32 head = 16 * tile / a.hd;
    return mi == M_Q ? head / (a.n_heads / a.n_kv) : head;
}

// The block's q/k/v tiles against the normed input (factor f), RoPE and the
// KV write in warp 0's epilogue; then, after one fence, each counted done
// for its KV head (DW_COUNT_EACH: each at once). `off`: the tiles' bytes
// so far.
__device__ __forceinline__ void dw_qkv(const DwArgs& a, const DwSmem& S, u32 nqkv, u32 ntiles, float f, u64& off) {
    const DlLayer& L = *a.L;
    const u32 lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2;
    const RopeKv rk{a.pos, a.inv_freq, a.slots, L.kc, L.vc, a.hd, a.n_kv * a.hd};
    for (u32 t = 0; t < nqkv; t++) {
        u32 tile, nsb;
        const u32 mi = dw_tile(a, t, nqkv, tile, nsb), row = 16 * tile + g, m = L.m[mi].rows;
        const u32 type = L.m[mi].type, block = dl_block(type);
        RopeKvLane rl{};
        if (warp == 0) rl = rope_kv_lane(rk, mi, row, m);  // (its loads off the tile's tail)
        dl_mbar_wait(S.bar + t, 0);
        trace_mark("dw.qkv.tile");  // (its wait over: the tile has arrived)
        dw_request_next(a, S, t, ntiles, nqkv);
        float acc[4] = {0.f, 0.f, 0.f, 0.f};
        for (u32 sb = warp; sb < nsb; sb += dw_warps())
            dw_sb(S.tiles + off + (u64)sb * block, type, dl_in_at(S.xq, S.meta, sb, lane & 3), lane, acc);
        off += (u64)nsb * block;
        dw_reduce(S, t, acc);
        if (warp != 0) continue;
        rope_kv_rows2(rk, rl, mi, row, m, acc[0] * f, acc[2] * f, (lane & 3) == 0, a.q);
#ifdef DW_COUNT_EACH
        __syncwarp();
        if (lane == 0) {
            __threadfence();
            atomicAdd(a.c.qkv + dw_tile_kv_head(a, mi, tile), 1u);
        }
#endif
    }
    __syncthreads();
#ifndef DW_COUNT_EACH
    if (threadIdx.x == 0 && nqkv > 0) {
        __threadfence();
        for (u32 t = 0; t < nqkv; t++) {
            u32 tile, nsb;
            const u32 mi = dw_tile(a, t, nqkv, tile, nsb);
            atomicAdd(a.c.qkv + dw_tile_kv_head(a, mi, tile), 1u);
        }
    }
#endif
}

// ------------------------------------------------------------------ attention
// Raw f16 bits of a lane's E values (2 or 4) of a cached key and value.
__device__ __forceinline__ void dw_kv_raw(const DlLayer& L, u64 at, bool fresh, u32 E, uint2& k, uint2& v) {
    if (E == 4) {
        k = fresh ? __ldcg((const uint2*)(L.kc + at)) : *(const uint2*)(L.kc + at);
        v = fresh ? __ldcg((const uint2*)(L.vc + at)) : *(const uint2*)(L.vc + at);
    } else {
        k.x = fresh ? __ldcg((const u32*)(L.kc + at)) : *(const u32*)(L.kc + at);
        v.x = fresh ? __ldcg((const u32*)(L.vc + at)) : *(const u32*)(L.vc + at);
        k.y = v.y = 0;
    }
}
__device__ __forceinline__ float dw_half(uint2 w, int e) {
    return f16_to_f32((u16)((e < 2 ? w.x : w.y) >> (16 * (e & 1))));
}

// Parts of the context a step's attention takes: enough for DW_PART_ROUNDS
// rounds of keys a warp, at most `nparts` (the blocks set aside a KV head).
__device__ __forceinline__ u32 dw_active_parts(const DwArgs& a, u32 len) {
    const u32 R = dw_warps() / (a.n_heads / a.n_kv), per = DW_PART_ROUNDS * DW_KEYS * R;
    return min(a.nparts, (len + per - 1) / per);
}

// Warp w's keys of a part, a round of DW_KEYS (t, t + R, ...): their cache
// rows, then their raw bits; the step's own key (written by this launch) is
// left for `fresh_only` after the wait.
struct DwRound {
    uint2 k[DW_KEYS], v[DW_KEYS];
};
__device__ __forceinline__ void dw_load_round(const DwArgs& a, u32 kvh, u32 t, u32 R, u32 t1, u32 hi, bool fresh_only,
                                              DwRound& r) {
    const u32 lane = threadIdx.x & 31, hd = a.hd, E = hd / 32, kv_dim = a.n_kv * hd, off = a.meta[2];
    const u32 own = hi - 1;  // the step's own key
    if (fresh_only && (own < t || own >= t + DW_KEYS * R || (own - t) % R != 0 || own >= t1)) return;
    u64 at[DW_KEYS];
#pragma unroll
    for (int b = 0; b < DW_KEYS; b++) {
        const u32 tb = min(t + b * R, t1 - 1);
        const u64 slot = (u64)a.tables[off + tb / a.bs] * a.bs + tb % a.bs;
        at[b] = slot * kv_dim + (u64)kvh * hd + E * lane;
    }
#pragma unroll
    for (int b = 0; b < DW_KEYS; b++) {
        const u32 tb = t + b * R;
        const bool fresh = tb + 1 == hi;
        if (tb < t1 && fresh == fresh_only) dw_kv_raw(*a.L, at[b], fresh, E, r.k[b], r.v[b]);
    }
}

// The KV head's outputs (G x hd values in `o`, shared) as the output
// projection's input, then the KV head flagged ready.
__device__ __forceinline__ void dw_publish(const DwArgs& a, const float* o, u32 kvh) {
    const u32 lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const u32 nsb = a.n_heads / a.n_kv * a.hd / 256;
    if (warp < nsb) {
        float v[8];
#pragma unroll
        for (int e = 0; e < 8; e++) v[e] = o[256 * warp + 8 * lane + e];
        store_sb((u64)kvh * nsb + warp, lane, v, a.oq, a.ometa);
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        __threadfence();
        atomicExch(a.c.ready + kvh, 1u);
    }
}

// Item (KV head kvh, part p of np): warp w takes query head kvh G + w % G
// and keys r, r + R, ... of the part (r = w / G, R = 16 / G); the R states
// of each head merge in order in shared memory. One part: the outputs are
// published at once; more: the part's states go to `parts`, and the last
// part to finish merges them all.
__device__ __forceinline__ void dw_attention(const DwArgs& a, const DwSmem& S, u32 kvh, u32 p, u32 np) {
    const u32 lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const u32 G = a.n_heads / a.n_kv, R = dw_warps() / G, hd = a.hd, E = hd / 32, h = kvh * G + warp % G;
    const u32 lo = a.meta[0], hi = a.meta[1], len = hi - lo;
    const u32 t0 = lo + (u32)((u64)len * p / np), t1 = lo + (u32)((u64)len * (p + 1) / np);
    DwRound r{};
    const u32 first = t0 + warp / G;
    if (first < t1) dw_load_round(a, kvh, first, R, t1, hi, false, r);  // older keys: before the wait
    trace_mark("dw.attn.wait");
    if (threadIdx.x == 0) {
        dl_wait_count(a.c.qkv + kvh, (G + 2) * hd / 16);
        __threadfence();
    }
    __syncthreads();
    trace_mark("dw.attn");
    float q[4] = {0.f, 0.f, 0.f, 0.f}, o[4] = {0.f, 0.f, 0.f, 0.f}, m = -1e30f, sum = 0.f;
#pragma unroll
    for (u32 e = 0; e < 4; e++)
        if (e < E) q[e] = __ldcg(a.q + h * hd + E * lane + e) * a.scale;
    for (u32 t = first; t < t1; t += DW_KEYS * R) {
        dw_load_round(a, kvh, t, R, t1, hi, true, r);  // the step's own key, if in this round
#pragma unroll
        for (int b = 0; b < DW_KEYS; b++) {
            if (t + b * R >= t1) break;
            float dot = 0.f;
#pragma unroll
            for (int e = 0; e < 4; e++) dot += q[e] * dw_half(r.k[b], e);  // (zeros past E)
            dot = warp_sum(dot);
            const float mn = fmaxf(m, dot), c = __expf(m - mn), pr = __expf(dot - mn);
            sum = sum * c + pr;
#pragma unroll
            for (int e = 0; e < 4; e++) o[e] = o[e] * c + pr * dw_half(r.v[b], e);
            m = mn;
        }
        if (t + DW_KEYS * R < t1) dw_load_round(a, kvh, t + DW_KEYS * R, R, t1, hi, false, r);
    }
    // The warps' states (16 x hd floats), then the heads' merged outputs
    // (G x hd) after them, in the reduction buffers (free since the tiles).
    float* st = (float*)S.red;
    float* out = st + DW_MAX_WARPS * hd;
#pragma unroll
    for (u32 e = 0; e < 4; e++)
        if (e < E) st[warp * hd + E * lane + e] = o[e];
    if (lane == 0) S.small[warp] = m, S.small[DL_MAX_WARPS + warp] = sum;  // (`dl_merge_states`)
    __syncthreads();
    if (warp < G) {  // head kvh G + warp: its R states in order
        float mx, tot, acc[4];
        dl_merge_states(st, S.small, warp, G, R, hd, mx, tot, acc);
        if (np == 1) {
#pragma unroll
            for (u32 e = 0; e < 4; e++)
                if (e < E) out[warp * hd + E * lane + e] = acc[e] / tot;
        } else {
            dl_store_part(a.parts, p, a.n_heads, h, hd, mx, tot, acc);
        }
    }
    __syncthreads();
    if (np > 1) {
        if (threadIdx.x == 0) {
            __threadfence();
            S.small[2 * DW_MAX_WARPS] = atomicAdd(a.c.parts + kvh, 1u) + 1 == np ? 1.f : 0.f;
            __threadfence();
        }
        __syncthreads();
        if (S.small[2 * DW_MAX_WARPS] == 0.f) return;  // not the last part
        for (u32 t = threadIdx.x; t < G * hd; t += blockDim.x)
            out[t] = dl_merge_parts(a.parts, np, a.n_heads, kvh * G + t / hd, hd, t % hd);
        __syncthreads();
    }
    dw_publish(a, out, kvh);
}

// ------------------------------------------------------------------ the output projection
// Until the KV head's output is ready (every lane: an acquire load each).
__device__ __forceinline__ void dw_wait_ready(const u32* flag) {
    const u64 start = dl_now();
    for (;;) {
        u32 v;
        asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(flag) : "memory");
        if (v) return;
        dl_check_wait(start);
    }
}
// Super-block sb of the output projection's input as a lane's fragments
// (written by this launch: read past L1).
__device__ __forceinline__ DlIn dw_oin(const DwArgs& a, u32 sb, u32 i) {
    const uint4* xs = (const uint4*)(a.oq + 256 * (u64)sb + 64 * i);
    const uint4* m = (const uint4*)a.ometa;
    return DlIn{{__ldcg(xs), __ldcg(xs + 1), __ldcg(xs + 2), __ldcg(xs + 3)}, __ldcg(m + 2 * sb),
                __ldcg(m + 2 * sb + 1)};
}

// The block's output tiles (barriers nqkv ..), each added to x once every
// block has read x. Each warp waits for the KV heads of its super-blocks.
__device__ __forceinline__ void dw_oproj(const DwArgs& a, const DwSmem& S, u32 nqkv, u32 ntiles, u32 readers, u64 off) {
    const DlLayer& L = *a.L;
    const u32 lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2;
    const u32 nsb = a.n_heads * a.hd / 256, per_kv = nsb / a.n_kv;
    if (nqkv == ntiles) return;
    for (u32 sb = warp; sb < nsb; sb += dw_warps()) dw_wait_ready(a.c.ready + sb / per_kv);
    trace_mark("dw.o.ready");
    bool x_free = false;
    for (u32 t = nqkv; t < ntiles; t++) {
        u32 tile, n;
        dw_tile(a, t, nqkv, tile, n);
        const u32 row = 16 * tile + g, type = L.m[M_O].type, block = dl_block(type);
        float base[2] = {0.f, 0.f};
        if (warp == 0 && (lane & 3) == 0) base[0] = __ldcg(a.x + row), base[1] = __ldcg(a.x + row + 8);
        // (The warp's first super-block of input asked for before the wait:
        // held over all the tiles instead, it spills.)
        DlIn in = warp < nsb ? dw_oin(a, warp, lane & 3) : DlIn{};
        dl_mbar_wait(S.bar + t, 0);
        trace_mark("dw.o.tile");
        dw_request_next(a, S, t, ntiles, nqkv);
        float acc[4] = {0.f, 0.f, 0.f, 0.f};
        for (u32 sb = warp; sb < nsb; sb += dw_warps()) {
            dw_sb(S.tiles + off + (u64)sb * block, type, in, lane, acc);
            if (sb + dw_warps() < nsb) in = dw_oin(a, sb + dw_warps(), lane & 3);
        }
        off += (u64)nsb * block;
        dw_reduce(S, t, acc);
        if (warp != 0) continue;
        if (!x_free) {  // (every block read x long before, but it must be so)
            if (lane == 0) dl_wait_count(a.c.xread, readers);
            __syncwarp();
            x_free = true;
        }
        if ((lane & 3) == 0) a.x[row] = base[0] + acc[0], a.x[row + 8] = base[1] + acc[2];
        if (a.fq) {  // (the tile's rows counted added to their super-block)
            __syncwarp();
            if (lane == 0) {
                __threadfence();
                atomicAdd(a.c.ffn + tile / 16, 1u);
            }
        }
    }
}

// The MLP's input where asked: super-block sb of x (256 rows, 16 output
// tiles) by warp w of block b, sb = b + (15 - w) grid (the last warp first:
// warp 0 ends the output tiles), once its tiles are added; normed by
// ffn_norm and quantized with its sum of squares, as the chain's
// `quantize_x8_sb` writes it.
__device__ __forceinline__ void dw_ffn_input(const DwArgs& a) {
    const u32 lane = threadIdx.x & 31, warp = dw_warps() - 1 - (threadIdx.x >> 5), nsb = a.hidden / 256;
    if (!a.fq) return;
    for (u32 sb = blockIdx.x + warp * gridDim.x; sb < nsb; sb += dw_warps() * gridDim.x) {
        if (lane == 0) {
            dl_wait_count(a.c.ffn + sb, 16);
            __threadfence();
        }
        __syncwarp();
        dl_input_warps(a.fq + 256 * sb, a.fmeta + 8 * sb, a.fss + sb, a.x + 256 * sb, a.L->ffn_norm + 256 * sb, 256,
                       0, 1);
    }
}

// ------------------------------------------------------------------ the kernel
// The block's share of the layer: its q/k/v tiles, all its tiles, and the
// blocks that read x (those with q/k/v tiles).
struct DwShare {
    u32 nqkv, ntiles, readers;
};
__device__ __forceinline__ DwShare dw_share(const DwArgs& a) {
    const u32 qkv_tiles = dw_qkv_tiles(*a.L), o_tiles = dl_tiles(a.L->m[M_O]);
    const u32 nqkv = dw_mine(qkv_tiles, blockIdx.x);
    return DwShare{nqkv, nqkv + dw_mine(o_tiles, gridDim.x - 1 - blockIdx.x), min(gridDim.x, qkv_tiles)};
}

// After the wait for the kernel before.
__device__ __forceinline__ void dw_run(const DwArgs& a, const DwSmem& S, const DwShare& my) {
    float f = 1.f;
    if (my.nqkv > 0) {
        trace_mark("dw.input");
        dl_input_warps(S.xq, S.meta, S.ss, a.x, a.L->attn_norm, a.hidden, threadIdx.x >> 5, dw_warps());
        __syncthreads();
        f = dl_norm_factor(S.ss, a.hidden, a.eps);
        if (threadIdx.x == 0) {
            __threadfence();
            atomicAdd(a.c.xread, 1u);
        }
        trace_mark("dw.qkv");
    }
    u64 off = 0;
#if DW_REQUEST_ORDER == 2 && DW_REQUEST_AHEAD == 0
    dw_request(a, S, 0, my.nqkv, my.nqkv, 0);
#endif
    dw_qkv(a, S, my.nqkv, my.ntiles, f, off);
#if DW_REQUEST_ORDER > 0 && DW_REQUEST_AHEAD == 0
    dw_request(a, S, my.nqkv, my.ntiles, my.nqkv, off);
#endif
    const u32 len = a.meta[1] - a.meta[0], np = dw_active_parts(a, len);
    const u32 kvh = blockIdx.x / a.nparts, p = blockIdx.x % a.nparts;
    if (kvh < a.n_kv && p < np) dw_attention(a, S, kvh, p, np);
    __syncthreads();  // (attention's use of the reduction buffers over)
    trace_mark("dw.oproj");
    dw_oproj(a, S, my.nqkv, my.ntiles, my.readers, off);
    dw_ffn_input(a);
    __syncthreads();
    if (threadIdx.x == 0) {
        __threadfence();
        // The last block: no block reads a counter any more, so it zeroes
        // them for the next launch (no memset before it).
        if (atomicAdd(a.c.done, 1u) + 1 == gridDim.x)
            for (u32 i = 0; i < dw_count_words(a.n_kv, a.hidden); i++) a.c.qkv[i] = 0;
    }
}

__device__ __forceinline__ void decode_window_body(const DlLayer* layers, u32 l, float* x, float* q, float* parts,
                                                   signed char* oq, u32* ometa, u32* count, const u32* pos,
                                                   const u32* slots, const u32* meta, const u32* tables,
                                                   const float* inv_freq, u32 hidden, u32 n_heads, u32 n_kv, u32 hd,
                                                   u32 bs, u32 nparts, u32 tile_bytes, float eps, float scale,
                                                   signed char* fq, u32* fmeta, float* fss) {
    const DwArgs a{layers + l, x,      q,       parts, oq, ometa, dw_count(count, n_kv), pos, slots, meta, tables,
                   inv_freq,   hidden, n_heads, n_kv,  hd, bs,    nparts, tile_bytes, eps, scale, fq, fmeta, fss};
    const DwSmem S = dw_layout(a);
    const DwShare my = dw_share(a);
    dw_init_barriers(S, my.ntiles);
#if DW_REQUEST_AHEAD > 0
    dw_request(a, S, 0, min(my.ntiles, (u32)DW_REQUEST_AHEAD), my.nqkv, 0);
#elif DW_REQUEST_ORDER == 0
    dw_request(a, S, 0, my.ntiles, my.nqkv, 0);  // (weights and the layer table only: no kernel writes them)
#elif DW_REQUEST_ORDER == 1
    dw_request(a, S, 0, my.nqkv, my.nqkv, 0);
#endif
    __syncthreads();  // (the barriers initialized)
    pdl_wait();
    dw_run(a, S, my);
}
// Two instances by the warps a block runs: 16, a block holding an SM's
// whole register file (128 registers a thread); 8 at the same 128, half of
// it, so that a block can start on an SM where the kernel before still
// runs blocks (the shared memory of one block an SM is the same).
#define DECODE_WINDOW(NAME, W, MIN_BLOCKS)                                                                      \
    extern "C" __global__ void __launch_bounds__(32 * W, MIN_BLOCKS)                                          \
        NAME(const DlLayer* layers, u32 l, float* x, float* q, float* parts, signed char* oq, u32* ometa,      \
             u32* count, const u32* pos, const u32* slots, const u32* meta, const u32* tables,                  \
             const float* inv_freq, u32 hidden, u32 n_heads, u32 n_kv, u32 hd, u32 bs, u32 nparts,             \
             u32 tile_bytes, float eps, float scale, signed char* fq, u32* fmeta, float* fss) {                 \
        decode_window_body(layers, l, x, q, parts, oq, ometa, count, pos, slots, meta, tables, inv_freq, hidden, \
                           n_heads, n_kv, hd, bs, nparts, tile_bytes, eps, scale, fq, fmeta, fss);             \
    }
DECODE_WINDOW(decode_window, 16, 1)
DECODE_WINDOW(decode_window_8, 8, 2)
