//! Row-wise CPU ops: norms, gated activations, rotary embedding.

use super::fork::for_each_chunk_mut;
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

fn gelu_tanh(x: f32) -> f32 {
    const C: f32 = 0.797_884_6; // sqrt(2 / pi)
    0.5 * x * (1.0 + (C * (x + 0.044715 * x * x * x)).tanh())
}

fn erf(x: f32) -> f32 {
    // Abramowitz-Stegun 7.1.26 is too coarse for 1e-4 goldens; use f64 series/continued form.
    let x = x as f64;
    let t = 1.0 / (1.0 + 0.5 * x.abs());
    let y = 1.0
        - t * (-x * x - 1.265_512_23
            + t * (1.000_023_68
                + t * (0.374_091_96
                    + t * (0.096_784_18
                        + t * (-0.186_288_06
                            + t * (0.278_868_07
                                + t * (-1.135_203_98
                                    + t * (1.488_515_87 + t * (-0.822_152_23 + t * 0.170_872_77)))))))))
            .exp();
    (if x >= 0.0 { y } else { -y }) as f32
}

pub fn activate(x: f32, act: Activation) -> f32 {
    match act {
        Activation::Silu => x / (1.0 + (-x).exp()),
        Activation::GeluTanh => gelu_tanh(x),
        Activation::Gelu => 0.5 * x * (1.0 + erf(x / std::f32::consts::SQRT_2)),
    }
}

pub fn glu(gate: &[f32], up: &[f32], act: Activation) -> Vec<f32> {
    let mut out = vec![0f32; gate.len()];
    for_each_chunk_mut(&mut out, 1, 4096, &|first, o| {
        let (g, u) = (&gate[first..first + o.len()], &up[first..first + o.len()]);
        for ((oe, &ge), &ue) in o.iter_mut().zip(g).zip(u) {
            *oe = activate(ge, act) * ue;
        }
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
    for_each_chunk_mut(x, 1, 4096, &|_, o| o.iter_mut().for_each(|v| *v = activate(*v, act)));
}
