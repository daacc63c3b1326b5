//! Row-wise CPU ops: norms, gated activations, rotary embedding.

use super::fork::for_each_chunk_mut;
use super::math::{erf, exp};
use crate::{Activation, Rope};

/// Rows per parallel chunk: a single decode row runs on the calling thread.
const ROWS_PER_CHUNK: usize = 8;

pub fn rms_norm(x: &[f32], w: &[f32], eps: f32) -> Vec<f32> {
    let g = w.len();
    let mut out = super::pool::zeroed(x.len());
    for_each_chunk_mut(&mut out, g, ROWS_PER_CHUNK, &|first, o| {
        for (i, o) in o.chunks_mut(g).enumerate() {
            let xi = &x[(first + i) * g..(first + i + 1) * g];
            let ms = xi.iter().map(|v| v * v).sum::<f32>() / g as f32;
            let r = 1.0 / (ms + eps).sqrt();
            for ((oe, &xe), &we) in o.iter_mut().zip(xi).zip(w) {
                *oe = xe * r * we;
            }
        }
    });
    out
}

/// GELU, tanh form: 0.5 x (1 + tanh(u)) = x / (1 + e^(-2u)).
#[inline(always)]
fn gelu_tanh(x: f32) -> f32 {
    const C: f32 = 0.797_884_6; // sqrt(2 / pi)
    x / (1.0 + exp(-2.0 * C * (x + 0.044715 * x * x * x)))
}

#[inline(always)]
fn gelu(x: f32) -> f32 {
    0.5 * x * (1.0 + erf(x * std::f32::consts::FRAC_1_SQRT_2))
}

#[inline(always)]
fn silu(x: f32) -> f32 {
    x / (1.0 + exp(-x))
}

/// out[i] = act(a[i]) * b[i] (or act(a[i]) without `b`), one activation per
/// loop so each loop vectorizes.
#[inline(always)]
fn act_loop(out: &mut [f32], a: &[f32], b: Option<&[f32]>, act: Activation) {
    macro_rules! run {
        ($f:expr) => {
            match b {
                Some(b) => out.iter_mut().zip(a).zip(b).for_each(|((o, &x), &y)| *o = $f(x) * y),
                None => out.iter_mut().zip(a).for_each(|(o, &x)| *o = $f(x)),
            }
        };
    }
    match act {
        Activation::Silu => run!(silu),
        Activation::GeluTanh => run!(gelu_tanh),
        Activation::Gelu => run!(gelu),
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn act_loop_avx2(out: &mut [f32], a: &[f32], b: Option<&[f32]>, act: Activation) {
    act_loop(out, a, b, act)
}

fn act_dispatch(out: &mut [f32], a: &[f32], b: Option<&[f32]>, act: Activation) {
    #[cfg(target_arch = "x86_64")]
    if super::simd::has_avx2() {
        // SAFETY: the CPU supports AVX2 and FMA (checked at run time).
        unsafe { act_loop_avx2(out, a, b, act) };
        return;
    }
    act_loop(out, a, b, act)
}

pub fn glu(gate: &[f32], up: &[f32], act: Activation) -> Vec<f32> {
    let mut out = super::pool::zeroed(gate.len());
    for_each_chunk_mut(&mut out, 1, 4096, &|first, o| {
        let n = o.len();
        act_dispatch(o, &gate[first..first + n], Some(&up[first..first + n]), act);
    });
    out
}

pub fn rope(x: &mut [f32], cols: usize, rope: &Rope, positions: &[u32]) {
    let hd = rope.head_dim;
    let half = hd / 2;
    // The row's angles on the stack (no allocation per row): heads of up to
    // 512, as everywhere else; wider ones get heap buffers.
    const STACK: usize = 256;
    let f = |row: &mut [f32], pos: u32| {
        let p = pos as f32;
        let (mut sin_s, mut cos_s) = ([0f32; STACK], [0f32; STACK]);
        let (mut sin_h, mut cos_h) = (Vec::new(), Vec::new());
        let (sin, cos) = if half > STACK {
            sin_h.resize(half, 0.0);
            cos_h.resize(half, 0.0);
            (&mut sin_h[..], &mut cos_h[..])
        } else {
            (&mut sin_s[..half], &mut cos_s[..half])
        };
        for ((s, c), f) in sin.iter_mut().zip(cos.iter_mut()).zip(&rope.inv_freq) {
            (*s, *c) = (p * f).sin_cos();
        }
        for head in row.chunks_mut(hd) {
            for i in 0..half {
                let (a, b) = if rope.interleaved { (2 * i, 2 * i + 1) } else { (i, i + half) };
                let (x0, x1) = (head[a], head[b]);
                head[a] = x0 * cos[i] - x1 * sin[i];
                head[b] = x0 * sin[i] + x1 * cos[i];
            }
        }
    };
    for_each_chunk_mut(x, cols, ROWS_PER_CHUNK, &|first, rows| {
        for (i, row) in rows.chunks_mut(cols).enumerate() {
            f(row, positions[first + i]);
        }
    });
}

pub fn layer_norm(x: &[f32], w: &[f32], b: Option<&[f32]>, eps: f32) -> Vec<f32> {
    let g = w.len();
    let mut out = super::pool::zeroed(x.len());
    for_each_chunk_mut(&mut out, g, ROWS_PER_CHUNK, &|first, o| {
        for (i, o) in o.chunks_mut(g).enumerate() {
            let xi = &x[(first + i) * g..(first + i + 1) * g];
            layer_norm_row(xi, w, b, eps, o);
        }
    });
    out
}

/// One row: two passes (mean, then the variance of the centred values), so a
/// large common offset does not cancel digits; plain loops that vectorize.
fn layer_norm_row(x: &[f32], w: &[f32], b: Option<&[f32]>, eps: f32, o: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if super::simd::has_avx2() {
        // SAFETY: the CPU supports AVX2 and FMA (checked at run time).
        unsafe { layer_norm_row_avx2(x, w, b, eps, o) };
        return;
    }
    layer_norm_row_generic(x, w, b, eps, o)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn layer_norm_row_avx2(x: &[f32], w: &[f32], b: Option<&[f32]>, eps: f32, o: &mut [f32]) {
    layer_norm_row_generic(x, w, b, eps, o)
}

#[inline(always)]
fn layer_norm_row_generic(x: &[f32], w: &[f32], b: Option<&[f32]>, eps: f32, o: &mut [f32]) {
    let n = x.len() as f32;
    let mean = sum_lanes(x, |v| v) / n;
    let var = sum_lanes(x, |v| (v - mean) * (v - mean)) / n;
    let r = 1.0 / (var + eps).sqrt();
    match b {
        Some(b) => {
            for (((oe, &xe), &we), &be) in o.iter_mut().zip(x).zip(w).zip(b) {
                *oe = (xe - mean) * r * we + be;
            }
        }
        None => {
            for ((oe, &xe), &we) in o.iter_mut().zip(x).zip(w) {
                *oe = (xe - mean) * r * we;
            }
        }
    }
}

/// The sum of f(x) in 16 independent lanes (vectorizes; also more accurate
/// than one running sum).
#[inline(always)]
fn sum_lanes(x: &[f32], f: impl Fn(f32) -> f32) -> f32 {
    let mut acc = [0f32; 16];
    let chunks = x.chunks_exact(16);
    let rest: f32 = chunks.remainder().iter().map(|&v| f(v)).sum();
    for c in chunks {
        for (a, &v) in acc.iter_mut().zip(c) {
            *a += f(v);
        }
    }
    acc.iter().sum::<f32>() + rest
}

pub fn activate_all(x: &mut [f32], act: Activation) {
    let src = x.to_vec();
    for_each_chunk_mut(x, 1, 4096, &|first, o| {
        let n = o.len();
        act_dispatch(o, &src[first..first + n], None, act);
    });
}

/// Elements per parallel chunk of the element-wise ops: one decode row runs
/// on the calling thread alone.
const ELEMS_PER_CHUNK: usize = 1 << 14;

/// x[r] += v for every row r of `x` (rows of v.len()).
pub fn add_rows(x: &mut [f32], v: &[f32]) {
    let rows_per_chunk = (ELEMS_PER_CHUNK / v.len().max(1)).max(1);
    for_each_chunk_mut(x, v.len(), rows_per_chunk, &|_, rows| {
        for row in rows.chunks_mut(v.len()) {
            row.iter_mut().zip(v).for_each(|(a, b)| *a += b);
        }
    });
}

pub fn add(x: &mut [f32], y: &[f32]) {
    for_each_chunk_mut(x, 1, ELEMS_PER_CHUNK, &|first, o| {
        o.iter_mut().zip(&y[first..]).for_each(|(a, b)| *a += b);
    });
}

pub fn scale(x: &mut [f32], s: f32) {
    for_each_chunk_mut(x, 1, ELEMS_PER_CHUNK, &|_, o| o.iter_mut().for_each(|v| *v *= s));
}
