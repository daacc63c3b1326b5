// RoPE and the KV-cache write done by a decode step's q/k/v GEMV at batch 1
// (`gemv_q4_k_rkv_1`, `gemv_q6_k_rkv_1`, `gemv_q4k_q6k_rkv_1` in gemv_tile.cu), so that no kernel
// of their own waits between the GEMV and attention: q's rows are turned
// and stored (f32), k's turned and stored in the K cache at the step's slot,
// v's stored in the V cache (both f16). Pairs are adjacent rows (2i, 2i + 1:
// GGUF `llama`'s interleaved RoPE), which the tensor-core GEMV's lanes g and g ^ 1
// hold; the math is `rope_row`'s (kernels/ops.cu), on the same f32 values.
struct RopeKv {
    const u32* pos;         // the step's one position
    const float* inv_freq;  // head_dim / 2 of them
    const u32* slots;       // the step's one cache slot
    u16* kc;
    u16* vc;
    u32 head_dim, kv_dim;
};

// The angles and the cache offset of a lane's rows `row` and `row + 8` of
// weight `which` (m rows), ahead of the GEMV's loop: their loads and
// `sincosf` then stay off the kernel's tail.
struct RopeKvLane {
    float sn[2], cs[2];
    u64 dst;
};
__device__ __forceinline__ RopeKvLane rope_kv_lane(const RopeKv& rk, u32 which, u32 row, u32 m) {
    RopeKvLane l = {{0.f, 0.f}, {1.f, 1.f}, (u64)rk.slots[0] * rk.kv_dim};
    const float p = (float)rk.pos[0];
#pragma unroll
    for (int h = 0; h < 2; h++) {
        const u32 r = row + 8 * h;
        if (which < 2 && r < m) sincosf(p * rk.inv_freq[(r % rk.head_dim) / 2], &l.sn[h], &l.cs[h]);
    }
    return l;
}

// Weight `which` of q (0), k (1), v (2): rows `row` (ra) and `row + 8` (rb)
// of a tile, in lane g of a quad whose partner quad g ^ 1 holds the
// pairs' other rows. Every lane of the warp calls it (the shuffles); lanes
// with `holds` store. `m`: the weight's rows.
__device__ __forceinline__ void rope_kv_rows2(const RopeKv& rk, const RopeKvLane& l, u32 which, u32 row, u32 m,
                                              float ra, float rb, bool holds, float* q) {
    const float pa = __shfl_xor_sync(0xffffffffu, ra, 4), pb = __shfl_xor_sync(0xffffffffu, rb, 4);
    if (!holds) return;
#pragma unroll
    for (int h = 0; h < 2; h++) {
        const u32 r = row + 8 * h;
        if (r >= m) continue;
        const float v = h ? rb : ra, other = h ? pb : pa;
        if (which == 2) {
            rk.vc[l.dst + r] = f32_to_f16(v);
            continue;
        }
        // Pair (u, w) turns to (u cos - w sin, u sin + w cos); odd rows are w.
        const float sn = l.sn[h], cs = l.cs[h];
        const float out = r & 1 ? other * sn + v * cs : v * cs - other * sn;
        if (which == 0) q[r] = out;
        else rk.kc[l.dst + r] = f32_to_f16(out);
    }
}
