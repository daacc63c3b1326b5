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
// Rows of `params` (8 words): temperature, top_k, top_p, min_p (f32 bits, k
// as an integer), seed low, seed high, first edit, end of edits. Edits (4
// words): token, bias, rep, sub. Output per row: token, logprob (f32 bits).

#define SAMPLE_THREADS 1024
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
    for (u32 i = threadIdx.x; i < vocab; i += blockDim.x)
        if (x[i] >= v) s += __expf(x[i] - mx);
    return block_sum_f(s);
}

extern "C" __global__ void __launch_bounds__(SAMPLE_THREADS)
    sample_rows(float* logits, u32 vocab, const u32* params, const u32* edits, u32* out) {
    pdl_trigger();
    pdl_wait();
    float* x = logits + (u64)blockIdx.x * vocab;
    const u32* p = params + 8 * blockIdx.x;
    const float temp = __uint_as_float(p[0]), top_p = __uint_as_float(p[2]), min_p = __uint_as_float(p[3]);
    const u32 top_k = p[1];
    const u64 seed = (u64)p[4] | ((u64)p[5] << 32);
    // 1. Edits touch distinct tokens: no two threads write one logit.
    for (u32 e = p[6] + threadIdx.x; e < p[7]; e += blockDim.x) {
        const u32 t = edits[4 * e];
        if (t >= vocab) continue;
        const float rep = __uint_as_float(edits[4 * e + 2]);
        float v = x[t] + __uint_as_float(edits[4 * e + 1]);
        if (rep != 1.f) v = v > 0.f ? v / rep : v * rep;
        x[t] = v - __uint_as_float(edits[4 * e + 3]);
    }
    __syncthreads();
    // 2. Sanitize; max, first argmax, smallest finite value.
    float mx = -INFINITY, mn = INFINITY;
    for (u32 i = threadIdx.x; i < vocab; i += blockDim.x) {
        float v = x[i];
        if (v != v) v = -INFINITY;
        if (v == INFINITY) v = FLT_MAX_;
        x[i] = v;
        mx = fmaxf(mx, v);
        if (v > -INFINITY) mn = fminf(mn, v);
    }
    mx = block_max_f(mx);
    mn = block_min_f(mn);
    u32 first = 0xffffffffu;
    for (u32 i = threadIdx.x; i < vocab; i += blockDim.x)
        if (x[i] == mx) first = min(first, i);
    const u32 argmax = block_min_u(first);
    if (mx == -INFINITY) {  // every logit banned: uniform, as on the host
        if (threadIdx.x == 0) {
            out[2 * blockIdx.x] = (u32)(mix64(seed) % vocab);
            out[2 * blockIdx.x + 1] = __float_as_uint(-logf((float)vocab));
        }
        return;
    }
    float z = 0.f;
    for (u32 i = threadIdx.x; i < vocab; i += blockDim.x) z += __expf(x[i] - mx);
    z = block_sum_f(z);
    const float lse = mx + logf(z);
    u32 token = argmax;
    const float inv_t = 1.f / temp;
    if (temp > 0.f && inv_t < INFINITY) {
        // 3. Thresholds: the largest value that keeps at least k tokens, then
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
        if (thr <= mx) {
            // Gumbel-max: argmax of (x - max) / T + G_i is a draw from the softmax.
            float best = -INFINITY;
            u32 best_i = argmax;
            for (u32 i = threadIdx.x; i < vocab; i += blockDim.x) {
                if (x[i] < thr || x[i] == -INFINITY) continue;
                const float g = (x[i] - mx) * inv_t - logf(-logf(uniform(seed, i)));
                if (g > best) best = g, best_i = i;
            }
            const float top = block_max_f(best);
            token = block_min_u(best == top ? best_i : 0xffffffffu);
        }
    }
    if (threadIdx.x == 0) {
        out[2 * blockIdx.x] = token;
        out[2 * blockIdx.x + 1] = __float_as_uint(x[token] - lse);
    }
}
