//! Dense f32 GEMM, out[n, m] = x[n, k] * w[m, k]^T, for f32 weights.
//!
//! The weight is packed once, at load time, into panels of `NR` output columns
//! stored k-major (`NR` consecutive floats per k), so the micro-kernel streams
//! one panel with unit stride while `MR` activation rows are broadcast: a 6x16
//! register tile of AVX2/FMA accumulators (12 of the 16 vector registers).
//! Tiles of `MC` rows by `PANELS_PER_TILE` panels are spread over the threads;
//! a tile's activation rows stay in L2 while its panels stream through L1.
//!
//! Every output element is one multiply-add chain over k in order, whichever
//! tile, row block or thread computes it, so results are batch-invariant: a row
//! gets the same bits alone or in a batch of hundreds.

use super::fork::{for_each_chunk, SendPtr};
use std::ops::Range;

/// Output columns per packed panel.
pub const NR: usize = 16;
/// Activation rows per micro-kernel call (of the x86 kernels).
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
pub(super) const MR: usize = 6;
/// Activation rows per parallel tile (a multiple of `MR`).
const MC: usize = 48;
/// Panels per parallel tile.
const PANELS_PER_TILE: usize = 4;

/// A weight [m, k] in panels of `NR` rows, k-major; the last panel is padded
/// with zero rows.
pub struct PackedF32 {
    data: Vec<f32>,
    pub m: usize,
    pub k: usize,
}

impl PackedF32 {
    /// Packs `m` rows of `k` values, produced by `row(r, buf)`.
    pub fn pack(m: usize, k: usize, mut row: impl FnMut(usize, &mut [f32])) -> PackedF32 {
        let panels = m.div_ceil(NR);
        let mut data = vec![0f32; panels * k * NR];
        let mut buf = vec![0f32; k];
        for r in 0..m {
            row(r, &mut buf);
            let panel = &mut data[(r / NR) * k * NR..(r / NR + 1) * k * NR];
            for (kk, &v) in buf.iter().enumerate() {
                panel[kk * NR + r % NR] = v;
            }
        }
        PackedF32 { data, m, k }
    }

    fn panel(&self, p: usize) -> &[f32] {
        &self.data[p * self.k * NR..(p + 1) * self.k * NR]
    }
}

pub(super) type Out = SendPtr<f32>;

/// out[n, m] = x[n, k] * w^T (+ bias[m] on every row).
pub fn gemm(x: &[f32], n: usize, w: &PackedF32, bias: Option<&[f32]>, out: &mut [f32]) {
    assert_eq!(x.len(), n * w.k, "gemm: activation size");
    tiled(n, w.m, bias, out, &|rows, panels, o| tile(x, w, rows, panels, o));
}

/// Runs `tile(rows, panels, out)` over tiles of `MC` rows by
/// `PANELS_PER_TILE` panels of an [n, m] output, spread over the threads; each
/// tile's bias is added while the tile is in cache (the same f32 additions as
/// a separate pass). Shared by the f32 and bf16 GEMMs.
pub(super) fn tiled(
    n: usize,
    m: usize,
    bias: Option<&[f32]>,
    out: &mut [f32],
    tile: &(dyn Fn(Range<usize>, Range<usize>, Out) + Sync),
) {
    assert_eq!(out.len(), n * m, "gemm: output size");
    assert!(bias.is_none_or(|b| b.len() == m), "gemm: bias size");
    let panels = m.div_ceil(NR);
    let row_tiles = n.div_ceil(MC);
    let col_tiles = panels.div_ceil(PANELS_PER_TILE);
    let o = SendPtr(out.as_mut_ptr());
    for_each_chunk(row_tiles * col_tiles, 1, &|tiles| {
        for t in tiles {
            let rows = (t / col_tiles) * MC..((t / col_tiles + 1) * MC).min(n);
            let ps = (t % col_tiles) * PANELS_PER_TILE..((t % col_tiles + 1) * PANELS_PER_TILE).min(panels);
            tile(rows.clone(), ps.clone(), o);
            if let Some(b) = bias {
                let cols = ps.start * NR..(ps.end * NR).min(m);
                for r in rows {
                    // SAFETY: this tile's rows and columns belong to this task alone.
                    let row = unsafe { std::slice::from_raw_parts_mut(o.get().add(r * m + cols.start), cols.len()) };
                    row.iter_mut().zip(&b[cols.clone()]).for_each(|(v, b)| *v += b);
                }
            }
        }
    });
}

/// The loop over weight panels and row blocks of up to MR rows of one tile,
/// calling `$kernel::<R>(a, panel, k, c, ldc, cols)`. A macro, not a function,
/// so each caller's kernel inlines under that caller's target features.
#[cfg(target_arch = "x86_64")]
macro_rules! panel_loop {
    ($x:expr, $w:expr, $k:expr, $rows:expr, $panels:expr, $o:expr, $kernel:ident) => {
        for p in $panels {
            let b = $w.panel(p);
            let cols = NR.min($w.m - p * NR);
            let mut r = $rows.start;
            while r < $rows.end {
                let nr = MR.min($rows.end - r);
                let a = &$x[r * $k..(r + nr) * $k];
                // SAFETY: rows r..r+nr and columns p*NR..p*NR+cols are this tile's.
                let c = $o.get().add(r * $w.m + p * NR);
                match nr {
                    6 => $kernel::<6>(a, b, $k, c, $w.m, cols),
                    5 => $kernel::<5>(a, b, $k, c, $w.m, cols),
                    4 => $kernel::<4>(a, b, $k, c, $w.m, cols),
                    3 => $kernel::<3>(a, b, $k, c, $w.m, cols),
                    2 => $kernel::<2>(a, b, $k, c, $w.m, cols),
                    _ => $kernel::<1>(a, b, $k, c, $w.m, cols),
                }
                r += nr;
            }
        }
    };
}
#[cfg(target_arch = "x86_64")]
pub(super) use panel_loop;

fn tile(x: &[f32], w: &PackedF32, rows: Range<usize>, panels: Range<usize>, o: Out) {
    #[cfg(target_arch = "x86_64")]
    if super::simd::has_avx2() {
        // SAFETY: the CPU supports AVX2 and FMA (checked at run time).
        unsafe { tile_avx2(x, w, rows, panels, o) };
        return;
    }
    tile_generic(x, w, rows, panels, o)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn tile_avx2(x: &[f32], w: &PackedF32, rows: Range<usize>, panels: Range<usize>, o: Out) {
    panel_loop!(x, w, w.k, rows, panels, o, kernel_avx2);
}

/// C[R, cols] = A[R, k] * panel, one FMA chain per element.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn kernel_avx2<const R: usize>(a: &[f32], b: &[f32], k: usize, c: *mut f32, ldc: usize, cols: usize) {
    use std::arch::x86_64::*;
    debug_assert!(a.len() == R * k && b.len() == k * NR);
    let mut acc = [[_mm256_setzero_ps(); 2]; R];
    let (ap, bp) = (a.as_ptr(), b.as_ptr());
    for kk in 0..k {
        let b0 = _mm256_loadu_ps(bp.add(kk * NR));
        let b1 = _mm256_loadu_ps(bp.add(kk * NR + 8));
        for (i, acc) in acc.iter_mut().enumerate() {
            let av = _mm256_set1_ps(*ap.add(i * k + kk));
            acc[0] = _mm256_fmadd_ps(av, b0, acc[0]);
            acc[1] = _mm256_fmadd_ps(av, b1, acc[1]);
        }
    }
    store_rows(&acc, c, ldc, cols);
}

/// A kernel's R x NR accumulators (two vectors a row) into the first `cols`
/// columns of R rows of c, `ldc` apart; inlined into the kernels, whose
/// target features it takes.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub(super) unsafe fn store_rows(acc: &[[std::arch::x86_64::__m256; 2]], c: *mut f32, ldc: usize, cols: usize) {
    use std::arch::x86_64::_mm256_storeu_ps;
    for (i, acc) in acc.iter().enumerate() {
        let dst = c.add(i * ldc);
        if cols == NR {
            _mm256_storeu_ps(dst, acc[0]);
            _mm256_storeu_ps(dst.add(8), acc[1]);
        } else {
            let mut tmp = [0f32; NR];
            _mm256_storeu_ps(tmp.as_mut_ptr(), acc[0]);
            _mm256_storeu_ps(tmp.as_mut_ptr().add(8), acc[1]);
            std::ptr::copy_nonoverlapping(tmp.as_ptr(), dst, cols);
        }
    }
}

/// The portable path: the same tiles and the same per-element order.
fn tile_generic(x: &[f32], w: &PackedF32, rows: Range<usize>, panels: Range<usize>, o: Out) {
    for p in panels {
        let b = w.panel(p);
        let cols = NR.min(w.m - p * NR);
        for r in rows.clone() {
            let a = &x[r * w.k..(r + 1) * w.k];
            let mut acc = [0f32; NR];
            for (kk, &av) in a.iter().enumerate() {
                for (c, &bv) in acc.iter_mut().zip(&b[kk * NR..(kk + 1) * NR]) {
                    *c = av.mul_add(bv, *c);
                }
            }
            // SAFETY: row r, columns p*NR..p*NR+cols belong to this tile.
            unsafe { std::ptr::copy_nonoverlapping(acc.as_ptr(), o.get().add(r * w.m + p * NR), cols) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reference(x: &[f32], n: usize, w: &[f32], m: usize, k: usize) -> Vec<f32> {
        let mut out = vec![0f32; n * m];
        for t in 0..n {
            for r in 0..m {
                out[t * m + r] = (0..k).map(|i| x[t * k + i] as f64 * w[r * k + i] as f64).sum::<f64>() as f32;
            }
        }
        out
    }

    #[test]
    fn matches_reference_and_is_batch_invariant() {
        let mut s = 0x2545_f491_4f6c_dd1du64;
        let mut rnd = move || {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s % 2001) as f32 / 1000.0 - 1.0
        };
        // Odd sizes: partial panels, partial row blocks and tiles, one row.
        for &(n, m, k) in &[(1, 1, 1), (1, 17, 5), (7, 33, 64), (53, 70, 129), (100, 16, 384)] {
            let x: Vec<f32> = (0..n * k).map(|_| rnd()).collect();
            let w: Vec<f32> = (0..m * k).map(|_| rnd()).collect();
            let p = PackedF32::pack(m, k, |r, buf| buf.copy_from_slice(&w[r * k..(r + 1) * k]));
            let mut out = vec![0f32; n * m];
            gemm(&x, n, &p, None, &mut out);
            let want = reference(&x, n, &w, m, k);
            for (i, (a, b)) in out.iter().zip(&want).enumerate() {
                assert!((a - b).abs() <= 1e-5 * (k as f32).sqrt() * 4.0, "({n},{m},{k}) {i}: {a} vs {b}");
            }
            for t in 0..n {
                let mut one = vec![0f32; m];
                gemm(&x[t * k..(t + 1) * k], 1, &p, None, &mut one);
                assert_eq!(one, out[t * m..(t + 1) * m], "row {t} alone differs from the batch");
            }
        }
    }
}
