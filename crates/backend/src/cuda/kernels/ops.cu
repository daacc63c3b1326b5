// Elementwise and row-wise ops on f32 activations [rows, cols], row-major.

extern "C" __global__ void to_bf16(const float* x, u16* y, u64 n) {
    for (u64 i = blockIdx.x * (u64)blockDim.x + threadIdx.x; i < n; i += (u64)gridDim.x * blockDim.x)
        y[i] = f32_to_bf16(x[i]);
}

extern "C" __global__ void to_f16(const float* x, u16* y, u64 n) {
    for (u64 i = blockIdx.x * (u64)blockDim.x + threadIdx.x; i < n; i += (u64)gridDim.x * blockDim.x)
        y[i] = f32_to_f16(x[i]);
}

extern "C" __global__ void add(float* x, const float* y, u64 n) {
    for (u64 i = blockIdx.x * (u64)blockDim.x + threadIdx.x; i < n; i += (u64)gridDim.x * blockDim.x)
        x[i] += y[i];
}

// x[r, c] += v[c]
extern "C" __global__ void add_row(float* x, const float* v, u64 n, u32 cols) {
    for (u64 i = blockIdx.x * (u64)blockDim.x + threadIdx.x; i < n; i += (u64)gridDim.x * blockDim.x)
        x[i] += v[i % cols];
}

extern "C" __global__ void scale(float* x, float s, u64 n) {
    for (u64 i = blockIdx.x * (u64)blockDim.x + threadIdx.x; i < n; i += (u64)gridDim.x * blockDim.x)
        x[i] *= s;
}

extern "C" __global__ void softcap(float* x, float cap, u64 n) {
    for (u64 i = blockIdx.x * (u64)blockDim.x + threadIdx.x; i < n; i += (u64)gridDim.x * blockDim.x)
        x[i] = cap * tanhf(x[i] / cap);
}

extern "C" __global__ void activate(float* x, u64 n, int act) {
    for (u64 i = blockIdx.x * (u64)blockDim.x + threadIdx.x; i < n; i += (u64)gridDim.x * blockDim.x)
        x[i] = act_fn(x[i], act);
}

// out = act(gate) * up
extern "C" __global__ void glu(const float* gate, const float* up, float* out, u64 n, int act) {
    for (u64 i = blockIdx.x * (u64)blockDim.x + threadIdx.x; i < n; i += (u64)gridDim.x * blockDim.x)
        out[i] = act_fn(gate[i], act) * up[i];
}

// One block per group of `g` values (a row, or one head of a row).
extern "C" __global__ void rms_norm(const float* x, const float* w, float* out, u32 g, float eps) {
    const float* xi = x + (u64)blockIdx.x * g;
    float* oi = out + (u64)blockIdx.x * g;
    float ss = 0.f;
    for (u32 i = threadIdx.x; i < g; i += blockDim.x) ss += xi[i] * xi[i];
    const float r = rsqrtf(block_sum(ss) / g + eps);
    for (u32 i = threadIdx.x; i < g; i += blockDim.x) oi[i] = xi[i] * r * w[i];
}

// One block per row; two passes (mean, then centred variance). `b` may be null.
extern "C" __global__ void layer_norm(const float* x, const float* w, const float* b, float* out, u32 cols,
                                      float eps) {
    const float* xi = x + (u64)blockIdx.x * cols;
    float* oi = out + (u64)blockIdx.x * cols;
    float s = 0.f;
    for (u32 i = threadIdx.x; i < cols; i += blockDim.x) s += xi[i];
    const float mean = block_sum(s) / cols;
    float v = 0.f;
    for (u32 i = threadIdx.x; i < cols; i += blockDim.x) v += (xi[i] - mean) * (xi[i] - mean);
    const float r = rsqrtf(block_sum(v) / cols + eps);
    for (u32 i = threadIdx.x; i < cols; i += blockDim.x) {
        const float y = (xi[i] - mean) * r * w[i];
        oi[i] = b ? y + b[i] : y;
    }
}

// Rotary embedding in place; one block per row, one thread per rotated pair
// index i, which computes its angle once and turns that pair in every head.
// Pairs (2i, 2i+1) when `interleaved`, else (i, i + head_dim/2).
extern "C" __global__ void rope(float* x, const u32* pos, const float* inv_freq, u32 cols, u32 head_dim,
                                int interleaved) {
    float* xi = x + (u64)blockIdx.x * cols;
    const float p = (float)pos[blockIdx.x];
    const u32 half = head_dim / 2;
    for (u32 i = threadIdx.x; i < half; i += blockDim.x) {
        float s, c;
        sincosf(p * inv_freq[i], &s, &c);
        for (u32 h = 0; h < cols / head_dim; h++) {
            const u32 a = h * head_dim + (interleaved ? 2 * i : i);
            const u32 b = h * head_dim + (interleaved ? 2 * i + 1 : i + half);
            const float x0 = xi[a], x1 = xi[b];
            xi[a] = x0 * c - x1 * s;
            xi[b] = x0 * s + x1 * c;
        }
    }
}

// out[i] = x[rows[i]]; one block per output row.
extern "C" __global__ void gather_rows(const float* x, const u32* rows, float* out, u32 cols) {
    const float* src = x + (u64)rows[blockIdx.x] * cols;
    float* dst = out + (u64)blockIdx.x * cols;
    for (u32 i = threadIdx.x; i < cols; i += blockDim.x) dst[i] = src[i];
}

// Embedding rows of a table stored as f32 (dtype 0), f16 (1) or bf16 (2).
extern "C" __global__ void embedding(const void* table, const u32* ids, float* out, u32 cols, int dtype) {
    const u64 base = (u64)ids[blockIdx.x] * cols;
    float* dst = out + (u64)blockIdx.x * cols;
    for (u32 i = threadIdx.x; i < cols; i += blockDim.x) {
        float v;
        if (dtype == 0) v = ((const float*)table)[base + i];
        else if (dtype == 1) v = f16_to_f32(((const u16*)table)[base + i]);
        else v = bf16_to_f32(((const u16*)table)[base + i]);
        dst[i] = v;
    }
}

// Stores K and V rows [n, kv_dim] at their cache slots; one block per row.
extern "C" __global__ void write_kv_f32(const float* k, const float* v, const u32* slots, float* kc, float* vc,
                                        u32 kv_dim) {
    const u64 src = (u64)blockIdx.x * kv_dim, dst = (u64)slots[blockIdx.x] * kv_dim;
    for (u32 i = threadIdx.x; i < kv_dim; i += blockDim.x) {
        kc[dst + i] = k[src + i];
        vc[dst + i] = v[src + i];
    }
}

extern "C" __global__ void write_kv_f16(const float* k, const float* v, const u32* slots, u16* kc, u16* vc,
                                        u32 kv_dim) {
    const u64 src = (u64)blockIdx.x * kv_dim, dst = (u64)slots[blockIdx.x] * kv_dim;
    for (u32 i = threadIdx.x; i < kv_dim; i += blockDim.x) {
        kc[dst + i] = f32_to_f16(k[src + i]);
        vc[dst + i] = f32_to_f16(v[src + i]);
    }
}

// x += y, then out = rms_norm(x) * w over each row (the residual add fused
// with the next layer's norm). One block per row.
extern "C" __global__ void add_rms_norm(float* x, const float* y, const float* w, float* out, u32 cols, float eps) {
    float* xi = x + (u64)blockIdx.x * cols;
    const float* yi = y + (u64)blockIdx.x * cols;
    float* oi = out + (u64)blockIdx.x * cols;
    float ss = 0.f;
    for (u32 i = threadIdx.x; i < cols; i += blockDim.x) {
        const float v = xi[i] + yi[i];
        xi[i] = v;
        ss += v * v;
    }
    const float r = rsqrtf(block_sum(ss) / cols + eps);
    for (u32 i = threadIdx.x; i < cols; i += blockDim.x) oi[i] = xi[i] * r * w[i];
}
