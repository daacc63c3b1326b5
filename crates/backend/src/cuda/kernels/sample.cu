// Sampling on the device, so only token ids come back to the host. One block
// per logits row, in place on the logits:
//   1. edits: logit bias, repetition penalty and presence/frequency penalties,
//      precomputed per distinct token by the host (x += bias; x = x > 0 ? x /
//      rep : x * rep; x -= sub), in the host sampler's order;
//   2. NaN -> -inf, +inf -> the largest finite value; max, first argmax, and
//      the log-sum-exp (the logprob is x[token] - lse, before temperature);
//   3. greedy (temperature <= 0), or the survivors of top-k, top-p and min-p
//      (each a threshold on the logit, found by bisection over the row), then
//      one draw from softmax((x - max) / T) over them by the Gumbel-max trick
//      with per-token noise from a counter-based hash of the row's seed.
// Rows of `params` (12 words): temperature, top_k, top_p, min_p (f32 bits, k
// as an integer), seed low, seed high, first edit, end of edits, then
// whether the row has a pending token and its rep, presence, frequency
// (host lib.rs `PendingEdit`). Edits (5 words): token, bias, rep, sub, times
// generated. Output per row: token, logprob (f32 bits). A pending token is
// the row's own pick of the last launch, still in `out`: every block reads
// it before the row's output is written.

#define SAMPLE_THREADS 1024
#define SPLIT_THREADS 256
#define BISECT_STEPS 24
#define FLT_MAX_ 3.402823466e38f

__device__ __forceinline__ u64 mix64(u64 z) {
    z += 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

// Uniform in (0, 1) for token i of a row's draw.
__device__ __forceinline__ float uniform(u64 seed, u32 i) {
    const u64 h = mix64(seed ^ mix64((u64)i));
    return ((float)(h >> 40) + 0.5f) * (1.f / 16777216.f);
}

__shared__ float red_f[32];
__shared__ u32 red_u[32];

// Block-wide reductions (all threads get the result).
__device__ float block_max_f(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    __syncthreads();
    if ((threadIdx.x & 31) == 0) red_f[threadIdx.x >> 5] = v;
    __syncthreads();
    v = (threadIdx.x & 31) < (blockDim.x >> 5) ? red_f[threadIdx.x & 31] : -INFINITY;
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}
__device__ float block_min_f(float v) { return -block_max_f(-v); }
__device__ u32 block_min_u(u32 v) {
    for (int o = 16; o > 0; o >>= 1) v = min(v, __shfl_xor_sync(0xffffffffu, v, o));
    __syncthreads();
    if ((threadIdx.x & 31) == 0) red_u[threadIdx.x >> 5] = v;
    __syncthreads();
    v = (threadIdx.x & 31) < (blockDim.x >> 5) ? red_u[threadIdx.x & 31] : 0xffffffffu;
    for (int o = 16; o > 0; o >>= 1) v = min(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}
__device__ u32 block_sum_u(u32 v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    __syncthreads();
    if ((threadIdx.x & 31) == 0) red_u[threadIdx.x >> 5] = v;
    __syncthreads();
    v = (threadIdx.x & 31) < (blockDim.x >> 5) ? red_u[threadIdx.x & 31] : 0u;
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
__device__ float block_sum_f(float v) {
    v = warp_sum(v);
    __syncthreads();
    if ((threadIdx.x & 31) == 0) red_f[threadIdx.x >> 5] = v;
    __syncthreads();
    v = (threadIdx.x & 31) < (blockDim.x >> 5) ? red_f[threadIdx.x & 31] : 0.f;
    return warp_sum(v);
}

// Tokens with x >= v, and their mass sum exp(x - mx).
__device__ u32 count_at_least(const float* x, u32 vocab, float v) {
    u32 c = 0;
    for (u32 i = threadIdx.x; i < vocab; i += blockDim.x) c += x[i] >= v;
    return block_sum_u(c);
}
__device__ float mass_at_least(const float* x, u32 vocab, float v, float mx) {
    float s = 0.f;
    for (u32 i = threadIdx.x; i < vocab; i += blockDim.x) {
        const float xi = x[i];
        if (xi >= v) s += __expf(xi - mx);
    }
    return block_sum_f(s);
}

// Step 3 over a sanitized, edited row (max mx, smallest finite mn, mass z
// relative to mx): the token drawn at temperature `temp` > 0 among the
// survivors of the row's top-k, top-p and min-p (`p`: its parameters), or
// `argmax` when none survives. Every thread gets the token.
__device__ u32 draw(const float* x, u32 vocab, const u32* p, float mx, float mn, float z, u32 argmax) {
    const float temp = __uint_as_float(p[0]), top_p = __uint_as_float(p[2]), min_p = __uint_as_float(p[3]);
    const u32 top_k = p[1];
    const u64 seed = (u64)p[4] | ((u64)p[5] << 32);
    const float inv_t = 1.f / temp;
    // Thresholds: the largest value that keeps at least k tokens, then
    // that keeps at least top_p of the (top-k) mass, then min-p's floor.
    float thr = -INFINITY, zset = z;
    if (top_k > 0 && top_k < vocab && count_at_least(x, vocab, mn) > top_k) {
        float lo = mn, hi = mx;
        for (int it = 0; it < BISECT_STEPS; it++) {
            const float mid = 0.5f * (lo + hi);
            const u32 c = count_at_least(x, vocab, mid);
            if (c >= top_k) lo = mid;
            else hi = mid;
            if (c == top_k) break;
        }
        thr = lo;
        zset = mass_at_least(x, vocab, thr, mx);
    }
    if (top_p < 1.f) {
        float lo = fmaxf(thr, mn), hi = mx;
        const float want = top_p * zset;
        for (int it = 0; it < BISECT_STEPS; it++) {
            const float mid = 0.5f * (lo + hi);
            if (mass_at_least(x, vocab, mid, mx) >= want) lo = mid;
            else hi = mid;
        }
        thr = fmaxf(thr, lo);
    }
    if (min_p > 0.f) thr = fmaxf(thr, mx + logf(min_p));
    if (thr > mx) return argmax;
    // Gumbel-max: argmax of (x - max) / T + G_i is a draw from the softmax.
    float best = -INFINITY;
    u32 best_i = argmax;
    for (u32 i = threadIdx.x; i < vocab; i += blockDim.x) {
        const float xi = x[i];
        if (xi < thr || xi == -INFINITY) continue;
        const float g = (xi - mx) * inv_t - logf(-logf(uniform(seed, i)));
        if (g > best) best = g, best_i = i;
    }
    const float top = block_max_f(best);
    return block_min_u(best == top ? best_i : 0xffffffffu);
}

// An edit, rounded step by step as the host's (lib.rs `LogitEdit::apply`; no fused multiply-add).
__device__ __forceinline__ float edit_value(float x, float bias, float rep, float sub) {
    float v = __fadd_rn(x, bias);
    if (rep != 1.f) v = v > 0.f ? __fdiv_rn(v, rep) : __fmul_rn(v, rep);
    return __fsub_rn(v, sub);
}

// The row's pending token (0xffffffff if none): its pick in the last launch.
__device__ __forceinline__ u32 pending_token(const u32* p, const u32* out) {
    return p[8] ? __ldcg(out) : 0xffffffffu;
}

// Step 1 for the tokens c0 .. c1 of a row, the pending token `pt` counted
// as generated once more (lib.rs `PendingEdit::after`; its sub rounded as
// the host's, unfused). Edits touch distinct tokens: no two threads write
// one logit.
__device__ void apply_edits(float* x, const u32* p, const u32* edits, u32 c0, u32 c1, u32 pt) {
    __shared__ u32 pending_seen;
    if (threadIdx.x == 0) pending_seen = 0;
    __syncthreads();
    const float prep = __uint_as_float(p[9]), pres = __uint_as_float(p[10]), freq = __uint_as_float(p[11]);
    const bool counted = pres != 0.f || freq != 0.f;
    for (u32 e = p[6] + threadIdx.x; e < p[7]; e += blockDim.x) {
        const u32* d = edits + 5 * e;
        const u32 t = d[0];
        if (t < c0 || t >= c1) continue;
        float rep = __uint_as_float(d[2]), sub = __uint_as_float(d[3]);
        if (t == pt) {
            pending_seen = 1;
            if (prep != 1.f) rep = prep;
            if (counted) sub = __fadd_rn(__fmul_rn((float)(d[4] + 1), freq), pres);
        }
        x[t] = edit_value(x[t], __uint_as_float(d[1]), rep, sub);
    }
    __syncthreads();
    if (threadIdx.x == 0 && pt >= c0 && pt < c1 && !pending_seen)
        x[pt] = edit_value(x[pt], 0.f, prep, counted ? __fadd_rn(freq, pres) : 0.f);
    __syncthreads();
}

// Step 2's sanitizing for the tokens c0 .. c1: their max and smallest finite value.
__device__ void sanitize(float* x, u32 c0, u32 c1, float& mx, float& mn) {
    mx = -INFINITY, mn = INFINITY;
    for (u32 i = c0 + threadIdx.x; i < c1; i += blockDim.x) {
        float v = x[i];
        if (v != v) v = -INFINITY;
        if (v == INFINITY) v = FLT_MAX_;
        x[i] = v;
        mx = fmaxf(mx, v);
        if (v > -INFINITY) mn = fminf(mn, v);
    }
    mx = block_max_f(mx);
    mn = block_min_f(mn);
}

// The first of tokens c0 .. c1 at mx (0xffffffff if none), and their mass sum exp(x - mx).
__device__ void first_and_mass(const float* x, u32 c0, u32 c1, float mx, u32& first, float& z) {
    u32 f = 0xffffffffu;
    float s = 0.f;
    for (u32 i = c0 + threadIdx.x; i < c1; i += blockDim.x) {
        const float v = x[i];
        if (v == mx) f = min(f, i);
        if (mx > -INFINITY) s += __expf(v - mx);
    }
    first = block_min_u(f);
    z = block_sum_f(s);
}

// The row's token and its logprob (x[token] - log-sum-exp, before
// temperature) into `o`, from its max, smallest finite value, mass and first argmax.
__device__ void finish_row(const float* x, u32 vocab, const u32* p, float mx, float mn, float z, u32 argmax, u32* o) {
    const u64 seed = (u64)p[4] | ((u64)p[5] << 32);
    if (mx == -INFINITY) {  // every logit banned: uniform, as on the host
        if (threadIdx.x == 0) {
            o[0] = (u32)(mix64(seed) % vocab);
            o[1] = __float_as_uint(-logf((float)vocab));
        }
        return;
    }
    const float lse = mx + logf(z), temp = __uint_as_float(p[0]);
    const u32 token = temp > 0.f && 1.f / temp < INFINITY ? draw(x, vocab, p, mx, mn, z, argmax) : argmax;
    if (threadIdx.x == 0) {
        o[0] = token;
        o[1] = __float_as_uint(x[token] - lse);
    }
}

extern "C" __global__ void __launch_bounds__(SAMPLE_THREADS)
    sample_rows(float* logits, u32 vocab, const u32* params, const u32* edits, u32* out) {
    pdl_trigger();
    pdl_wait();
    float* x = logits + (u64)blockIdx.x * vocab;
    const u32* p = params + 12 * blockIdx.x;
    apply_edits(x, p, edits, 0, vocab, pending_token(p, out + 2 * blockIdx.x));
    float mx, mn, z;
    u32 argmax;
    sanitize(x, 0, vocab, mx, mn);
    first_and_mass(x, 0, vocab, mx, argmax, z);
    finish_row(x, vocab, p, mx, mn, z, argmax, out + 2 * blockIdx.x);
}

// sample_rows' work for greedy rows (the host's choice), each row split
// over gridDim.y blocks (one block reads a 128K vocabulary at a fraction of
// the GPU's bandwidth: 2-4% of a batch-1 decode step): block z edits and
// sanitizes its share of the tokens and writes their max, first argmax and
// mass to `part` (4 words a block); the row's last block (counted in
// `done`, which it leaves at zero) merges them into the token and its
// logprob. (Rows that draw keep sample_rows, whose 1,024 threads make the
// many passes of top-k and top-p over the row.)
extern "C" __global__ void __launch_bounds__(SPLIT_THREADS)
    sample_split(float* logits, u32 vocab, const u32* params, const u32* edits, u32* out, float* part, u32* done) {
    pdl_trigger();
    pdl_wait();
    const u32 row = blockIdx.x, z = blockIdx.y, S = gridDim.y;
    float* x = logits + (u64)row * vocab;
    const u32* p = params + 12 * row;
    const u32 chunk = (vocab + S - 1) / S, c0 = min(vocab, z * chunk), c1 = min(vocab, c0 + chunk);
    apply_edits(x, p, edits, c0, c1, pending_token(p, out + 2 * row));
    float mx, mn, mass;
    u32 first;
    sanitize(x, c0, c1, mx, mn);
    first_and_mass(x, c0, c1, mx, first, mass);
    __shared__ bool last;
    if (threadIdx.x == 0) {
        float* mine = part + 4 * ((u64)row * S + z);
        mine[0] = mx, mine[1] = __uint_as_float(first), mine[2] = mass, mine[3] = 0.f;
        __threadfence();
        last = atomicAdd(done + row, 1u) == S - 1;
        if (last) done[row] = 0;
    }
    __syncthreads();
    if (!last) return;
    __threadfence();
    // The row's shares, one a thread (S <= SPLIT_THREADS), read through L2.
    const float* ps = part + 4 * ((u64)row * S + threadIdx.x);
    const bool has = threadIdx.x < S;
    const float bm = has ? __ldcg(ps) : -INFINITY;
    mx = block_max_f(bm);
    const u32 argmax = block_min_u(has && bm == mx ? __float_as_uint(__ldcg(ps + 1)) : 0xffffffffu);
    const float zs = block_sum_f(has && bm > -INFINITY ? __ldcg(ps + 2) * __expf(bm - mx) : 0.f);
    if (threadIdx.x == 0) {
        u32* o = out + 2 * row;
        if (mx == -INFINITY) {  // every logit banned: uniform, as on the host
            o[0] = (u32)(mix64((u64)p[4] | ((u64)p[5] << 32)) % vocab);
            o[1] = __float_as_uint(-logf((float)vocab));
        } else {
            o[0] = argmax;
            o[1] = __float_as_uint(mx - (mx + logf(zs)));
        }
    }
}
