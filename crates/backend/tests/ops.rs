//! Op harness: every CPU op against a plain reference on random inputs, for every
//! weight format, odd sizes and several thread counts.

use ferrite_backend::cpu::{CpuBackend, CpuTensor};
use ferrite_backend::harness::Rng;
use ferrite_backend::quant::dequantize_row;
use ferrite_backend::{Activation, AttnBatch, AttnParams, Backend, KvDtype, KvSpec, RawWeight, Rope, SeqSlice};
use ferrite_core::{DType, HostBytes};

const ALL: [DType; 11] = DType::ALL;

fn dequant_all(dtype: DType, bytes: &[u8], rows: usize, cols: usize) -> Vec<f32> {
    let mut out = vec![0f32; rows * cols];
    dequantize_row(dtype, bytes, &mut out).unwrap();
    out
}

fn reference_matmul(x: &[f32], n: usize, w: &[f32], m: usize, k: usize) -> Vec<f32> {
    let mut out = vec![0f32; n * m];
    for t in 0..n {
        for r in 0..m {
            out[t * m + r] = (0..k).map(|i| x[t * k + i] as f64 * w[r * k + i] as f64).sum::<f64>() as f32;
        }
    }
    out
}

fn rel_err(a: &[f32], b: &[f32]) -> f32 {
    let num: f32 = a.iter().zip(b).map(|(x, y)| (x - y) * (x - y)).sum::<f32>().sqrt();
    let den: f32 = b.iter().map(|y| y * y).sum::<f32>().sqrt().max(1e-12);
    num / den
}

#[test]
fn matmul_matches_dequantized_reference_for_every_format() {
    let be = CpuBackend::F32;
    let mut rng = Rng(0x1234_5678);
    for dtype in ALL {
        // Odd row counts, one row, and a batch larger than one task's rows.
        for &(n, m, k) in &[(1usize, 1usize, 256usize), (3, 17, 512), (7, 33, 768), (9, 40, 512)] {
            let bytes = rng.weight(dtype, m, k);
            let wf = dequant_all(dtype, &bytes, m, k);
            let w = be
                .weight(RawWeight { name: "w".into(), dtype, rows: m, cols: k, bytes: HostBytes::from_vec(bytes) })
                .unwrap();
            let x = rng.vec(n * k, 1.0);
            let got = be.matmul(&be.upload(x.clone(), n, k).unwrap(), &w).unwrap();
            let want = reference_matmul(&x, n, &wf, m, k);
            // Quantized formats quantize activations to 16 bits.
            let tol = if dtype.is_quantized() { 5e-4 } else { 1e-5 };
            let e = rel_err(&got.data, &want);
            assert!(e < tol, "{dtype} n={n} m={m} k={k}: relative error {e}");
        }
    }
}

#[test]
fn matmul_is_batch_invariant() {
    let be = CpuBackend::F32;
    let mut rng = Rng(99);
    for dtype in [DType::Q4_1, DType::Q6K, DType::F32] {
        let (m, k) = (40, 256);
        let bytes = rng.weight(dtype, m, k);
        let w = be
            .weight(RawWeight { name: "w".into(), dtype, rows: m, cols: k, bytes: HostBytes::from_vec(bytes) })
            .unwrap();
        let x = rng.vec(5 * k, 1.0);
        let all = be.matmul(&be.upload(x.clone(), 5, k).unwrap(), &w).unwrap();
        for t in 0..5 {
            let one = be.matmul(&be.upload(x[t * k..(t + 1) * k].to_vec(), 1, k).unwrap(), &w).unwrap();
            assert_eq!(one.data, all.data[t * m..(t + 1) * m], "{dtype} row {t}");
        }
    }
}

#[test]
fn weight_with_wrong_byte_count_is_an_error() {
    let r = CpuBackend::F32.weight(RawWeight {
        name: "w".into(),
        dtype: DType::Q4_0,
        rows: 2,
        cols: 32,
        bytes: HostBytes::from_vec(vec![0; 35]),
    });
    assert!(r.is_err());
}

#[test]
fn rms_norm_and_glu_match_reference() {
    let be = CpuBackend::F32;
    let mut rng = Rng(7);
    let (n, d) = (9, 64);
    let x = rng.vec(n * d, 1.0);
    let w = rng.vec(16, 1.0);
    let got = be.rms_norm(&be.upload(x.clone(), n, d).unwrap(), &be.upload(w.clone(), 1, 16).unwrap(), 1e-6).unwrap();
    for g in 0..n * d / 16 {
        let xs = &x[g * 16..(g + 1) * 16];
        let r = 1.0 / (xs.iter().map(|v| v * v).sum::<f32>() / 16.0 + 1e-6).sqrt();
        for i in 0..16 {
            assert!((got.data[g * 16 + i] - xs[i] * r * w[i]).abs() < 1e-5);
        }
    }
    let (g, u) = (rng.vec(n * d, 1.0), rng.vec(n * d, 1.0));
    for act in [Activation::Silu, Activation::GeluTanh, Activation::Gelu] {
        let out = be.glu(&be.upload(g.clone(), n, d).unwrap(), &be.upload(u.clone(), n, d).unwrap(), act).unwrap();
        for i in 0..n * d {
            let gx = g[i] as f64;
            let a = match act {
                Activation::Silu => gx / (1.0 + (-gx).exp()),
                Activation::GeluTanh => {
                    0.5 * gx * (1.0 + ((2.0 / std::f64::consts::PI).sqrt() * (gx + 0.044715 * gx.powi(3))).tanh())
                }
                Activation::Gelu => {
                    // erf via a high-order series, fine for |x| <= 1.
                    let z = gx / std::f64::consts::SQRT_2;
                    let mut erf = 0.0;
                    let mut term = z;
                    for k in 0..30 {
                        erf += term / (2 * k + 1) as f64;
                        term *= -z * z / (k + 1) as f64;
                    }
                    0.5 * gx * (1.0 + erf * 2.0 / std::f64::consts::PI.sqrt())
                }
            };
            assert!((out.data[i] as f64 - a * u[i] as f64).abs() < 1e-5, "{act:?} {gx}");
        }
    }
}

#[test]
fn rope_rotates_pairs_in_both_layouts() {
    let be = CpuBackend::F32;
    let hd = 8;
    let inv_freq: Vec<f32> = (0..hd / 2).map(|i| 10000f32.powf(-(2.0 * i as f32) / hd as f32)).collect();
    let x: Vec<f32> = (0..2 * hd).map(|i| i as f32 * 0.1 + 0.3).collect();
    for interleaved in [false, true] {
        let rope = Rope { head_dim: hd, inv_freq: inv_freq.clone(), interleaved };
        let mut t = be.upload(x.clone(), 1, 2 * hd).unwrap();
        be.rope(&mut t, &rope, &[5]).unwrap();
        for head in 0..2 {
            for (i, f) in inv_freq.iter().enumerate() {
                let (a, b) = if interleaved { (2 * i, 2 * i + 1) } else { (i, i + hd / 2) };
                let (x0, x1) = (x[head * hd + a], x[head * hd + b]);
                let th = 5.0 * f;
                assert!((t.data[head * hd + a] - (x0 * th.cos() - x1 * th.sin())).abs() < 1e-5);
                assert!((t.data[head * hd + b] - (x0 * th.sin() + x1 * th.cos())).abs() < 1e-5);
            }
        }
    }
}

/// Naive attention over contiguous K/V for one sequence.
fn naive_attention(q: &[f32], k: &[f32], v: &[f32], p: &AttnParams, n: usize, past: usize) -> Vec<f32> {
    let (hd, kvd) = (p.head_dim, p.n_kv_heads * p.head_dim);
    let mut out = vec![0f32; n * p.n_heads * hd];
    for i in 0..n {
        let pos = past + i;
        for h in 0..p.n_heads {
            let kh = h / (p.n_heads / p.n_kv_heads);
            let lo = p.window.map_or(0, |w| (pos + 1).saturating_sub(w));
            let qv = &q[(i * p.n_heads + h) * hd..][..hd];
            let s: Vec<f64> = (lo..=pos)
                .map(|t| (0..hd).map(|d| qv[d] as f64 * k[t * kvd + kh * hd + d] as f64).sum::<f64>() * p.scale as f64)
                .collect();
            let mx = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let e: Vec<f64> = s.iter().map(|x| (x - mx).exp()).collect();
            let z: f64 = e.iter().sum();
            for d in 0..hd {
                let val: f64 = (lo..=pos).enumerate().map(|(j, t)| e[j] / z * v[t * kvd + kh * hd + d] as f64).sum();
                out[(i * p.n_heads + h) * hd + d] = val as f32;
            }
        }
    }
    out
}

#[test]
fn paged_attention_matches_contiguous_reference_in_mixed_batches() {
    let be = CpuBackend::F32;
    let mut rng = Rng(42);
    // Block size 4: the portable path; 16: the vector path (where present);
    // each over a cache stored in f16 and in f32.
    let cases = [(4, None), (4, Some(5)), (16, None), (16, Some(5)), (16, Some(13))];
    for ((bs, window), dtype) in cases.into_iter().flat_map(|c| [(c, KvDtype::F16), (c, KvDtype::F32)]) {
        let p = AttnParams { n_heads: 4, n_kv_heads: 2, head_dim: 8, scale: 0.35, window, softcap: None };
        let kvd = p.n_kv_heads * p.head_dim;
        let mut pool = be.kv_pool(KvSpec { n_layers: 1, n_blocks: 16, block_size: bs, kv_dim: kvd, dtype }).unwrap();
        // Sequence A: 11 tokens cached earlier (decode 1 now); B: fresh prefill of
        // 6 tokens; C: fresh prefill of 37 (several blocks and query blocks).
        let (a_len, b_len, c_len) = (12usize, 6usize, 37usize);
        let ka = rng.vec(a_len * kvd, 1.0);
        let va = rng.vec(a_len * kvd, 1.0);
        let kb = rng.vec((b_len + c_len) * kvd, 1.0);
        let vb = rng.vec((b_len + c_len) * kvd, 1.0);
        let table_a = vec![7u32, 2, 9];
        let table_b = vec![3u32, 0];
        let table_c: Vec<u32> =
            [1u32, 4, 5, 6, 8, 10, 11, 12, 13, 14, 15].into_iter().take(c_len.div_ceil(bs)).collect();
        let slot = |t: &Vec<u32>, pos: usize| t[pos / bs] as usize * bs + pos % bs;
        // Write A's first 11 tokens as an earlier step.
        let early = AttnBatch { seqs: vec![], block_size: bs, slots: (0..11).map(|i| slot(&table_a, i)).collect() };
        be.write_kv(
            &mut pool,
            0,
            &CpuTensor { data: ka[..11 * kvd].to_vec(), rows: 11, cols: kvd },
            &CpuTensor { data: va[..11 * kvd].to_vec(), rows: 11, cols: kvd },
            &early,
        )
        .unwrap();
        let batch = AttnBatch {
            seqs: vec![
                SeqSlice { q_start: 0, q_len: 1, ctx_len: a_len, block_table: table_a.clone() },
                SeqSlice { q_start: 1, q_len: b_len, ctx_len: b_len, block_table: table_b.clone() },
                SeqSlice { q_start: 1 + b_len, q_len: c_len, ctx_len: c_len, block_table: table_c.clone() },
            ],
            block_size: bs,
            slots: std::iter::once(slot(&table_a, 11))
                .chain((0..b_len).map(|i| slot(&table_b, i)))
                .chain((0..c_len).map(|i| slot(&table_c, i)))
                .collect(),
        };
        let mut knew = ka[11 * kvd..].to_vec();
        knew.extend_from_slice(&kb);
        let mut vnew = va[11 * kvd..].to_vec();
        vnew.extend_from_slice(&vb);
        let n = 1 + b_len + c_len;
        be.write_kv(
            &mut pool,
            0,
            &CpuTensor { data: knew, rows: n, cols: kvd },
            &CpuTensor { data: vnew, rows: n, cols: kvd },
            &batch,
        )
        .unwrap();
        let qd = p.n_heads * p.head_dim;
        let q = rng.vec(n * qd, 1.0);
        let got = be.attention(&CpuTensor { data: q.clone(), rows: n, cols: qd }, &pool, 0, &batch, &p).unwrap();
        // An f16 pool stores f16-precision values.
        let f16 = dtype == KvDtype::F16;
        let r =
            |v: &[f32]| v.iter().map(|&x| if f16 { half::f16::from_f32(x).to_f32() } else { x }).collect::<Vec<_>>();
        let want_a = naive_attention(&q[..qd], &r(&ka), &r(&va), &p, 1, 11);
        let (kb, kc) = kb.split_at(b_len * kvd);
        let (vb, vc) = vb.split_at(b_len * kvd);
        let want_b = naive_attention(&q[qd..(1 + b_len) * qd], &r(kb), &r(vb), &p, b_len, 0);
        let want_c = naive_attention(&q[(1 + b_len) * qd..], &r(kc), &r(vc), &p, c_len, 0);
        let ctx = format!("block size {bs}, window {window:?}, {dtype:?} cache");
        assert!(rel_err(&got.data[..qd], &want_a) < 1e-5, "{ctx}: seq A");
        assert!(rel_err(&got.data[qd..(1 + b_len) * qd], &want_b) < 1e-5, "{ctx}: seq B");
        assert!(rel_err(&got.data[(1 + b_len) * qd..], &want_c) < 1e-5, "{ctx}: seq C");
        // Each sequence alone gives the same bits as in the mixed batch.
        for (i, s) in batch.seqs.iter().enumerate() {
            let rows = s.q_start..s.q_start + s.q_len;
            let alone = AttnBatch {
                seqs: vec![SeqSlice { q_start: 0, ..s.clone() }],
                block_size: bs,
                slots: batch.slots[rows.clone()].to_vec(),
            };
            let qs = q[rows.start * qd..rows.end * qd].to_vec();
            let one = be.attention(&CpuTensor { data: qs, rows: rows.len(), cols: qd }, &pool, 0, &alone, &p).unwrap();
            assert_eq!(one.data, got.data[rows.start * qd..rows.end * qd], "{ctx}: seq {i} alone");
        }
    }
}

/// Rows with keys in several of the attention kernel's key chunks (512
/// keys): a prefill on one thread (each unit takes its chunks in turn)
/// against the reference, and a decode row alone on two threads (its chunks
/// split over them, merged after) against the same row of the prefill: the
/// same bits.
#[test]
fn long_rows_match_reference_split_or_not() {
    let be = CpuBackend::F32;
    let mut rng = Rng(7);
    let cases = [(16, None), (16, Some(700)), (4, None), (4, Some(600))];
    for ((bs, window), dtype) in cases.into_iter().flat_map(|c| [(c, KvDtype::F16), (c, KvDtype::F32)]) {
        let p = AttnParams { n_heads: 4, n_kv_heads: 2, head_dim: 16, scale: 0.25, window, softcap: None };
        let (kvd, qd, len, pre) = (p.n_kv_heads * p.head_dim, p.n_heads * p.head_dim, 1300usize, 20usize);
        let blocks = len.div_ceil(bs);
        let spec = KvSpec { n_layers: 1, n_blocks: blocks + 1, block_size: bs, kv_dim: kvd, dtype };
        let mut pool = be.kv_pool(spec).unwrap();
        // Blocks in reverse order, so the table matters.
        let table: Vec<u32> = (0..blocks as u32).rev().collect();
        let slot = |pos: usize| table[pos / bs] as usize * bs + pos % bs;
        let (k, v) = (rng.vec(len * kvd, 1.0), rng.vec(len * kvd, 1.0));
        let all = AttnBatch { seqs: vec![], block_size: bs, slots: (0..len).map(slot).collect() };
        let t = |d: &[f32]| CpuTensor { data: d.to_vec(), rows: len, cols: kvd };
        be.write_kv(&mut pool, 0, &t(&k), &t(&v), &all).unwrap();
        let q = rng.vec(pre * qd, 1.0);
        let seq = |q_len| SeqSlice { q_start: 0, q_len, ctx_len: len, block_table: table.clone() };
        let batch = |q_len: usize| AttnBatch {
            seqs: vec![seq(q_len)],
            block_size: bs,
            slots: (len - q_len..len).map(slot).collect(),
        };
        let threads = |n| rayon::ThreadPoolBuilder::new().num_threads(n).build().unwrap();
        let prefill = threads(1)
            .install(|| be.attention(&CpuTensor { data: q.clone(), rows: pre, cols: qd }, &pool, 0, &batch(pre), &p));
        let last = q[(pre - 1) * qd..].to_vec();
        let decode = threads(2)
            .install(|| be.attention(&CpuTensor { data: last.clone(), rows: 1, cols: qd }, &pool, 0, &batch(1), &p));
        let (prefill, decode) = (prefill.unwrap().data.clone(), decode.unwrap().data.clone());
        let f16 = dtype == KvDtype::F16;
        let r =
            |v: &[f32]| v.iter().map(|&x| if f16 { half::f16::from_f32(x).to_f32() } else { x }).collect::<Vec<_>>();
        let ctx = format!("block size {bs}, window {window:?}, {dtype:?} cache");
        let want = naive_attention(&q, &r(&k), &r(&v), &p, pre, len - pre);
        assert!(rel_err(&prefill, &want) < 1e-5, "{ctx}: prefill {}", rel_err(&prefill, &want));
        assert_eq!(decode, prefill[(pre - 1) * qd..], "{ctx}: the decode row differs from its prefill row");
    }
    // A window of no keys is refused, not computed.
    let p = AttnParams { n_heads: 2, n_kv_heads: 1, head_dim: 8, scale: 1.0, window: Some(0), softcap: None };
    let mut pool =
        be.kv_pool(KvSpec { n_layers: 1, n_blocks: 1, block_size: 16, kv_dim: 8, dtype: KvDtype::F32 }).unwrap();
    let one = AttnBatch {
        seqs: vec![SeqSlice { q_start: 0, q_len: 1, ctx_len: 1, block_table: vec![0] }],
        block_size: 16,
        slots: vec![0],
    };
    let t = |cols| CpuTensor { data: vec![0.5; cols], rows: 1, cols };
    be.write_kv(&mut pool, 0, &t(8), &t(8), &one).unwrap();
    assert!(be.attention(&t(16), &pool, 0, &one, &p).is_err(), "a window of 0 keys");
}

const QUANTIZED: [DType; 8] =
    [DType::Q4_0, DType::Q4_1, DType::Q5_0, DType::Q5_1, DType::Q8_0, DType::Q4K, DType::Q5K, DType::Q6K];

/// Row lengths that exercise full groups of eight 32-element blocks, partial
/// groups at a row's end, and several 256-element blocks.
fn odd_row_lengths(dtype: DType) -> &'static [usize] {
    if dtype.block_size() == 256 {
        &[256, 768, 1280]
    } else {
        &[32, 96, 288, 576, 640]
    }
}

fn cpu_weight(be: &CpuBackend, dtype: DType, m: usize, k: usize, bytes: Vec<u8>) -> ferrite_backend::cpu::CpuWeight {
    be.weight(RawWeight { name: "w".into(), dtype, rows: m, cols: k, bytes: HostBytes::from_vec(bytes) }).unwrap()
}

#[test]
fn quantized_matmul_matches_reference_at_odd_sizes() {
    let be = CpuBackend::F32;
    let mut rng = Rng(0xfeed);
    for dtype in QUANTIZED {
        for &k in odd_row_lengths(dtype) {
            // Row counts around the kernels' row tiles (4) and parallel chunks.
            for &(n, m) in &[(1usize, 1usize), (1, 7), (2, 5), (3, 9), (4, 4), (5, 13), (17, 6), (1, 301)] {
                let bytes = rng.weight(dtype, m, k);
                let wf = dequant_all(dtype, &bytes, m, k);
                let w = cpu_weight(&be, dtype, m, k, bytes);
                let x = rng.vec(n * k, 1.0);
                let got = be.matmul(&be.upload(x.clone(), n, k).unwrap(), &w).unwrap();
                let want = reference_matmul(&x, n, &wf, m, k);
                let e = rel_err(&got.data, &want);
                assert!(e < 5e-4, "{dtype} n={n} m={m} k={k}: relative error {e}");
                // Per element too: a wrong block would hide in a large row sum.
                for (i, (g, r)) in got.data.iter().zip(&want).enumerate() {
                    let scale = want.iter().fold(0f32, |a, v| a.max(v.abs())).max(1e-3);
                    assert!((g - r).abs() < 2e-3 * scale, "{dtype} n={n} m={m} k={k} element {i}: {g} vs {r}");
                }
            }
        }
    }
}

/// Extreme quants (all bits set, none set, the most negative i8) with large
/// activations: the integer dots must not overflow.
#[test]
fn quantized_matmul_handles_extreme_quants() {
    let be = CpuBackend::F32;
    let mut rng = Rng(5);
    // 8 rows: the interleaved layout where the CPU has it.
    for (dtype, m) in QUANTIZED.iter().flat_map(|&d| [(d, 3), (d, 8)]) {
        let k = if dtype.block_size() == 256 { 512 } else { 96 };
        for fill in [0x00u8, 0xFF, 0x80, 0x7F] {
            let mut bytes = rng.weight(dtype, m, k);
            let bb = dtype.block_bytes();
            for b in bytes.chunks_mut(bb) {
                // Keep the f16 scales written by random_weight, set everything else.
                let keep: &[usize] = match dtype {
                    DType::Q4_0 | DType::Q5_0 | DType::Q8_0 => &[0, 1],
                    DType::Q4_1 | DType::Q5_1 => &[0, 1, 2, 3],
                    DType::Q4K | DType::Q5K => &[0, 1, 2, 3],
                    DType::Q6K => &[208, 209],
                    _ => &[],
                };
                for (i, v) in b.iter_mut().enumerate() {
                    if !keep.contains(&i) {
                        *v = fill;
                    }
                }
            }
            let wf = dequant_all(dtype, &bytes, m, k);
            let w = cpu_weight(&be, dtype, m, k, bytes);
            for x in [vec![1000.0f32; k], (0..k).map(|i| if i % 2 == 0 { 3.0 } else { -3.0 }).collect()] {
                let got = be.matmul(&be.upload(x.clone(), 1, k).unwrap(), &w).unwrap();
                let want = reference_matmul(&x, 1, &wf, m, k);
                let e = rel_err(&got.data, &want);
                assert!(
                    e < 5e-4 || got.data.iter().zip(&want).all(|(g, r)| (g - r).abs() < 1e-3),
                    "{dtype} fill {fill:#x}: relative error {e}, {:?} vs {want:?}",
                    got.data
                );
            }
        }
    }
}

/// Every format, several batch sizes and thread counts: a row's result does not
/// depend on the batch it is in or on how the work is split. 304 rows take
/// the interleaved layout where the CPU has it (whole groups of eight), 301
/// the plain one.
#[test]
fn matmul_is_batch_and_thread_invariant_for_every_format() {
    let be = CpuBackend::F32;
    let mut rng = Rng(0xabc);
    let pools: Vec<rayon::ThreadPool> =
        [1, 2, 3].iter().map(|&t| rayon::ThreadPoolBuilder::new().num_threads(t).build().unwrap()).collect();
    for (dtype, m) in ALL.iter().flat_map(|&d| [(d, 301), (d, 304)]) {
        let k = if dtype.block_size() == 256 { 512 } else { 288 };
        let bytes = rng.weight(dtype, m, k);
        let w = cpu_weight(&be, dtype, m, k, bytes);
        let x = rng.vec(17 * k, 1.0);
        let alone: Vec<Vec<f32>> = (0..17)
            .map(|t| be.matmul(&be.upload(x[t * k..(t + 1) * k].to_vec(), 1, k).unwrap(), &w).unwrap().into_data())
            .collect();
        for n in [1usize, 2, 3, 8, 17] {
            let batch = be.matmul(&be.upload(x[..n * k].to_vec(), n, k).unwrap(), &w).unwrap();
            for (t, row) in alone.iter().take(n).enumerate() {
                assert_eq!(*row, batch.data[t * m..(t + 1) * m], "{dtype} n={n} row {t}");
            }
            for (p, pool) in pools.iter().enumerate() {
                let other = pool.install(|| be.matmul(&be.upload(x[..n * k].to_vec(), n, k).unwrap(), &w).unwrap());
                assert_eq!(other.data, batch.data, "{dtype} n={n} pool {p}");
            }
        }
    }
}

/// The activation quantizer (SIMD where present) against a plain scalar
/// version, bit for bit, with ties that must round half away from zero.
#[test]
fn activation_quantization_matches_scalar_reference() {
    use ferrite_backend::quant::{quantize_row_q8, Q8Block};
    let mut rng = Rng(77);
    let mut rows: Vec<Vec<f32>> = (0..20).map(|_| rng.vec(96, 1.0).iter().map(|v| v * 3.0).collect()).collect();
    // Scale 1 (max 32767) with exact ties, negative ones too.
    let mut ties: Vec<f32> = (0..32).map(|i| (i as f32 - 16.0) * 1.5 + 0.5).collect();
    ties[0] = 32767.0;
    ties.extend((0..64).map(|i| if i == 5 { -32767.0 } else { (i as f32) - 31.5 }));
    rows.push(ties);
    rows.push(vec![0.0; 96]);
    rows.push((0..96).map(|i| if i % 7 == 0 { -1e-30 } else { 1e-38 }).collect());
    for x in rows {
        let mut got = vec![Q8Block::default(); x.len() / 32];
        quantize_row_q8(&x, &mut got, 32);
        for (b, xb) in got.iter().zip(x.chunks(32)) {
            let amax = xb.iter().fold(0f32, |a, &v| a.max(v.abs()));
            let d = amax / 32767.0;
            let id = if d > 0.0 { 1.0 / d } else { 0.0 };
            let qs: Vec<i16> = xb.iter().map(|&v| ((v * id).round() as i32).clamp(-32767, 32767) as i16).collect();
            let sum: i32 = qs.iter().map(|&q| q as i32).sum();
            assert_eq!(b.qs.to_vec(), qs, "{xb:?}");
            assert_eq!(b.d.to_bits(), d.to_bits());
            assert_eq!(b.dsum.to_bits(), (d * sum as f32).to_bits());
        }
    }
}

#[test]
fn f16_conversion_is_exact_for_every_value() {
    for h in 0..=u16::MAX {
        let want = half::f16::from_bits(h).to_f32();
        let got = ferrite_backend::quant::f16_to_f32(h);
        if want.is_nan() {
            assert!(got.is_nan(), "{h:#06x}");
            assert_eq!(got.to_bits() & 0x8000_0000, want.to_bits() & 0x8000_0000, "{h:#06x} sign");
        } else {
            assert_eq!(got.to_bits(), want.to_bits(), "{h:#06x}");
        }
    }
}

#[test]
fn layer_norm_and_activate_match_reference() {
    let be = CpuBackend::F32;
    let mut rng = Rng(11);
    let (n, d) = (7, 48);
    // A large common offset: the mean must be removed before squaring.
    let x: Vec<f32> = rng.vec(n * d, 1.0).iter().map(|v| v + 30.0).collect();
    let (w, b) = (rng.vec(d, 1.0), rng.vec(d, 1.0));
    let xt = be.upload(x.clone(), n, d).unwrap();
    for bias in [false, true] {
        let bt = be.upload(b.clone(), 1, d).unwrap();
        let got = be.layer_norm(&xt, &be.upload(w.clone(), 1, d).unwrap(), bias.then_some(&bt), 1e-5).unwrap();
        for r in 0..n {
            let xs: Vec<f64> = x[r * d..(r + 1) * d].iter().map(|&v| v as f64).collect();
            let mean = xs.iter().sum::<f64>() / d as f64;
            let var = xs.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / d as f64;
            for i in 0..d {
                let want = (xs[i] - mean) / (var + 1e-5).sqrt() * w[i] as f64 + if bias { b[i] as f64 } else { 0.0 };
                assert!((got.data[r * d + i] as f64 - want).abs() < 1e-4, "bias={bias} row {r} col {i}");
            }
        }
    }
    let mut t = be.upload(x.clone(), n, d).unwrap();
    be.activate(&mut t, Activation::Silu).unwrap();
    for (g, &v) in t.data.iter().zip(&x) {
        assert!((g - v / (1.0 + (-v).exp())).abs() < 1e-5);
    }
    assert!(be.layer_norm(&xt, &be.upload(w[..8].to_vec(), 1, 8).unwrap(), None, 1e-5).is_err());
}

/// Bidirectional attention of one sequence, band |i - j| <= window.
fn naive_encoder_attention(q: &[f32], k: &[f32], v: &[f32], p: &AttnParams, rows: std::ops::Range<usize>) -> Vec<f32> {
    let (hd, kvd) = (p.head_dim, p.n_kv_heads * p.head_dim);
    let mut out = Vec::new();
    for i in rows.clone() {
        for h in 0..p.n_heads {
            let kh = h / (p.n_heads / p.n_kv_heads);
            let keys: Vec<usize> = rows.clone().filter(|&j| p.window.is_none_or(|w| i.abs_diff(j) <= w)).collect();
            let qv = &q[(i * p.n_heads + h) * hd..][..hd];
            let s: Vec<f64> = keys
                .iter()
                .map(|&j| (0..hd).map(|d| qv[d] as f64 * k[j * kvd + kh * hd + d] as f64).sum::<f64>() * p.scale as f64)
                .collect();
            let mx = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let e: Vec<f64> = s.iter().map(|x| (x - mx).exp()).collect();
            let z: f64 = e.iter().sum();
            for d in 0..hd {
                out.push(
                    keys.iter().enumerate().map(|(n, &j)| e[n] / z * v[j * kvd + kh * hd + d] as f64).sum::<f64>()
                        as f32,
                );
            }
        }
    }
    out
}

#[test]
fn encoder_attention_matches_reference_with_bands_and_gqa() {
    let be = CpuBackend::F32;
    let mut rng = Rng(0xabc);
    // Sequences of 1, 5 and 23 rows back to back.
    let seqs = [0..1, 1..6, 6..29];
    let n = 29;
    for (n_heads, n_kv_heads, window) in [(4, 4, None), (4, 2, Some(3)), (2, 1, Some(0)), (3, 3, Some(40))] {
        let hd = 8;
        let p = AttnParams { n_heads, n_kv_heads, head_dim: hd, scale: 0.35, window, softcap: None };
        let (q, k, v) =
            (rng.vec(n * n_heads * hd, 1.0), rng.vec(n * n_kv_heads * hd, 1.0), rng.vec(n * n_kv_heads * hd, 1.0));
        let up = |x: &Vec<f32>, c| be.upload(x.clone(), n, c).unwrap();
        let got = be
            .encoder_attention(&up(&q, n_heads * hd), &up(&k, n_kv_heads * hd), &up(&v, n_kv_heads * hd), &seqs, &p)
            .unwrap();
        let want: Vec<f32> = seqs.iter().flat_map(|s| naive_encoder_attention(&q, &k, &v, &p, s.clone())).collect();
        let e = rel_err(&got.data, &want);
        assert!(e < 1e-5, "heads {n_heads}/{n_kv_heads} window {window:?}: relative error {e}");
    }
    // Rows left without a sequence are a shape error, not a panic.
    let p = AttnParams { n_heads: 1, n_kv_heads: 1, head_dim: 4, scale: 1.0, window: None, softcap: None };
    let t = be.upload(vec![0.0; 8], 2, 4).unwrap();
    let only_first_row = vec![std::ops::Range { start: 0, end: 1 }];
    assert!(be.encoder_attention(&t, &t, &t, &only_first_row, &p).is_err());
}
