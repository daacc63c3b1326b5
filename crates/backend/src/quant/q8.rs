//! Activation quantization: each row of f32 activations becomes blocks of 32 int8
//! values with one f32 scale, so weight-by-activation products are integer dots.

#[derive(Clone, Copy, Debug)]
pub struct Q8Block {
    pub d: f32,
    /// `d * sum(qs)`, used by formats whose weights carry an offset (min).
    pub dsum: f32,
    pub qs: [i8; 32],
}

impl Default for Q8Block {
    fn default() -> Self {
        Q8Block { d: 0.0, dsum: 0.0, qs: [0; 32] }
    }
}

/// Quantize `x` (length a multiple of 32) into `out` (x.len() / 32 blocks).
#[inline(always)]
pub fn quantize_row_q8(x: &[f32], out: &mut [Q8Block]) {
    debug_assert_eq!(x.len(), out.len() * 32);
    for (xb, ob) in x.chunks_exact(32).zip(out.iter_mut()) {
        let amax = xb.iter().fold(0f32, |a, &v| a.max(v.abs()));
        let d = amax / 127.0;
        let id = if d > 0.0 { 1.0 / d } else { 0.0 };
        let mut sum = 0i32;
        for (q, &v) in ob.qs.iter_mut().zip(xb) {
            let r = (v * id).round() as i32;
            *q = r.clamp(-127, 127) as i8;
            sum += *q as i32;
        }
        ob.d = d;
        ob.dsum = d * sum as f32;
    }
}
