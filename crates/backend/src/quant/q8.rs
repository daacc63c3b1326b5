//! Activation quantization: each row of f32 activations becomes blocks of 32 int16
//! values with one f32 scale, so weight-by-activation products are integer dots.

/// Largest quantized magnitude. 16-bit activations keep the integer dot
/// products (i8/i5/i6 weights widened to i16, multiplied pairwise into i32) as
/// cheap as 8-bit ones while cutting the activation rounding error 256-fold, so
/// logits stay within ~1e-2 of exact arithmetic.
const Q_MAX: i32 = 32767;

#[derive(Clone, Copy, Debug)]
pub struct Q8Block {
    pub d: f32,
    /// `d * sum(qs)`, used by formats whose weights carry an offset (min).
    pub dsum: f32,
    pub qs: [i16; 32],
}

impl Default for Q8Block {
    fn default() -> Self {
        Q8Block { d: 0.0, dsum: 0.0, qs: [0; 32] }
    }
}

/// Quantize `x` (length a multiple of `group`) into `out` (x.len() / 32 blocks);
/// each `group` elements (a multiple of 32) share one scale. The matmul uses 32
/// for every format: finer than llama.cpp's 256 (Q8_K) for k-quants, so closer to
/// exact arithmetic.
#[inline(always)]
pub fn quantize_row_q8(x: &[f32], out: &mut [Q8Block], group: usize) {
    debug_assert_eq!(x.len(), out.len() * 32);
    debug_assert_eq!(x.len() % group, 0);
    let per = group / 32;
    for (xg, og) in x.chunks_exact(group).zip(out.chunks_exact_mut(per)) {
        let amax = xg.iter().fold(0f32, |a, &v| a.max(v.abs()));
        let d = amax / Q_MAX as f32;
        let id = if d > 0.0 { 1.0 / d } else { 0.0 };
        for (xb, ob) in xg.chunks_exact(32).zip(og.iter_mut()) {
            quantize_block(xb, ob, d, id);
        }
    }
}

#[inline(always)]
fn quantize_block(xb: &[f32], ob: &mut Q8Block, d: f32, id: f32) {
    {
        let mut sum = 0i32;
        for (q, &v) in ob.qs.iter_mut().zip(xb) {
            let r = (v * id).round() as i32;
            *q = r.clamp(-Q_MAX, Q_MAX) as i16;
            sum += *q as i32;
        }
        ob.d = d;
        ob.dsum = d * sum as f32;
    }
}
