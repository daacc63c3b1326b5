//! Row-wise CPU ops: norms, gated activations, rotary embedding.

use super::fork::for_each_chunk_mut;
use super::math::{erf, exp};
use crate::{Activation, Rope};

/// Rows per parallel chunk: a single decode row runs on the calling thread.
const ROWS_PER_CHUNK: usize = 8;

pub fn rms_norm(x: &[f32], w: &[f32], eps: f32) -> Vec<f32> {
    let g = w.len();
    let mut out = vec![0f32; x.len()];
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
    let mut out = vec![0f32; gate.len()];
    for_each_chunk_mut(&mut out, 1, 4096, &|first, o| {
        let n = o.len();
        act_dispatch(o, &gate[first..first + n], Some(&up[first..first + n]), act);
    });
    out
}

pub fn rope(x: &mut [f32], cols: usize, rope: &Rope, positions: &[u32]) {
    let hd = rope.head_dim;
    let half = hd / 2;
    let f = |row: &mut [f32], pos: u32| {
        let p = pos as f32;
        let (sin, cos): (Vec<f32>, Vec<f32>) = rope.inv_freq.iter().map(|f| (p * f).sin_cos()).unzip();
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
    let mut out = vec![0f32; x.len()];
    for_each_chunk_mut(&mut out, g, ROWS_PER_CHUNK, &|first, o| {
        for (i, o) in o.chunks_mut(g).enumerate() {
            let xi = &x[(first + i) * g..(first + i + 1) * g];
            // Two passes in f64: the mean can be large against the spread.
            let mean = xi.iter().map(|&v| v as f64).sum::<f64>() / g as f64;
            let var = xi.iter().map(|&v| (v as f64 - mean).powi(2)).sum::<f64>() / g as f64;
            let r = 1.0 / (var + eps as f64).sqrt();
            for (j, (oe, &xe)) in o.iter_mut().zip(xi).enumerate() {
                *oe = ((xe as f64 - mean) * r) as f32 * w[j] + b.map_or(0.0, |b| b[j]);
            }
        }
    });
    out
}

pub fn activate_all(x: &mut [f32], act: Activation) {
    let src = x.to_vec();
    for_each_chunk_mut(x, 1, 4096, &|first, o| {
        let n = o.len();
        act_dispatch(o, &src[first..first + n], None, act);
    });
}
