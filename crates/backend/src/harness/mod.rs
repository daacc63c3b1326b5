//! The op harness: every op of a backend against the CPU backend on random
//! inputs, with a relative-error limit per arithmetic (DESIGN.md, tests
//! ladder step 1). `ferrite gpu-check` runs it on a GPU; the CPU checks itself
//! in the unit tests (so the harness code runs in CI).

mod attention;

use crate::cpu::CpuBackend;
use crate::sampling;
use crate::{Activation, AttnParams, Backend, LogitEdit, PendingEdit, RawWeight, Reduce, Rope, RowSampling};
use ferrite_core::{DType, HostBytes, Result};

/// Relative error limits of the issue: f32 arithmetic, f16 and bf16 operands.
pub const TOL_F32: f32 = 1e-5;
pub const TOL_F16: f32 = 2e-3;
pub const TOL_BF16: f32 = 1e-2;
/// Quantized weights against their dequantized values: the activations are
/// rounded per 32-block on the way in: to 16 bits on the CPU, to 8 in the
/// CUDA decode kernels (as llama.cpp's GPU kernels).
pub const TOL_Q8: f32 = 1e-2;
/// The same after ops whose heavy-tailed outputs (a gated activation's, an
/// RMS norm's with the harness's random weights: products of two random
/// factors) a GPU decode kernel rounds to 8 bits: a value's error is up to
/// its block's largest over 254, and the block largest is many times the
/// typical value.
pub const TOL_X8_TAILED: f32 = 2e-2;

pub const QUANT_TYPES: [DType; 8] =
    [DType::Q4_0, DType::Q4_1, DType::Q5_0, DType::Q5_1, DType::Q8_0, DType::Q4K, DType::Q5K, DType::Q6K];

/// xorshift64: deterministic test data.
pub struct Rng(pub u64);

impl Rng {
    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    /// Uniform in [-a, a].
    pub fn vec(&mut self, n: usize, a: f32) -> Vec<f32> {
        (0..n).map(|_| ((self.next_u64() % 20001) as f32 / 10000.0 - 1.0) * a).collect()
    }

    /// `m` rows of `k` random `dtype` values: dense ones in [-1, 1], quantized
    /// blocks with small sane f16 scales.
    pub fn weight(&mut self, dtype: DType, m: usize, k: usize) -> Vec<u8> {
        match dtype {
            DType::F32 => return self.vec(m * k, 1.0).iter().flat_map(|v| v.to_le_bytes()).collect(),
            DType::F16 => {
                return self.vec(m * k, 1.0).iter().flat_map(|&v| half::f16::from_f32(v).to_le_bytes()).collect()
            }
            DType::BF16 => {
                return self.vec(m * k, 1.0).iter().flat_map(|&v| half::bf16::from_f32(v).to_le_bytes()).collect()
            }
            _ => {}
        }
        let bb = dtype.block_bytes();
        let mut bytes: Vec<u8> = (0..m * k / dtype.block_size() * bb).map(|_| self.next_u64() as u8).collect();
        let scales: &[usize] = match dtype {
            DType::Q6K => &[208],
            DType::Q4_0 | DType::Q5_0 | DType::Q8_0 => &[0],
            _ => &[0, 2],
        };
        for b in bytes.chunks_mut(bb) {
            for &o in scales {
                let s = 0.005 + (self.next_u64() % 100) as f32 / 4000.0;
                b[o..o + 2].copy_from_slice(&half::f16::from_f32(s).to_le_bytes());
            }
        }
        bytes
    }
}

/// One checked case.
#[derive(Clone, Debug)]
pub struct Check {
    pub op: String,
    pub rel_err: f32,
    pub tol: f32,
}

impl Check {
    pub fn passed(&self) -> bool {
        self.rel_err <= self.tol
    }
}

/// max |got - want| / max |want|.
pub fn rel_err(got: &[f32], want: &[f32]) -> f32 {
    if got.len() != want.len() {
        return f32::INFINITY;
    }
    let scale = want.iter().fold(0f32, |m, v| m.max(v.abs())).max(1e-30);
    let diff = got
        .iter()
        .zip(want)
        .fold(0f32, |m, (a, b)| if (a - b).is_nan() { f32::INFINITY } else { m.max((a - b).abs()) });
    diff / scale
}

/// The limit for a matmul with weights of `dt` (quantized: against the
/// dequantized weights; f32: whatever the backend multiplies f32 in).
fn matmul_tol(dt: DType, dense_f32_tol: f32) -> f32 {
    match dt {
        DType::F32 => dense_f32_tol,
        DType::BF16 => TOL_BF16,
        DType::F16 => TOL_F16,
        _ => TOL_Q8,
    }
}

fn raw(name: &str, dtype: DType, rows: usize, cols: usize, bytes: Vec<u8>) -> RawWeight {
    RawWeight { name: name.into(), dtype, rows, cols, bytes: HostBytes::from_vec(bytes) }
}

/// A reference's weights: blocks dequantized, others as they are.
fn dequantized_or_same(w: &RawWeight) -> Result<RawWeight> {
    if w.dtype.is_quantized() {
        dequantized(w)
    } else {
        Ok(w.clone())
    }
}

/// The same weights as f32, for quantized references.
fn dequantized(w: &RawWeight) -> Result<RawWeight> {
    let rb = w.cols / w.dtype.block_size() * w.dtype.block_bytes();
    let mut out = Vec::with_capacity(w.rows * w.cols * 4);
    let mut row = vec![0f32; w.cols];
    for r in 0..w.rows {
        crate::quant::dequantize_row(w.dtype, &w.bytes.as_slice()[r * rb..(r + 1) * rb], &mut row)?;
        out.extend(row.iter().flat_map(|v| v.to_le_bytes()));
    }
    Ok(raw(&w.name, DType::F32, w.rows, w.cols, out))
}

struct Harness<'a, B: Backend> {
    b: &'a B,
    cpu: CpuBackend,
    rng: Rng,
    out: Vec<Check>,
    /// Told of each check as it completes (progress on slow devices).
    report: &'a mut dyn FnMut(&Check),
}

impl<B: Backend> Harness<'_, B> {
    fn up(&self, v: &[f32], rows: usize, cols: usize) -> Result<(B::Tensor, crate::cpu::CpuTensor)> {
        Ok((self.b.upload(v.to_vec(), rows, cols)?, self.cpu.upload(v.to_vec(), rows, cols)?))
    }

    fn record(&mut self, op: String, got: &B::Tensor, want: &crate::cpu::CpuTensor, tol: f32) -> Result<()> {
        let got = self.b.to_host(got)?;
        self.push(op, rel_err(&got, &want.data), tol);
        Ok(())
    }

    fn push(&mut self, op: String, rel_err: f32, tol: f32) {
        let c = Check { op, rel_err, tol };
        (self.report)(&c);
        self.out.push(c);
    }

    /// x [n, k] times a random weight [m, k] of type `dt`, against the CPU
    /// with the weight dequantized.
    fn matmul_random(&mut self, dt: DType, (n, m, k): (usize, usize, usize), dense_f32_tol: f32) -> Result<()> {
        let w = raw("w", dt, m, k, self.rng.weight(dt, m, k));
        let reference = dequantized_or_same(&w)?;
        let x = self.rng.vec(n * k, 1.0);
        let (xb, xc) = self.up(&x, n, k)?;
        let got = self.b.matmul(&xb, &self.b.weight(w)?)?;
        let want = self.cpu.matmul(&xc, &self.cpu.weight(reference)?)?;
        self.record(format!("matmul {dt} [{n}x{k}]·[{m}x{k}]ᵀ"), &got, &want, matmul_tol(dt, dense_f32_tol))
    }

    fn matmuls(&mut self, dense_f32_tol: f32) -> Result<()> {
        // 12,801 rows: enough for GPU kernels that take several weight rows
        // per warp (and a partial group at the end); 5,001 and 70 rows: one
        // input row at model-like k; k = 2048 is the first whose Q6_K rows
        // need no padding on the GPU.
        for &(n, m, k) in &[
            (1, 96, 256),
            (3, 40, 512),
            (7, 130, 512),
            (8, 64, 1024),
            (2, 24, 2048),
            (33, 64, 768),
            (3, 12801, 256),
            (1, 5001, 1024),
            (1, 70, 3072),
        ] {
            for dt in [DType::F32, DType::F16, DType::BF16].into_iter().chain(QUANT_TYPES) {
                self.matmul_random(dt, (n, m, k), dense_f32_tol)?;
            }
        }
        // Projections sharing an input, in one call (decode and prefill sizes).
        // Mixed types as in Q4_K_M files (v in Q6_K): runs of one type per
        // launch, block and k-quant types each with their own input order;
        // row counts off warp and block boundaries.
        let (b16, f16, q4, q6) = (DType::BF16, DType::F16, DType::Q4K, DType::Q6K);
        let q8 = DType::Q8_0;
        for (n, dts) in
            [(2, [b16; 3]), (20, [f16; 3]), (5, [q4; 3]), (3, [q4, q4, q6]), (12, [q4, q6, q6]), (4, [q4, q8, q6])]
        {
            let k = 512;
            let mut shapes = [97, 41, 40].into_iter().zip(dts);
            let raws: [RawWeight; 3] = std::array::from_fn(|_| {
                let (m, dt) = shapes.next().expect("three shapes");
                raw("w", dt, m, k, self.rng.weight(dt, m, k))
            });
            let x = self.rng.vec(n * k, 1.0);
            let (xb, xc) = self.up(&x, n, k)?;
            let [w0, w1, w2] = raws.clone().map(|w| self.b.weight(w));
            let got = self.b.matmul_many(&xb, [&w0?, &w1?, &w2?])?;
            for (i, (g, w)) in got.iter().zip(&raws).enumerate() {
                let dt = w.dtype;
                let reference = dequantized_or_same(w)?;
                let want = self.cpu.matmul(&xc, &self.cpu.weight(reference)?)?;
                let tol = matmul_tol(dt, dense_f32_tol);
                self.record(format!("matmul_many {dt} n={n} weight {i}"), g, &want, tol)?;
            }
        }
        // Gate and up with the gated activation in one call: decode sizes (a
        // GPU's fused GEMV), a prefill size, and a quantized pair.
        for (n, dt, act) in [
            (1, DType::BF16, Activation::Silu),
            (5, DType::F16, Activation::GeluTanh),
            (8, DType::BF16, Activation::Gelu),
            (12, DType::BF16, Activation::Silu),
            (13, DType::BF16, Activation::GeluTanh),
            (2, DType::Q4K, Activation::Silu),
        ] {
            let (m, k) = (75, 256);
            let g = raw("gate", dt, m, k, self.rng.weight(dt, m, k));
            let u = raw("up", dt, m, k, self.rng.weight(dt, m, k));
            let x = self.rng.vec(n * k, 1.0);
            let (xb, xc) = self.up(&x, n, k)?;
            let got = self.b.matmul_glu(&xb, &self.b.weight(g.clone())?, &self.b.weight(u.clone())?, act)?;
            let (gc, uc) = (self.cpu.weight(dequantized_or_same(&g)?)?, self.cpu.weight(dequantized_or_same(&u)?)?);
            let want = self.cpu.glu(&self.cpu.matmul(&xc, &gc)?, &self.cpu.matmul(&xc, &uc)?, act)?;
            self.record(format!("matmul_glu {dt} n={n} {act:?}"), &got, &want, matmul_tol(dt, dense_f32_tol))?;
        }
        // One weight, row counts in one power-of-two range (GPUs reuse the
        // GEMM algorithm chosen for the first), some above 64.
        let (m, k) = (97, 256);
        let w = raw("w", DType::BF16, m, k, self.rng.weight(DType::BF16, m, k));
        let (wb, wc) = (self.b.weight(w.clone())?, self.cpu.weight(w)?);
        for n in [40, 35, 64, 33, 47, 100, 1000, 999] {
            let x = self.rng.vec(n * k, 1.0);
            let (xb, xc) = self.up(&x, n, k)?;
            let (got, want) = (self.b.matmul(&xb, &wb)?, self.cpu.matmul(&xc, &wc)?);
            self.record(format!("matmul bf16 [{n}x{k}]·[{m}x{k}]ᵀ, one weight"), &got, &want, TOL_BF16)?;
        }
        // With a bias (in the GEMM's epilogue on GPUs), decode and prefill sizes.
        for (n, dt) in [
            (3, DType::BF16),
            (40, DType::BF16),
            (150, DType::BF16),
            (33, DType::F16),
            (17, DType::F32),
            (9, DType::Q4K),
        ] {
            let (m, k) = (97, 256);
            let w = raw("w", dt, m, k, self.rng.weight(dt, m, k));
            let reference = dequantized_or_same(&w)?;
            let (x, bias) = (self.rng.vec(n * k, 1.0), self.rng.vec(m, 1.0));
            let (xb, xc) = self.up(&x, n, k)?;
            let (bb, bc) = self.up(&bias, 1, m)?;
            let got = self.b.linear(&xb, &self.b.weight(w)?, Some(&bb))?;
            let want = self.cpu.linear(&xc, &self.cpu.weight(reference)?, Some(&bc))?;
            let tol = matmul_tol(dt, dense_f32_tol);
            self.record(format!("linear {dt} with bias [{n}x{k}]·[{m}x{k}]ᵀ"), &got, &want, tol)?;
        }
        self.fused_matmuls(dense_f32_tol)?;
        self.folded_norms(dense_f32_tol)
    }

    /// Norms folded into 16-bit weights (`Backend::fold_norm`, where the
    /// backend folds): the normed matmuls with the norm it returns, against
    /// the reference with the norm and weights as they were, at decode sizes
    /// (GPUs: GEMVs that norm by the input's squares) and prefill sizes.
    fn folded_norms(&mut self, dense_f32_tol: f32) -> Result<()> {
        let k = 1024;
        for (n, dt) in [(1, DType::BF16), (1, DType::F16), (3, DType::BF16), (12, DType::F16)] {
            let raws: [RawWeight; 3] = std::array::from_fn(|i| {
                let m = [96, 40, 33][i];
                raw("w", dt, m, k, self.rng.weight(dt, m, k))
            });
            let (x, g) = (self.rng.vec(n * k, 3.0), self.rng.vec(k, 1.0));
            let (xb, xc) = self.up(&x, n, k)?;
            let (gb, gc) = self.up(&g, 1, k)?;
            let [w0, w1, w2] = raws.clone().map(|w| self.b.weight(w));
            let (mut w0, mut w1, mut w2) = (w0?, w1?, w2?);
            let norm = self.b.fold_norm(&gb, &mut [&mut w0, &mut w1, &mut w2])?.unwrap_or(gb);
            let got = self.b.norm_matmul_many(&xb, &norm, 1e-6, [&w0, &w1, &w2])?;
            let h = self.cpu.rms_norm(&xc, &gc, 1e-6)?;
            for (i, (got, w)) in got.iter().zip(&raws).enumerate() {
                let want = self.cpu.matmul(&h, &self.cpu.weight(w.clone())?)?;
                self.record(
                    format!("folded norm_matmul_many {dt} n={n} weight {i}"),
                    got,
                    &want,
                    matmul_tol(dt, dense_f32_tol),
                )?;
            }
            let m = 75;
            let gate = raw("gate", dt, m, k, self.rng.weight(dt, m, k));
            let up = raw("up", dt, m, k, self.rng.weight(dt, m, k));
            let (mut gw, mut uw) = (self.b.weight(gate.clone())?, self.b.weight(up.clone())?);
            let gb = self.up(&g, 1, k)?.0;
            let norm = self.b.fold_norm(&gb, &mut [&mut gw, &mut uw])?.unwrap_or(gb);
            let got = self.b.norm_matmul_glu(&xb, &norm, 1e-6, &gw, &uw, Activation::Silu)?;
            let (gc, uc) = (self.cpu.weight(gate)?, self.cpu.weight(up)?);
            let want = self.cpu.glu(&self.cpu.matmul(&h, &gc)?, &self.cpu.matmul(&h, &uc)?, Activation::Silu)?;
            self.record(format!("folded norm_matmul_glu {dt} n={n}"), &got, &want, matmul_tol(dt, dense_f32_tol))?;
        }
        Ok(())
    }

    /// The matmuls that fuse a decoder's norms and residual adds, at decode
    /// sizes (GPUs: fused into the GEMVs) and prefill sizes.
    fn fused_matmuls(&mut self, dense_f32_tol: f32) -> Result<()> {
        let (b16, f16, q4, q6, q8) = (DType::BF16, DType::F16, DType::Q4K, DType::Q6K, DType::Q8_0);
        let k = 1024;
        for (n, dts) in
            [(1, [b16; 3]), (3, [f16; 3]), (8, [b16; 3]), (12, [b16; 3]), (1, [q4, q4, q6]), (5, [q6, q8, q4])]
        {
            self.norm_matmul_many(n, dts, k, dense_f32_tol)?;
        }
        for (n, dt, act) in [
            (1, b16, Activation::Silu),
            (6, f16, Activation::GeluTanh),
            (13, b16, Activation::Silu),
            (1, q4, Activation::Silu),
        ] {
            let m = 75;
            let g = raw("gate", dt, m, k, self.rng.weight(dt, m, k));
            let u = raw("up", dt, m, k, self.rng.weight(dt, m, k));
            let (x, nw) = (self.rng.vec(n * k, 3.0), self.rng.vec(k, 1.0));
            let (xb, xc) = self.up(&x, n, k)?;
            let (nb, nc) = self.up(&nw, 1, k)?;
            let (gb, ub) = (self.b.weight(g.clone())?, self.b.weight(u.clone())?);
            let got = self.b.norm_matmul_glu(&xb, &nb, 1e-6, &gb, &ub, act)?;
            let h = self.cpu.rms_norm(&xc, &nc, 1e-6)?;
            let (gc, uc) = (self.cpu.weight(dequantized_or_same(&g)?)?, self.cpu.weight(dequantized_or_same(&u)?)?);
            let want = self.cpu.glu(&self.cpu.matmul(&h, &gc)?, &self.cpu.matmul(&h, &uc)?, act)?;
            let tol = if dt.is_quantized() { TOL_X8_TAILED } else { matmul_tol(dt, dense_f32_tol) };
            self.record(format!("norm_matmul_glu {dt} n={n} {act:?}"), &got, &want, tol)?;
        }
        for (n, dt) in
            [(1, b16), (4, f16), (9, b16), (40, b16), (1, q4), (1, q6), (2, q4), (3, q6), (20, q4), (7, DType::F32)]
        {
            let m = 96;
            let w = raw("w", dt, m, k, self.rng.weight(dt, m, k));
            let (x, a) = (self.rng.vec(n * m, 3.0), self.rng.vec(n * k, 1.0));
            let (mut xb, mut xc) = self.up(&x, n, m)?;
            let (ab, ac) = self.up(&a, n, k)?;
            self.b.matmul_add(&mut xb, &ab, &self.b.weight(w.clone())?)?;
            self.cpu.matmul_add(&mut xc, &ac, &self.cpu.weight(dequantized_or_same(&w)?)?)?;
            self.record(format!("matmul_add {dt} n={n}"), &xb, &xc, matmul_tol(dt, dense_f32_tol))?;
        }
        self.mlp_add(dense_f32_tol)
    }

    /// Three projections of one normed input (`norm_matmul_many`), of types
    /// `dts`, [n, k] by 96, 40 and 33 rows.
    fn norm_matmul_many(&mut self, n: usize, dts: [DType; 3], k: usize, dense_f32_tol: f32) -> Result<()> {
        let raws: [RawWeight; 3] = std::array::from_fn(|i| {
            let m = [96, 40, 33][i];
            raw("w", dts[i], m, k, self.rng.weight(dts[i], m, k))
        });
        let (x, g) = (self.rng.vec(n * k, 3.0), self.rng.vec(k, 1.0));
        let (xb, xc) = self.up(&x, n, k)?;
        let (gb, gc) = self.up(&g, 1, k)?;
        let [w0, w1, w2] = raws.clone().map(|w| self.b.weight(w));
        let got = self.b.norm_matmul_many(&xb, &gb, 1e-6, [&w0?, &w1?, &w2?])?;
        let h = self.cpu.rms_norm(&xc, &gc, 1e-6)?;
        for (i, (got, w)) in got.iter().zip(&raws).enumerate() {
            let want = self.cpu.matmul(&h, &self.cpu.weight(dequantized_or_same(w)?)?)?;
            // Normed by random weights: heavy-tailed inputs for the 8-bit GPU kernels.
            let tol = if w.dtype.is_quantized() { TOL_X8_TAILED } else { matmul_tol(w.dtype, dense_f32_tol) };
            self.record(format!("norm_matmul_many {} n={n} weight {i}", w.dtype), got, &want, tol)?;
        }
        Ok(())
    }

    /// A whole MLP added to the residual stream, at decode and prefill sizes
    /// (GPUs: its inner activations in 16 bits alone where GEMMs read them).
    /// (The one-row Q4_K case of 1,024 x 768 is one the fused MLP takes
    /// where switched on: `FERRITE_CUDA_MLP_FUSED=1`.)
    fn mlp_add(&mut self, dense_f32_tol: f32) -> Result<()> {
        for (n, dt, act, (k, f)) in [
            (1, DType::BF16, Activation::Silu, (256, 512)),
            (13, DType::BF16, Activation::Silu, (256, 512)),
            (40, DType::BF16, Activation::GeluTanh, (256, 512)),
            (24, DType::F16, Activation::Silu, (256, 512)),
            (1, DType::Q4K, Activation::Silu, (256, 512)),
            (1, DType::Q4K, Activation::Silu, (1024, 768)),
            (1, DType::Q6K, Activation::GeluTanh, (256, 512)),
            (3, DType::Q4K, Activation::GeluTanh, (256, 512)),
            (17, DType::Q4K, Activation::Silu, (256, 512)),
        ] {
            self.mlp_random(n, dt, act, (k, f), dense_f32_tol)?;
        }
        Ok(())
    }

    /// `mlp_add` of random `dt` weights, [n, k] through f intermediate values.
    fn mlp_random(&mut self, n: usize, dt: DType, act: Activation, (k, f): (usize, usize), tol32: f32) -> Result<()> {
        let ws = [("gate", f, k), ("up", f, k), ("down", k, f)]
            .map(|(name, m, c)| raw(name, dt, m, c, self.rng.weight(dt, m, c)));
        let (x, nw) = (self.rng.vec(n * k, 3.0), self.rng.vec(k, 1.0));
        let (mut xb, mut xc) = self.up(&x, n, k)?;
        let (nb, nc) = self.up(&nw, 1, k)?;
        let [gb, ub, db] = ws.clone().map(|w| self.b.weight(w));
        let [gc, uc, dc] = ws.clone().map(|w| dequantized_or_same(&w).and_then(|w| self.cpu.weight(w)));
        self.b.mlp_add(&mut xb, &nb, 1e-6, &gb?, &ub?, &db?, act)?;
        self.cpu.mlp_add(&mut xc, &nc, 1e-6, &gc?, &uc?, &dc?, act)?;
        let tol = if dt.is_quantized() { TOL_X8_TAILED } else { matmul_tol(dt, tol32) };
        self.record(format!("mlp_add {dt} n={n} {k}x{f} {act:?}"), &xb, &xc, tol)
    }

    fn rowwise(&mut self) -> Result<()> {
        let (n, c) = (5, 640);
        let x = self.rng.vec(n * c, 3.0);
        let y = self.rng.vec(n * c, 1.0);
        let w = self.rng.vec(c, 1.0);
        let (xb, xc) = self.up(&x, n, c)?;
        let (yb, yc) = self.up(&y, n, c)?;
        let (wb, wc) = self.up(&w, 1, c)?;
        let (hb, hc) = self.up(&w[..128], 1, 128)?;
        let got = self.b.rms_norm(&xb, &wb, 1e-6)?;
        let want = self.cpu.rms_norm(&xc, &wc, 1e-6)?;
        self.record("rms_norm row".into(), &got, &want, TOL_F32)?;
        let got = self.b.rms_norm(&xb, &hb, 1e-6)?;
        let want = self.cpu.rms_norm(&xc, &hc, 1e-6)?;
        self.record("rms_norm per head".into(), &got, &want, TOL_F32)?;
        // Rows of whole float4s (one or several per thread) and not.
        for c in [1030, 16384] {
            let (x, w) = (self.rng.vec(n * c, 3.0), self.rng.vec(c, 1.0));
            let (xb, xc) = self.up(&x, n, c)?;
            let (wb, wc) = self.up(&w, 1, c)?;
            let (got, want) = (self.b.rms_norm(&xb, &wb, 1e-6)?, self.cpu.rms_norm(&xc, &wc, 1e-6)?);
            self.record(format!("rms_norm [{n}x{c}]"), &got, &want, TOL_F32)?;
        }
        for bias in [false, true] {
            let got = self.b.layer_norm(&xb, &wb, bias.then_some(&wb), 1e-12)?;
            let want = self.cpu.layer_norm(&xc, &wc, bias.then_some(&wc), 1e-12)?;
            self.record(format!("layer_norm bias={bias}"), &got, &want, TOL_F32)?;
        }
        // Rows a warp holds (GPUs; 2, 4 or 8 float4s a lane) and not.
        for (c, bias) in [(48, true), (384, true), (1024, false), (1030, true), (4096, true)] {
            let (x, y, w) = (self.rng.vec(n * c, 3.0), self.rng.vec(n * c, 1.0), self.rng.vec(c, 1.0));
            let (yb, yc) = self.up(&y, n, c)?;
            let (wb, wc) = self.up(&w, 1, c)?;
            let b = self.rng.vec(c, 1.0);
            let (bb, bc) = self.up(&b, 1, c)?;
            let (mut g, mut wc2) = self.up(&x, n, c)?;
            let got = self.b.layer_norm(&g, &wb, bias.then_some(&bb), 1e-12)?;
            let want = self.cpu.layer_norm(&wc2, &wc, bias.then_some(&bc), 1e-12)?;
            self.record(format!("layer_norm [{n}x{c}] bias={bias}"), &got, &want, TOL_F32)?;
            let got = self.b.add_layer_norm(&mut g, &yb, &wb, bias.then_some(&bb), 1e-12)?;
            let want = self.cpu.add_layer_norm(&mut wc2, &yc, &wc, bias.then_some(&bc), 1e-12)?;
            self.record(format!("add_layer_norm [{n}x{c}] (normed)"), &got, &want, TOL_F32)?;
            self.record(format!("add_layer_norm [{n}x{c}] (sum)"), &g, &wc2, TOL_F32)?;
        }
        for act in [Activation::Silu, Activation::GeluTanh, Activation::Gelu] {
            let got = self.b.glu(&xb, &yb, act)?;
            let want = self.cpu.glu(&xc, &yc, act)?;
            self.record(format!("glu {act:?}"), &got, &want, TOL_F32)?;
            let (mut g, mut w) = self.up(&x, n, c)?;
            self.b.activate(&mut g, act)?;
            self.cpu.activate(&mut w, act)?;
            self.record(format!("activate {act:?}"), &g, &w, TOL_F32)?;
        }
        let (mut g, mut w) = self.up(&x, n, c)?;
        self.b.add(&mut g, &yb)?;
        self.cpu.add(&mut w, &yc)?;
        self.b.add_row(&mut g, &wb)?;
        self.cpu.add_row(&mut w, &wc)?;
        self.b.scale(&mut g, 0.7)?;
        self.cpu.scale(&mut w, 0.7)?;
        self.b.softcap(&mut g, 2.5)?;
        self.cpu.softcap(&mut w, 2.5)?;
        self.record("add, add_row, scale, softcap".into(), &g, &w, TOL_F32)?;
        let got = self.b.rows(&xb, &[4, 0, 2, 2])?;
        let want = self.cpu.rows(&xc, &[4, 0, 2, 2])?;
        self.record("rows".into(), &got, &want, TOL_F32)?;
        for how in [Reduce::Mean, Reduce::Max] {
            let segs = [0..1, 1..n, 2..3];
            let got = self.b.reduce_segments(&xb, &segs, how)?;
            let want = self.cpu.reduce_segments(&xc, &segs, how)?;
            self.record(format!("reduce_segments {how:?}"), &got, &want, TOL_F32)?;
        }
        for interleaved in [false, true] {
            let hd = 64;
            let rope = Rope {
                head_dim: hd,
                inv_freq: (0..hd / 2).map(|i| 10000f32.powf(-((2 * i) as f32) / hd as f32)).collect(),
                interleaved,
            };
            let positions = [0, 1, 17, 4095, 70000];
            let (mut g, mut w) = self.up(&x, n, c)?;
            self.b.rope(&mut g, &rope, &positions)?;
            self.cpu.rope(&mut w, &rope, &positions)?;
            self.record(format!("rope interleaved={interleaved}"), &g, &w, TOL_F32)?;
            // q and k together (k narrower, as with GQA).
            let kx = self.rng.vec(n * 2 * hd, 3.0);
            let (mut gq, mut wq) = self.up(&x, n, c)?;
            let (mut gk, mut wk) = self.up(&kx, n, 2 * hd)?;
            self.b.rope_qk(&mut gq, &mut gk, &rope, &positions)?;
            self.cpu.rope(&mut wq, &rope, &positions)?;
            self.cpu.rope(&mut wk, &rope, &positions)?;
            self.record(format!("rope_qk q interleaved={interleaved}"), &gq, &wq, TOL_F32)?;
            self.record(format!("rope_qk k interleaved={interleaved}"), &gk, &wk, TOL_F32)?;
        }
        Ok(())
    }

    fn embeddings(&mut self, dense_f32_tol: f32) -> Result<()> {
        for dt in [DType::F32, DType::F16, DType::BF16, DType::Q8_0, DType::Q4K, DType::Q6K] {
            self.embedding_random(dt, 256, dense_f32_tol)?;
        }
        Ok(())
    }

    /// Rows of a random table [50, d] of type `dt`, against the CPU's.
    fn embedding_random(&mut self, dt: DType, d: usize, dense_f32_tol: f32) -> Result<()> {
        let (v, ids) = (50, [3, 0, 49, 3, 17]);
        let w = raw("embd", dt, v, d, self.rng.weight(dt, v, d));
        let got = self.b.embedding(&self.b.weight(w.clone())?, &ids)?;
        let want = self.cpu.embedding(&self.cpu.weight(w)?, &ids)?;
        // Exact on the CPU; a GPU may hold quantized tables as f16, f32 ones as bf16.
        let tol = match dt {
            DType::F32 => dense_f32_tol,
            _ if dt.is_quantized() => TOL_F16,
            _ => TOL_F32,
        };
        self.record(format!("embedding {dt} [{v}x{d}]"), &got, &want, tol)
    }

    /// A mixed step: a sequence mid-prefill, a decode, and a fresh prompt,
    /// paged over scattered blocks.
    /// Device sampling against the reference distribution: greedy picks and
    /// logprobs exactly, draws by total-variation distance over many seeds.
    fn sampling(&mut self) -> Result<()> {
        // Over 1,024 tokens: a GPU splits a greedy row's tokens between blocks.
        let vocab = 4096;
        let mut logits = self.rng.vec(vocab, 4.0);
        logits[7] = f32::NAN;
        let edit = |token, bias, rep, sub| LogitEdit { token, bias, rep, sub, count: u32::from(sub != 0.0) };
        let (top, _) = logits.iter().enumerate().fold((0, f32::MIN), |a, (i, &v)| if v > a.1 { (i, v) } else { a });
        let edits = vec![
            edit(top as u32, f32::NEG_INFINITY, 1.0, 0.0),
            edit(3, 1.5, 1.3, 0.2),
            edit(9, 0.0, 1.3, 0.0),
            edit(11, 0.0, 1.0, 2.5),
        ];
        let greedy = RowSampling { edits: edits.clone(), ..RowSampling::greedy() };
        let filtered =
            RowSampling { temperature: 0.8, top_k: 40, top_p: 0.9, min_p: 0.05, edits, seed: 0, pending: None };
        let plain = RowSampling { temperature: 1.5, ..RowSampling::greedy() };
        // Greedy: the reference's token, its logprob.
        let mut t = self.b.upload(logits.clone(), 1, vocab)?;
        let got = self.b.sample(&mut t, std::slice::from_ref(&greedy))?.unwrap_or_default();
        let want = sampling::probabilities(&logits, &greedy).iter().position(|&p| p == 1.0).unwrap_or(0) as u32;
        let err = match got.first() {
            Some(&(tok, lp)) if tok == want => (lp - sampling::logprob(&logits, &greedy, want)).abs(),
            _ => 1.0,
        };
        self.push("sample greedy, with bias/penalty edits and a NaN".into(), err, 1e-4);
        self.sampling_pending(&logits)?;
        // Draws: the same row under many seeds.
        for (name, r, width) in [("T=0.8 top-k 40 top-p 0.9 min-p 0.05", filtered, 2048), ("T=1.5", plain, 64)] {
            let draws = 16384;
            let row = &logits[..width];
            let rows: Vec<RowSampling> =
                (0..draws).map(|i| RowSampling { seed: self.rng.next_u64() ^ i, ..r.clone() }).collect();
            let mut t = self.b.upload(row.repeat(draws as usize), draws as usize, width)?;
            let got = self.b.sample(&mut t, &rows)?.unwrap_or_default();
            let probs = sampling::probabilities(row, &r);
            // Draws the reference never makes count in the distance as they
            // are: with tied logits at the top-p edge, a GPU's threshold on
            // values keeps every tied token, the reference the first by index
            // (seen on the H200: 386 of 16,384 draws, 2.4%, of a token tied
            // with the last one kept). A token outside the row fails outright.
            let mut freq = vec![0f64; width];
            let mut outside = got.len() != draws as usize;
            let mut unlikely = 0;
            for &(tok, _) in &got {
                match freq.get_mut(tok as usize) {
                    Some(f) => *f += 1.0 / draws as f64,
                    None => outside = true,
                }
                unlikely += usize::from(probs.get(tok as usize).is_some_and(|&p| p == 0.0));
            }
            let tv = 0.5 * freq.iter().zip(&probs).map(|(f, p)| (f - p).abs()).sum::<f64>();
            let err = if outside { 1.0 } else { tv as f32 };
            let op = format!("sample {name}: total variation over {draws} draws ({unlikely} of p = 0)");
            self.push(op, err, 0.06);
        }
        Ok(())
    }
}

impl<B: Backend> Harness<'_, B> {
    /// Rows whose last pick, still on the device, counts as generated
    /// (`RowSampling::pending`): greedy (rows split between blocks) and drawn.
    fn sampling_pending(&mut self, first: &[f32]) -> Result<()> {
        let vocab = first.len();
        let greedy = RowSampling::greedy();
        let want = sampling::probabilities(first, &greedy).iter().position(|&p| p == 1.0).unwrap_or(0) as u32;
        let mut t = self.b.upload(first.repeat(2), 2, vocab)?;
        let got = self.b.sample(&mut t, &[greedy.clone(), greedy.clone()])?.unwrap_or_default();
        let pending = PendingEdit { rep: 1.3, presence: 0.7, frequency: 0.4 };
        // The pick on top for the first row as a token generated twice (sub
        // 1.5, edited (x + 0.2) / 1.3 - 1.5 = top + 0.2), not three times (top - 0.2).
        let mut next = self.rng.vec(vocab, 4.0);
        let top = next.iter().enumerate().filter(|&(i, _)| i != want as usize).fold(f32::MIN, |m, (_, &v)| m.max(v));
        next[want as usize] = 1.3 * (top + 1.7) - 0.2;
        let seen = LogitEdit { token: want, bias: 0.2, rep: 1.3, sub: 2.0 * 0.4 + 0.7, count: 2 };
        let rows = [
            RowSampling { edits: vec![seen, LogitEdit { rep: 1.3, ..LogitEdit::none(5) }], ..greedy.clone() },
            RowSampling { edits: vec![LogitEdit { bias: 1.0, ..LogitEdit::none(9) }], ..greedy.clone() },
        ];
        let rows = rows.map(|r| RowSampling { pending: Some(pending), ..r });
        let mut t = self.b.upload(next.repeat(2), 2, vocab)?;
        let picks = self.b.sample(&mut t, &rows)?.unwrap_or_default();
        let mut err = if got.len() == 2 && got.iter().all(|&(tok, _)| tok == want) { 0.0 } else { 1.0 };
        for (r, pick) in rows.iter().zip(picks.iter().chain([&(u32::MAX, 0.0)]).take(2)) {
            let r = sampling::with_pending(r, want);
            let best = sampling::probabilities(&next, &r).iter().position(|&p| p == 1.0).unwrap_or(0) as u32;
            err = f32::max(err, if pick.0 == best { (pick.1 - sampling::logprob(&next, &r, best)).abs() } else { 1.0 });
        }
        self.push("sample greedy with a pending pick (seen before, and not)".into(), err, 1e-4);
        // A draw, its pending token the first row's pick above, with only a bias of its own.
        let Some(&(last, _)) = picks.first() else {
            self.push("sample with a pending pick: no picks".into(), 1.0, 1e-4);
            return Ok(());
        };
        let edits = vec![LogitEdit { bias: 0.5, ..LogitEdit::none(last) }];
        let drawn = RowSampling { temperature: 0.8, top_p: 0.95, edits, pending: Some(pending), ..greedy };
        let mut t = self.b.upload(next.clone(), 1, vocab)?;
        let got = self.b.sample(&mut t, std::slice::from_ref(&drawn))?.unwrap_or_default();
        let r = sampling::with_pending(&drawn, last);
        let err = match got.first() {
            Some(&(tok, lp)) if sampling::probabilities(&next, &r)[tok as usize] > 0.0 => {
                (lp - sampling::logprob(&next, &r, tok)).abs()
            }
            _ => 1.0,
        };
        self.push("sample T=0.8 with a pending pick: its logprob".into(), err, 1e-4);
        Ok(())
    }

    /// Ops whose output a GEMM with 16-bit weights reads next (a GPU may
    /// hand it a 16-bit copy the op wrote), and an op in place between
    /// (which must drop such a copy).
    fn gemm_after_ops(&mut self) -> Result<()> {
        let (n, c, m) = (70, 384, 97);
        let w = raw("w", DType::BF16, m, c, self.rng.weight(DType::BF16, m, c));
        let (wb, wc) = (self.b.weight(w.clone())?, self.cpu.weight(w)?);
        let (x, y, g) = (self.rng.vec(n * c, 3.0), self.rng.vec(n * c, 1.0), self.rng.vec(c, 1.0));
        let (xb, xc) = self.up(&x, n, c)?;
        let (yb, yc) = self.up(&y, n, c)?;
        let (gb, gc) = self.up(&g, 1, c)?;
        let nb = self.b.layer_norm(&xb, &gb, Some(&gb), 1e-12)?;
        let nc = self.cpu.layer_norm(&xc, &gc, Some(&gc), 1e-12)?;
        let (got, want) = (self.b.matmul(&nb, &wb)?, self.cpu.matmul(&nc, &wc)?);
        self.record("layer_norm, then a bf16 GEMM".into(), &got, &want, TOL_BF16)?;
        let (mut ab, mut ac) = (nb, nc);
        self.b.add(&mut ab, &yb)?;
        self.cpu.add(&mut ac, &yc)?;
        let (got, want) = (self.b.matmul(&ab, &wb)?, self.cpu.matmul(&ac, &wc)?);
        self.record("layer_norm, add, then a bf16 GEMM".into(), &got, &want, TOL_BF16)?;
        let (mut sb, mut sc) = self.up(&x, n, c)?;
        let nb = self.b.add_layer_norm(&mut sb, &yb, &gb, None, 1e-12)?;
        let nc = self.cpu.add_layer_norm(&mut sc, &yc, &gc, None, 1e-12)?;
        let bias = self.rng.vec(m, 1.0);
        let (bb, bc) = self.up(&bias, 1, m)?;
        let (got, want) = (self.b.linear(&nb, &wb, Some(&bb))?, self.cpu.linear(&nc, &wc, Some(&bc))?);
        self.record("add_layer_norm, then a bf16 GEMM with bias".into(), &got, &want, TOL_BF16)?;
        let (got, want) = (self.b.matmul(&sb, &wb)?, self.cpu.matmul(&sc, &wc)?);
        self.record("add_layer_norm's sum, then a bf16 GEMM".into(), &got, &want, TOL_BF16)?;
        self.b.activate(&mut sb, Activation::Gelu)?;
        self.cpu.activate(&mut sc, Activation::Gelu)?;
        let (got, want) = (self.b.matmul(&sb, &wb)?, self.cpu.matmul(&sc, &wc)?);
        self.record("activate, then a bf16 GEMM".into(), &got, &want, TOL_BF16)?;
        let seqs = [0..30, 30..n];
        let p = AttnParams { n_heads: 12, n_kv_heads: 12, head_dim: 32, scale: 0.17, window: None, softcap: None };
        let ab = self.b.encoder_attention(&xb, &yb, &xb, &seqs, &p)?;
        let ac = self.cpu.encoder_attention(&xc, &yc, &xc, &seqs, &p)?;
        let (got, want) = (self.b.matmul(&ab, &wb)?, self.cpu.matmul(&ac, &wc)?);
        self.record("encoder attention, then a bf16 GEMM".into(), &got, &want, TOL_BF16)?;
        // The decoders' ops: RMSNorm (with the residual add), the gated activation.
        let nb = self.b.rms_norm(&xb, &gb, 1e-6)?;
        let nc = self.cpu.rms_norm(&xc, &gc, 1e-6)?;
        let (got, want) = (self.b.matmul(&nb, &wb)?, self.cpu.matmul(&nc, &wc)?);
        self.record("rms_norm, then a bf16 GEMM".into(), &got, &want, TOL_BF16)?;
        let (mut sb, mut sc) = self.up(&x, n, c)?;
        let sq = raw("w", DType::BF16, c, c, self.rng.weight(DType::BF16, c, c));
        self.b.matmul_add(&mut sb, &yb, &self.b.weight(sq.clone())?)?;
        self.cpu.matmul_add(&mut sc, &yc, &self.cpu.weight(sq)?)?;
        let ([got], [want]) =
            (self.b.norm_matmul_many(&sb, &gb, 1e-6, [&wb])?, self.cpu.norm_matmul_many(&sc, &gc, 1e-6, [&wc])?);
        self.record("matmul_add, then norm_matmul_many (bf16 GEMMs)".into(), &got, &want, TOL_BF16)?;
        let (nb, nc) = (self.b.rms_norm(&sb, &gb, 1e-6)?, self.cpu.rms_norm(&sc, &gc, 1e-6)?);
        let gb = self.b.glu(&nb, &yb, Activation::Silu)?;
        let gc = self.cpu.glu(&nc, &yc, Activation::Silu)?;
        let (got, want) = (self.b.matmul(&gb, &wb)?, self.cpu.matmul(&gc, &wc)?);
        self.record("glu, then a bf16 GEMM".into(), &got, &want, TOL_BF16)?;
        self.gemv_after_ops()
    }

    /// Decode-size ops whose output a k-quant GEMV reads next (in piece
    /// order on GPUs), and an op in place between. (Ops writing the GEMV's
    /// 8-bit input themselves, which these cases checked, measured +1% at
    /// batch 1 and -2% at 8 on the H200, and were dropped.)
    fn gemv_after_ops(&mut self) -> Result<()> {
        let (n, c, m) = (3, 512, 75);
        let q4 = raw("w", DType::Q4K, m, c, self.rng.weight(DType::Q4K, m, c));
        let q6 = raw("w", DType::Q6K, m, c, self.rng.weight(DType::Q6K, m, c));
        let (q4b, q6b) = (self.b.weight(q4.clone())?, self.b.weight(q6.clone())?);
        let (q4c, q6c) = (self.cpu.weight(dequantized(&q4)?)?, self.cpu.weight(dequantized(&q6)?)?);
        let (x, y, g) = (self.rng.vec(n * c, 3.0), self.rng.vec(n * c, 1.0), self.rng.vec(c, 1.0));
        let (yb, yc) = self.up(&y, n, c)?;
        let (gb, gc) = self.up(&g, 1, c)?;
        let (mut sb, mut sc) = self.up(&x, n, c)?;
        self.b.add(&mut sb, &yb)?;
        self.cpu.add(&mut sc, &yc)?;
        let (nb, nc) = (self.b.rms_norm(&sb, &gb, 1e-6)?, self.cpu.rms_norm(&sc, &gc, 1e-6)?);
        let got = self.b.matmul_many(&nb, [&q4b, &q4b, &q6b])?;
        let (want4, want6) = (self.cpu.matmul(&nc, &q4c)?, self.cpu.matmul(&nc, &q6c)?);
        self.record("add, rms_norm, then Q4_K GEMVs".into(), &got[1], &want4, TOL_X8_TAILED)?;
        self.record("add, rms_norm, then a Q6_K GEMV".into(), &got[2], &want6, TOL_X8_TAILED)?;
        let (mut ab, mut ac) = (self.b.glu(&nb, &yb, Activation::Silu)?, self.cpu.glu(&nc, &yc, Activation::Silu)?);
        let (got, want) = (self.b.matmul(&ab, &q6b)?, self.cpu.matmul(&ac, &q6c)?);
        self.record("glu, then a Q6_K GEMV".into(), &got, &want, TOL_X8_TAILED)?;
        self.b.add(&mut ab, &yb)?;
        self.cpu.add(&mut ac, &yc)?;
        let (got, want) = (self.b.matmul(&ab, &q4b)?, self.cpu.matmul(&ac, &q4c)?);
        self.record("glu, add, then a Q4_K GEMV".into(), &got, &want, TOL_X8_TAILED)?;
        Ok(())
    }

    /// The 32-value block types (Q4_0 .. Q8_0) in rows of 3 and 9 blocks
    /// (k = 96, 288: rows only 2-, 4- or 8-byte aligned, and fewer blocks
    /// than a warp's lanes; every other check has rows of a multiple of 8
    /// blocks): plain matmuls at decode and prefill sizes, and embedding
    /// tables; normed inputs and an MLP's gated one (a GPU's input
    /// quantization, where it pads such rows to whole super-blocks: CUDA's
    /// `FERRITE_CUDA_PAD_TILES=1`); then Q4_0 and Q4_1 tables of whole
    /// super-blocks, and a prefill matmul with more rows than one pass of a
    /// GPU's dequantized tiles holds (32 Mi values: 10,922 rows of 3,072),
    /// so that a pass starts inside a tile of 16 rows. Run last, so that the
    /// random data of the checks before stays as it was.
    fn block_rows(&mut self, dense_f32_tol: f32) -> Result<()> {
        let types = [DType::Q4_0, DType::Q4_1, DType::Q5_0, DType::Q5_1, DType::Q8_0];
        let shapes = [(1, 37, 96), (3, 40, 288), (8, 21, 288), (40, 33, 288)];
        for (&shape, dt) in shapes.iter().flat_map(|s| types.map(|t| (s, t))) {
            self.matmul_random(dt, shape, dense_f32_tol)?;
        }
        for dt in types {
            self.embedding_random(dt, 288, dense_f32_tol)?;
        }
        let [q4_0, q4_1, q5_0, q5_1, q8_0] = types;
        for (n, dts) in [(1, [q8_0, q4_1, q5_0]), (2, [q4_0, q5_1, q8_0])] {
            self.norm_matmul_many(n, dts, 288, dense_f32_tol)?;
        }
        for (n, dt) in [(1, q4_1), (3, q8_0), (1, q5_0)] {
            self.mlp_random(n, dt, Activation::Silu, (288, 544), dense_f32_tol)?;
        }
        // Tables of rows of whole super-blocks, which a GPU may store in its
        // GEMVs' tiles (Q8_0's: `embeddings`).
        for dt in [DType::Q4_0, DType::Q4_1] {
            self.embedding_random(dt, 512, dense_f32_tol)?;
        }
        self.matmul_random(DType::Q4_0, (9, 11_000, 3072), dense_f32_tol)
    }

    /// The 5-bit types where a GPU keeps them in its GEMVs' tiles, in the
    /// ops that launch them apart from plain matmuls (`matmuls` has those):
    /// Q5_K q/k/v of one normed input, alone (n = 1, 2) and with a Q6_K v
    /// (Q5_K_M's layers), RoPE and the KV write in their epilogue, and
    /// tables of Q5_K, Q5_0 and Q5_1 rows of whole super-blocks. (Last, so
    /// that the checks before keep their random data.)
    fn five_bit_tiles(&mut self, dense_f32_tol: f32) -> Result<()> {
        let (q5, q6) = (DType::Q5K, DType::Q6K);
        for (n, dts) in [(1, [q5; 3]), (1, [q5, q5, q6]), (2, [q5, q5, q6])] {
            self.norm_matmul_many(n, dts, 1024, dense_f32_tol)?;
        }
        for (hd, v_type) in [(128, q5), (64, q6)] {
            self.attention_inputs_decode(hd, q5, v_type)?;
        }
        for dt in [q5, DType::Q5_0, DType::Q5_1] {
            self.embedding_random(dt, 512, dense_f32_tol)?;
        }
        Ok(())
    }
}

/// Runs every op of `b` against the CPU. `dense_f32_tol`: the limit for f32
/// weights, which a backend may multiply in f32 (TOL_F32) or bf16 (TOL_BF16).
pub fn check_backend<B: Backend>(b: &B, dense_f32_tol: f32, report: &mut dyn FnMut(&Check)) -> Result<Vec<Check>> {
    let mut h = Harness { b, cpu: CpuBackend::F32, rng: Rng(0x9e37_79b9_7f4a_7c15), out: Vec::new(), report };
    h.matmuls(dense_f32_tol)?;
    h.rowwise()?;
    h.embeddings(dense_f32_tol)?;
    h.attention()?;
    h.attention_inputs()?;
    h.gemm_after_ops()?;
    if b.samples_on_device() {
        h.sampling()?;
    }
    h.block_rows(dense_f32_tol)?;
    h.five_bit_tiles(dense_f32_tol)?;
    Ok(h.out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The CPU against itself: every case runs and agrees exactly, except the
    /// quantized matmuls, whose CPU kernels round activations to 16 bits.
    #[test]
    fn harness_runs_on_the_cpu() {
        let checks = check_backend(&CpuBackend::F32, TOL_F32, &mut |_| {}).unwrap();
        assert!(checks.len() > 40, "{} checks", checks.len());
        for c in &checks {
            let matmul = c.op.contains("matmul")
                || c.op.starts_with("mlp_add")
                || c.op.starts_with("linear")
                || c.op.contains(" GEMV");
            let quantized = QUANT_TYPES.iter().any(|t| matmul && c.op.contains(&format!(" {t} ")));
            let limit = if quantized { 0.05 } else { 0.0 };
            assert!(c.rel_err <= limit, "{}: {}", c.op, c.rel_err);
        }
    }

    #[test]
    fn rel_err_sees_nan_and_length() {
        assert_eq!(rel_err(&[1.0, 2.0], &[1.0, 2.0]), 0.0);
        assert!(rel_err(&[f32::NAN], &[1.0]).is_infinite());
        assert!(rel_err(&[1.0], &[1.0, 2.0]).is_infinite());
        assert!((rel_err(&[1.0, 2.1], &[1.0, 2.0]) - 0.05).abs() < 1e-6);
    }
}
