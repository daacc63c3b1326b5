//! Row-wise CPU ops: norms, gated activations, rotary embedding.

use crate::{Activation, Rope};
use rayon::prelude::*;

/// Rows at least this long are processed in parallel.
const PAR_MIN: usize = 8;

pub fn rms_norm(x: &[f32], w: &[f32], eps: f32) -> Vec<f32> {
    let g = w.len();
    let mut out = vec![0f32; x.len()];
    let f = |(o, xi): (&mut [f32], &[f32])| {
        let ms = xi.iter().map(|v| v * v).sum::<f32>() / g as f32;
        let r = 1.0 / (ms + eps).sqrt();
        for ((oe, &xe), &we) in o.iter_mut().zip(xi).zip(w) {
            *oe = xe * r * we;
        }
    };
    if x.len() / g >= PAR_MIN {
        out.par_chunks_mut(g).zip(x.par_chunks(g)).for_each(f);
    } else {
        out.chunks_mut(g).zip(x.chunks(g)).for_each(f);
    }
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
    out.par_chunks_mut(4096).zip(gate.par_chunks(4096).zip(up.par_chunks(4096))).for_each(|(o, (g, u))| {
        for ((oe, &ge), &ue) in o.iter_mut().zip(g).zip(u) {
            *oe = activate(ge, act) * ue;
        }
    });
    out
}

pub fn rope(x: &mut [f32], cols: usize, rope: &Rope, positions: &[u32]) {
    let hd = rope.head_dim;
    let half = hd / 2;
    let f = |(row, pos): (&mut [f32], &u32)| {
        let p = *pos as f32;
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
    if positions.len() >= PAR_MIN {
        x.par_chunks_mut(cols).zip(positions.par_iter()).for_each(f);
    } else {
        x.chunks_mut(cols).zip(positions.iter()).for_each(f);
    }
}
