//! The distribution a [`RowSampling`] draws from, computed plainly (sorting
//! the row): the reference the device samplers are checked against.

use crate::{LogitEdit, RowSampling};

/// `r` with its pending token, once known, folded into its edits.
pub fn with_pending(r: &RowSampling, token: u32) -> RowSampling {
    let Some(p) = r.pending else { return r.clone() };
    let mut edits = r.edits.clone();
    match edits.iter_mut().find(|e| e.token == token) {
        Some(e) => *e = p.after(e),
        None => edits.push(p.after(&LogitEdit::none(token))),
    }
    RowSampling { edits, pending: None, ..r.clone() }
}

/// The row after edits and sanitizing (NaN -> -inf, +inf -> f32::MAX).
pub fn edited(logits: &[f32], r: &RowSampling) -> Vec<f32> {
    let mut x = logits.to_vec();
    for e in &r.edits {
        if let Some(v) = x.get_mut(e.token as usize) {
            *v = e.apply(*v);
        }
    }
    for v in &mut x {
        if v.is_nan() {
            *v = f32::NEG_INFINITY;
        } else if *v == f32::INFINITY {
            *v = f32::MAX;
        }
    }
    x
}

/// Probability of each token under `r` (greedy: 1 at the first argmax).
pub fn probabilities(logits: &[f32], r: &RowSampling) -> Vec<f64> {
    let x = edited(logits, r);
    let mx = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let argmax = x.iter().position(|&v| v == mx).unwrap_or(0);
    let mut probs = vec![0f64; x.len()];
    let inv_t = 1.0 / r.temperature;
    if r.temperature.is_nan() || r.temperature <= 0.0 || !inv_t.is_finite() {
        probs[argmax] = 1.0;
        return probs;
    }
    let mut order: Vec<usize> = (0..x.len()).collect();
    order.sort_by(|&a, &b| x[b].total_cmp(&x[a]).then(a.cmp(&b)));
    let w = |i: usize| f64::from(x[i] - mx).exp();
    let mut keep = order.len();
    if r.top_k > 0 {
        keep = keep.min(r.top_k as usize);
    }
    if r.top_p < 1.0 {
        let z: f64 = order[..keep].iter().map(|&i| w(i)).sum();
        let mut acc = 0.0;
        let n = order[..keep].iter().take_while(|&&i| {
            let before = acc;
            acc += w(i);
            before < f64::from(r.top_p) * z
        });
        keep = n.count().max(1);
    }
    let floor = if r.min_p > 0.0 { mx + r.min_p.ln() } else { f32::NEG_INFINITY };
    let kept: Vec<usize> =
        order[..keep].iter().copied().filter(|&i| x[i] >= floor && x[i] > f32::NEG_INFINITY).collect();
    if kept.is_empty() {
        probs[argmax] = 1.0;
        return probs;
    }
    let total: f64 = kept.iter().map(|&i| f64::from((x[i] - mx) * inv_t).exp()).sum();
    for &i in &kept {
        probs[i] = f64::from((x[i] - mx) * inv_t).exp() / total;
    }
    probs
}

/// log-softmax of the edited row at `token` (the logprob a sampler reports).
pub fn logprob(logits: &[f32], r: &RowSampling, token: u32) -> f32 {
    let x = edited(logits, r);
    let mx = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let z: f64 = x.iter().map(|&v| f64::from(v - mx).exp()).sum();
    x[token as usize] - mx - z.ln() as f32
}
