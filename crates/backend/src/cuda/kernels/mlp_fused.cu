// A one-row decode step's MLP in one launch (host: cuda/mlp_fused.rs; off
// unless FERRITE_CUDA_MLP_FUSED=1): x += down(act(gate(xn)) * up(xn)) for
// Q4_K gate, up and down in tiles (gemv_tile.cu), xn the normed 8-bit input
// `quantize_x8_sb` wrote. Compiled after decode_layers.cu (its waits).
//
// Why: the chain runs gate/up, the gated quantization and down as three
// kernels, each waiting for the whole of the one before, and the weights
// stop streaming across each boundary (the MLP takes about 47 us a layer on
// an H100 for bytes the copy rate moves in 33-38, docs/cuda-journal.md).
// Here down depends on gate/up per group of 256 rows of the intermediate
// (one of down's super-block columns), not grid-wide:
//   - A units: a gate or up tile, MF_A_STEPS of its super-blocks, summed
//     into `acc` (f32, zeroed by the launch before) and counted per group;
//   - B units: MF_B_STEPS of down's tiles on one group's super-block
//     column, once its A units are all counted: act(gate) * up of its 256
//     rows quantized as `quantize_x8_sb` would, each tile's sums added to x (red.add: the
//     order of a row's 56 additions varies from run to run, so this path is
//     never the batch-invariant one);
//   - one list, every A unit before every B unit, handed out in its order
//     (`mf_advance`), so that a group is done before its B units start and a
//     warp goes on to down's weights as soon as gate/up's run out, with
//     no wait for the rest of the grid. Every warp is resident (one block
//     of MF_WARPS an SM). Each warp keeps two super-blocks of weights
//     in flight across its units, as `gemv_tile_body` does within a tile.
// Measured on an H100 (docs/cuda-journal.md, forty-first session): 0.94x
// the chain's speed; under `ncu` 49-52 us for the 99 MB its two GEMVs read
// in 44, at about 290 instructions a super-block against their 187 (the
// list's and the group's work), so at best it would match the chain: off
// by default, kept as the record.
// The last warp to finish zeroes the counters. With FERRITE_CUDA_TRACE=2
// the first warp marks each of its units' ends (mf.unit.gu, mf.unit.down)
// and each wait for a group (mf.ready) on the decode timeline.

// Steps a unit, each a tile's super-block (A: of one tile, B: of as many
// tiles). An A unit takes MF_A_STEPS (a power of 2) super-blocks, halved
// until they divide a row's (at least 4: `takes` checks); fewer, longer A
// units mean fewer of their fences and counts, which stall the warp (its
// weights in flight too) for a round trip each.
#ifndef MF_A_STEPS
#define MF_A_STEPS 4
#endif
#define MF_B_STEPS 4
// Warps a block, at most (mlp_fused.rs `WARPS`).
#define MF_WARPS 14
// The counters before the groups' (at fixed places, whatever a launch's
// shape: launches of other shapes share them): launches, warps done, units
// handed out.
#define MF_CNT 3

// The list: every A unit (gate/up) first, group by group, then every B
// unit (down), group by group.
struct MfShape {
    u32 groups, ua, ub, na, total;  // units a group (A, B); A units, all units
    u32 sa, parts;                  // steps an A unit; A units a tile
};
struct MfStep {
    bool b;     // a B (down) unit
    u32 group;  // of the intermediate (B: its super-block column)
    u32 tile;   // in its matrix (A: 0..2F/16, up after gate)
    u32 sb;     // super-block of the tile's rows
    bool first, last;
};
__device__ __forceinline__ u32 mf_len(const MfShape& m, u32 u) { return u < m.na ? m.sa : MF_B_STEPS; }
// Unit u's first step (`mf_nth` gives the others).
__device__ __forceinline__ MfStep mf_first(const MfShape& m, u32 u) {
    MfStep st;
    st.b = u >= m.na;
    st.first = true;
    if (st.b) {
        const u32 v = u - m.na;
        st.group = v / m.ub, st.tile = (v % m.ub) * MF_B_STEPS, st.sb = st.group;
        st.last = true;  // (each B step ends a tile's sums)
    } else {
        // rem: tile t of the group's 32 (gate 0..15, up 16..31), part p.
        const u32 r = u / m.ua, rem = u % m.ua, t = rem / m.parts, p = rem % m.parts;
        st.group = r, st.tile = (t >> 4) * (m.groups * 16) + 16 * r + (t & 15), st.sb = p * m.sa;
        st.last = m.sa == 1;
    }
    return st;
}

struct MfArgs {
    const u8 *wg, *wu, *wd;  // tiles (Q4_K): gate, up (F rows of H), down (H rows of F)
    u64 rb_gu, rb_d;         // bytes a row
    const signed char* xq;   // xn, 8-bit (quantize_x8_sb)
    const u32* meta;
    const float* ss;  // xn's squares per super-block (the norm)
    float eps;
    int act;
    float* x;    // the residual, added to
    float* acc;  // this launch's gate then up sums (2F, zero when it starts)
    u32* cnt;    // launches, warps done, units handed out; then per group its A units done (MF_CNT)
    u32 hidden;
};

__device__ __forceinline__ const u8* mf_tile(const MfArgs& a, const MfShape& m, const MfStep& st) {
    if (st.b) return a.wd + (u64)st.tile * 16 * a.rb_d;
    const u32 f_tiles = m.groups * 16;
    return st.tile < f_tiles ? a.wg + (u64)st.tile * 16 * a.rb_gu : a.wu + (u64)(st.tile - f_tiles) * 16 * a.rb_gu;
}

// An A unit's sums (rows g and g + 8 of its tile, lanes i = 0) added into
// `acc`, then counted for its group (fenced: the adds first). No answer is
// waited for: the B units finish the group.
__device__ __forceinline__ void mf_end_a(const MfArgs& a, const MfStep& st, float (&acc)[4], float norm, u32 lane) {
    if ((lane & 3) == 0) {
        const u32 row = 16 * st.tile + (lane >> 2);
        atomicAdd(a.acc + row, acc[0] * norm);
        atomicAdd(a.acc + row + 8, acc[2] * norm);
    }
    acc[0] = acc[1] = acc[2] = acc[3] = 0.f;
    __threadfence();
    __syncwarp();
    if (lane == 0) atomicAdd(a.cnt + MF_CNT + st.group, 1u);
}

// A B unit's input, once every A unit of group j has added its sums (read
// past L1: written in this launch): act(gate) * up of the group's 256 rows
// (8 a lane) quantized by `store_sb` into the warp's own room in shared
// memory (`xs`, `ms`), which the unit's steps then read as an A step reads
// xn. Every B unit of the group does this itself rather than one warp
// storing it for the rest: a store, a fence and a flag fewer on the path
// from the group's last A unit to its B units, which at the list's end
// wait on that path.
__device__ __forceinline__ void mf_group_input(const MfArgs& a, const MfShape& m, u32 j, u32 lane, signed char* xs,
                                               u32* ms) {
    if (lane == 0) dl_wait_count(a.cnt + MF_CNT + j, m.ua);
    __syncwarp();
    trace_mark("mf.ready");
    const u64 f = (u64)m.groups * 256, at = 256 * (u64)j + 8 * lane;
    float v[8];
#pragma unroll
    for (int e = 0; e < 2; e++) {
        const float4 g = __ldcg((const float4*)(a.acc + at + 4 * e));
        const float4 up = __ldcg((const float4*)(a.acc + f + at + 4 * e));
        v[4 * e] = act_fn(g.x, a.act) * up.x, v[4 * e + 1] = act_fn(g.y, a.act) * up.y;
        v[4 * e + 2] = act_fn(g.z, a.act) * up.z, v[4 * e + 3] = act_fn(g.w, a.act) * up.w;
    }
    store_sb(0, lane, v, xs, ms);
    __syncwarp();
}

// Rows g and g + 8 of a down tile's sums (lanes i = 0) added to x.
__device__ __forceinline__ void mf_end_b(const MfArgs& a, const MfStep& st, float (&acc)[4], u32 lane) {
    if ((lane & 3) == 0) {
        const u32 row = 16 * st.tile + (lane >> 2);
        if (row < a.hidden) atomicAdd(a.x + row, acc[0]);
        if (row + 8 < a.hidden) atomicAdd(a.x + row + 8, acc[2]);
    }
    acc[0] = acc[1] = acc[2] = acc[3] = 0.f;
}

// The fetch cursor's next step (unit u, step s). Units are handed out in
// the list's order by a counter (each warp's first: its index), so that an
// SM that streams slower than the rest takes fewer of them instead of
// holding the launch's end (a fixed share, units w, w + W, ..., left a
// tail of 13 us on an H100; MF_STATIC builds that share). Lane 0 asks for
// the unit after u when u begins (`next`): the answer has a unit's steps
// to arrive. A unit waits only on units earlier in the list, and every
// warp's units come in the list's order, so the list always moves.
__device__ __forceinline__ bool mf_advance(const MfShape& m, u32& u, u32& s, u32& next, u32* handed, u32 warps) {
    if (++s < mf_len(m, u)) return false;
    s = 0;
#ifdef MF_STATIC
    (void)next, (void)handed;
    u += warps;
#else
    u = __shfl_sync(0xffffffffu, next, 0);
    if ((threadIdx.x & 31) == 0 && u < m.total) next = warps + atomicAdd(handed, 1u);
#endif
    return true;
}
// Where a unit's weights are: step s's at `at + s * stride` (A: the tile's
// next super-block; B: the next tile), and its first step. Worked out once
// a unit, a step's own by a few adds (the list's divisions once a step
// measured no slower on an H100, but they were most of a step's cursor).
struct MfUnit {
    MfStep st;
    const u8* at;
    u32 stride;
};
__device__ __forceinline__ MfUnit mf_unit(const MfArgs& a, const MfShape& m, u32 u) {
    MfUnit n;
    n.st = mf_first(m, u < m.total ? u : 0);
    n.at = mf_tile(a, m, n.st) + 2304 * (u64)n.st.sb;
    n.stride = n.st.b ? 16 * (u32)a.rb_d : 2304;
    return n;
}
// Step s of the unit whose first step is `st`.
__device__ __forceinline__ MfStep mf_nth(const MfShape& m, MfStep st, u32 s) {
    if (st.b) st.tile += s;
    else st.sb += s, st.last = s + 1 == m.sa;
    st.first = s == 0;
    return st;
}

// One step of the list: its input (A: xn's super-block, from L1; B: the
// group's, made at its unit's start, from shared memory) and the product.
// Its end (`mf_end`) comes after the next fetch has gone out, so that a
// unit's atomics and fence never leave the warp with fewer than two steps'
// weights in flight.
__device__ __forceinline__ MfStep mf_product(const MfArgs& a, const MfShape& m, const Q4kW& cur, const MfStep& st0,
                                             u32 s, u32 lane, signed char* xs, u32* ms, float (&acc)[4]) {
    const MfStep st = mf_nth(m, st0, s);
    if (st.b && st.first) mf_group_input(a, m, st.group, lane, xs, ms);
    const signed char* src = st.b ? xs : a.xq + 256 * (u64)st.sb;
    const uint4* mp = (const uint4*)(st.b ? ms : a.meta + 8 * (u64)st.sb);
    const uint4* xp = (const uint4*)(src + 64 * (lane & 3));
    const uint4 x[4] = {xp[0], xp[1], xp[2], xp[3]};
    const uint4 h = mp[0], sums = mp[1];
    q4k_step<1>(cur, x, h, sums, h, sums, acc);
    return st;
}
__device__ __forceinline__ void mf_end(const MfArgs& a, const MfStep& st, float (&acc)[4], float norm, u32 lane) {
    if (st.b) mf_end_b(a, st, acc, lane);
    else if (st.last) mf_end_a(a, st, acc, norm, lane);
}

__device__ void mlp_fused_body(const u8* wg, const u8* wu, const u8* wd, u64 rb_gu, u64 rb_d, const signed char* xq,
                               const u32* meta, const float* ss, float eps, int act, float* x, float* acc, u32 room,
                               u32* cnt, u32 hidden, u32 ffn) {
    const u32 groups = ffn / 256, nsb = hidden / 256;
    const u32 sa = min((u32)MF_A_STEPS, nsb & (0u - nsb));  // (nsb's largest power-of-2 factor)
    const u32 parts = nsb / sa, ua = 32 * parts, ub = hidden / 16 / MF_B_STEPS;
    const MfShape m{groups, ua, ub, groups * ua, groups * (ua + ub), sa, parts};
    MfArgs a{wg, wu, wd, rb_gu, rb_d, xq, meta, ss, eps, act, x, acc, cnt, hidden};
    const u32 lane = threadIdx.x & 31, warps = gridDim.x * (blockDim.x >> 5);
    const u32 w = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    u32* handed = cnt + 2;
    // Two steps' weights in flight: one computes while the other and the
    // fetch after it load (cursors: compute cu/cs, fetch fu/fs, two steps
    // on, so in the same unit or the next: a unit has 4 steps or more).
    // The weights are not the kernel before's output: the first loads go
    // out before waiting for it (and stay in the warp's first unit).
    u32 cu = w, cs = 0, fu = w, fs = 0, next = w + warps;
    MfUnit fun = mf_unit(a, m, fu);  // the fetch cursor's unit
    MfStep cst = fun.st;             // the compute cursor's unit's first step
    Q4kW wa = q4k_fetch(fun.at, 0, lane);
    mf_advance(m, fu, fs, next, handed, warps);
    Q4kW wb = q4k_fetch(fun.at + fun.stride, 0, lane);
    mf_advance(m, fu, fs, next, handed, warps);
    pdl_wait();
#ifndef MF_STATIC
    if (lane == 0) next = warps + atomicAdd(handed, 1u);
#endif
    // The sums alternate between two halves of `acc` (`room` floats each)
    // by launch, of whatever shape: this one's was zeroed by the launch
    // before, and it zeroes the other (whole) for the next.
    const u32 launch = __ldcg(cnt);
    a.acc = acc + (u64)(launch & 1) * room;
    float* other = acc + (u64)(~launch & 1) * room;
    for (u32 c = 4 * (32 * w + lane); c < room; c += 128 * warps)
        __stcg((float4*)(other + c), make_float4(0.f, 0.f, 0.f, 0.f));
    const float norm = dl_norm_factor(a.ss, hidden, eps);  // xn's (every A unit's sums scale by it)
    float sums[4] = {0.f, 0.f, 0.f, 0.f};
    // A B unit's input, a warp's own.
    __shared__ __align__(16) signed char b_x[MF_WARPS][256];
    __shared__ __align__(16) u32 b_meta[MF_WARPS][8];
    signed char* xs = b_x[threadIdx.x >> 5];
    u32* ms = b_meta[threadIdx.x >> 5];
    // A step on the weights in `buf`, which then loads the step two on.
    // (Called on wa and wb by name: both stay in registers.)
    auto turn = [&](Q4kW& buf) {
        const MfStep st = mf_product(a, m, buf, cst, cs, lane, xs, ms, sums);
        if (fu < m.total) {
            buf = q4k_fetch(fun.at + (u64)fs * fun.stride, 0, lane);
            if (mf_advance(m, fu, fs, next, handed, warps)) fun = mf_unit(a, m, fu);
        }
        mf_end(a, st, sums, norm, lane);
        if (++cs == mf_len(m, cu)) {
            cs = 0, cu = fu, cst = fun.st;
            trace_mark(st.b ? "mf.unit.down" : "mf.unit.gu");
        }
    };
    while (cu < m.total) {
        turn(wa);
        if (cu < m.total) turn(wb);
    }
    // The last warp out zeroes the counters for the next launch and counts
    // this one.
    __syncwarp();
    u32 out = 0;
    if (lane == 0) out = atomicAdd(a.cnt + 1, 1u) + 1;
    if (__shfl_sync(0xffffffffu, out, 0) == warps) {
        for (u32 c = 1 + lane; c < MF_CNT + m.groups; c += 32) a.cnt[c] = 0;
        if (lane == 0) a.cnt[0] = launch + 1;
    }
}

extern "C" __global__ void __launch_bounds__(32 * MF_WARPS, 1)
    mlp_fused(const u8* wg, const u8* wu, const u8* wd, u64 rb_gu, u64 rb_d, const signed char* xq, const u32* meta,
              const float* ss, float eps, int act, float* x, float* acc, u32 room, u32* cnt, u32 hidden, u32 ffn) {
    mlp_fused_body(wg, wu, wd, rb_gu, rb_d, xq, meta, ss, eps, act, x, acc, room, cnt, hidden, ffn);
}
