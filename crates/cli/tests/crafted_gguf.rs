//! Crafted GGUF files through the CLI: absurd counts, bad header fields and
//! inconsistent models each give one clear error, never a panic, a hang or a
//! huge allocation.

mod common;
use common::cli::*;

use std::path::{Path, PathBuf};

/// A metadata value: GGUF type id and the encoded payload.
struct Val(u32, Vec<u8>);

fn gstr(s: &[u8]) -> Vec<u8> {
    let mut v = (s.len() as u64).to_le_bytes().to_vec();
    v.extend_from_slice(s);
    v
}
fn v_u32(x: u32) -> Val {
    Val(4, x.to_le_bytes().to_vec())
}
fn v_u64(x: u64) -> Val {
    Val(10, x.to_le_bytes().to_vec())
}
fn v_f32(x: f32) -> Val {
    Val(6, x.to_le_bytes().to_vec())
}
fn v_str(x: &str) -> Val {
    Val(8, gstr(x.as_bytes()))
}

struct Tensor {
    name: String,
    /// GGUF order: dims[0] is the row length.
    dims: Vec<u64>,
    ty: u32,
    data: Vec<u8>,
}

/// A minimal GGUF v3 writer.
struct Gguf {
    version: u32,
    kv: Vec<(Vec<u8>, Val)>,
    tensors: Vec<Tensor>,
}

impl Gguf {
    fn set(&mut self, key: &str, v: Val) {
        self.kv.retain(|(k, _)| k != key.as_bytes());
        self.kv.push((key.as_bytes().to_vec(), v));
    }
    fn remove(&mut self, key: &str) {
        self.kv.retain(|(k, _)| k != key.as_bytes());
    }
    fn tensor(&mut self, name: &str) -> &mut Tensor {
        self.tensors.iter_mut().find(|t| t.name == name).unwrap()
    }
    fn bytes(&self) -> Vec<u8> {
        const ALIGN: usize = 32;
        let mut b = b"GGUF".to_vec();
        b.extend(self.version.to_le_bytes());
        b.extend((self.tensors.len() as u64).to_le_bytes());
        b.extend((self.kv.len() as u64).to_le_bytes());
        for (k, Val(ty, payload)) in &self.kv {
            b.extend(gstr(k));
            b.extend(ty.to_le_bytes());
            b.extend(payload);
        }
        let mut offset = 0usize;
        for t in &self.tensors {
            b.extend(gstr(t.name.as_bytes()));
            b.extend((t.dims.len() as u32).to_le_bytes());
            t.dims.iter().for_each(|d| b.extend(d.to_le_bytes()));
            b.extend(t.ty.to_le_bytes());
            b.extend((offset as u64).to_le_bytes());
            offset += t.data.len().div_ceil(ALIGN) * ALIGN;
        }
        b.resize(b.len().div_ceil(ALIGN) * ALIGN, 0);
        for t in &self.tensors {
            b.extend(&t.data);
            b.resize(b.len().div_ceil(ALIGN) * ALIGN, 0);
        }
        b
    }
}

/// Deterministic small f32 values.
fn f32_data(n: usize, seed: u32) -> Vec<u8> {
    let mut x = seed.wrapping_mul(2_654_435_761).wrapping_add(1);
    (0..n)
        .flat_map(|_| {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            ((x % 1000) as f32 / 1000.0 - 0.5).to_le_bytes()
        })
        .collect()
}

const HIDDEN: u64 = 8;
const HEADS: u64 = 2;
const KV_HEADS: u64 = 1;
const HEAD_DIM: u64 = HIDDEN / HEADS;
const FFN: u64 = 16;
const VOCAB: u64 = 16;

/// A complete one-layer Llama with random f32 weights and no tokenizer.
fn tiny_llama() -> Gguf {
    let mut g = Gguf { version: 3, kv: Vec::new(), tensors: Vec::new() };
    g.set("general.architecture", v_str("llama"));
    g.set("general.name", v_str("tiny"));
    g.set("llama.embedding_length", v_u32(HIDDEN as u32));
    g.set("llama.attention.head_count", v_u32(HEADS as u32));
    g.set("llama.attention.head_count_kv", v_u32(KV_HEADS as u32));
    g.set("llama.block_count", v_u32(1));
    g.set("llama.feed_forward_length", v_u32(FFN as u32));
    g.set("llama.context_length", v_u32(64));
    g.set("llama.vocab_size", v_u32(VOCAB as u32));
    g.set("llama.attention.layer_norm_rms_epsilon", v_f32(1e-5));
    let (q, kv) = (HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM);
    let shapes: [(&str, &[u64]); 11] = [
        ("token_embd.weight", &[HIDDEN, VOCAB]),
        ("blk.0.attn_norm.weight", &[HIDDEN]),
        ("blk.0.attn_q.weight", &[HIDDEN, q]),
        ("blk.0.attn_k.weight", &[HIDDEN, kv]),
        ("blk.0.attn_v.weight", &[HIDDEN, kv]),
        ("blk.0.attn_output.weight", &[q, HIDDEN]),
        ("blk.0.ffn_norm.weight", &[HIDDEN]),
        ("blk.0.ffn_gate.weight", &[HIDDEN, FFN]),
        ("blk.0.ffn_up.weight", &[HIDDEN, FFN]),
        ("blk.0.ffn_down.weight", &[FFN, HIDDEN]),
        ("output_norm.weight", &[HIDDEN]),
    ];
    for (i, (name, dims)) in shapes.iter().enumerate() {
        let n: u64 = dims.iter().product();
        g.tensors.push(Tensor {
            name: name.to_string(),
            dims: dims.to_vec(),
            ty: 0,
            data: f32_data(n as usize, i as u32),
        });
    }
    g
}

fn write_gguf(dir: &Path, name: &str, bytes: &[u8]) -> PathBuf {
    let p = dir.join(format!("{name}.gguf"));
    std::fs::write(&p, bytes).unwrap();
    p
}

/// Byte offset of the first metadata key's length (after magic, version, counts).
const FIRST_KEY: usize = 24;

#[test]
fn crafted_gguf_control() {
    // The writer makes a loadable model, so each failure below is due to its edit.
    let dir = scratch("gguf-control");
    let p = write_gguf(&dir, "tiny", &tiny_llama().bytes());
    let (out, _) = ok(&["score", s(&p), "--tokens", "1,2,3", "--top", "2"]);
    assert_eq!(out.lines().count(), 3, "{out}");
    let (out, _) = ok(&["inspect", s(&p)]);
    assert!(out.contains("architecture:  llama") && out.contains("F32 x11"), "{out}");
    assert!(out.contains("tokenizer:     unusable"), "{out}");
    // No tokenizer metadata: `run` cannot encode a prompt.
    fails(&["run", s(&p), "--prompt", "hi"], &["tokenizer"]);
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn crafted_gguf_absurd_counts() {
    let dir = scratch("gguf-counts");
    let good = tiny_llama().bytes();
    let patch = |at: usize, v: u64| {
        let mut b = good.clone();
        b[at..at + 8].copy_from_slice(&v.to_le_bytes());
        b
    };
    let cases: Vec<(&str, Vec<u8>, &[&str])> = vec![
        ("tensors", patch(8, 1 << 60), &["tensor count"]),
        ("tensors-max", patch(8, u64::MAX), &["tensor count"]),
        ("kvs", patch(16, 1 << 60), &["metadata count"]),
        ("strlen", patch(FIRST_KEY, 1 << 60), &["string length"]),
        ("strlen-max", patch(FIRST_KEY, u64::MAX), &["string length"]),
        (
            "array",
            {
                let mut g = tiny_llama();
                let mut payload = 8u32.to_le_bytes().to_vec();
                payload.extend((1u64 << 60).to_le_bytes());
                g.set("tokenizer.ggml.tokens", Val(9, payload));
                g.bytes()
            },
            &["array count"],
        ),
        (
            "array-of-arrays",
            {
                let mut g = tiny_llama();
                let mut payload = 9u32.to_le_bytes().to_vec();
                payload.extend(1u64.to_le_bytes());
                payload.extend(4u32.to_le_bytes());
                payload.extend((1u64 << 60).to_le_bytes());
                g.set("x.nested", Val(9, payload));
                g.bytes()
            },
            &["array count"],
        ),
        (
            "dims-overflow",
            {
                let mut g = tiny_llama();
                g.tensor("blk.0.attn_norm.weight").dims = vec![1 << 40, 1 << 40, 1 << 40];
                g.bytes()
            },
            &["absurd dimensions"],
        ),
        (
            "dims-huge",
            {
                let mut g = tiny_llama();
                g.tensor("blk.0.attn_norm.weight").dims = vec![1 << 40];
                g.bytes()
            },
            &["past the end"],
        ),
    ];
    for (name, bytes, needles) in cases {
        let p = write_gguf(&dir, name, &bytes);
        fails(&["score", s(&p), "--tokens", "1,2"], needles);
        fails(&["run", s(&p), "--prompt", "hi"], needles);
        fails(&["inspect", s(&p)], needles);
    }
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn crafted_gguf_bad_header_fields() {
    let dir = scratch("gguf-fields");
    type Edit = Box<dyn Fn(&mut Gguf)>;
    let cases: Vec<(&str, Edit, &[&str])> = vec![
        ("version1", Box::new(|g| g.version = 1), &["version 1"]),
        ("version9", Box::new(|g| g.version = 9), &["version 9"]),
        ("type-id", Box::new(|g| g.tensor("blk.0.attn_q.weight").ty = 99), &["attn_q", "type id 99"]),
        ("type-id-removed", Box::new(|g| g.tensor("blk.0.attn_q.weight").ty = 4), &["type id 4"]),
        ("n-dims", Box::new(|g| g.tensor("blk.0.attn_k.weight").dims = vec![1; 7]), &["attn_k", "7 dimensions"]),
        ("n-dims0", Box::new(|g| g.tensor("blk.0.attn_k.weight").dims = vec![]), &["0 dimensions"]),
        ("value-type", Box::new(|g| g.set("x.odd", Val(99, vec![]))), &["unknown value type 99"]),
        (
            "array-type",
            Box::new(|g| g.set("x.odd", Val(9, [77u32.to_le_bytes().as_slice(), &0u64.to_le_bytes()].concat()))),
            &["element type 77"],
        ),
        ("bool", Box::new(|g| g.set("x.flag", Val(7, vec![5]))), &["bool"]),
        ("utf8", Box::new(|g| g.set("general.name", Val(8, gstr(&[0xff, 0xfe, 0x41])))), &["UTF-8"]),
        ("alignment", Box::new(|g| g.set("general.alignment", v_u32(3))), &["alignment"]),
        ("alignment0", Box::new(|g| g.set("general.alignment", v_u32(0))), &["alignment"]),
        // Q4_0 rows hold whole 32-element blocks; a row of 8 cannot.
        ("block", Box::new(|g| g.tensor("blk.0.attn_q.weight").ty = 2), &["attn_q", "block size"]),
    ];
    for (name, edit, needles) in cases {
        let mut g = tiny_llama();
        edit(&mut g);
        let p = write_gguf(&dir, name, &g.bytes());
        fails(&["score", s(&p), "--tokens", "1,2"], needles);
        fails(&["inspect", s(&p)], needles);
    }
    // Tensor data cut off at the end of the file.
    let bytes = tiny_llama().bytes();
    let p = write_gguf(&dir, "cut", &bytes[..bytes.len() - 20]);
    fails(&["score", s(&p), "--tokens", "1,2"], &["output_norm", "past the end"]);
    // Header cut off in the middle of the tensor directory.
    let p = write_gguf(&dir, "cut-header", &bytes[..400]);
    fails(&["score", s(&p), "--tokens", "1,2"], &["truncated"]);
    std::fs::remove_dir_all(&dir).ok();
}

/// `run` loads the tokenizer after checking the architecture and before the
/// weights; the crafted files have none, so `run` is checked only for the edits
/// the configuration mapping catches (`config: true`).
struct ModelCase {
    name: &'static str,
    edit: Box<dyn Fn(&mut Gguf)>,
    needles: &'static [&'static str],
    config: bool,
}

fn case(
    name: &'static str,
    config: bool,
    needles: &'static [&'static str],
    edit: impl Fn(&mut Gguf) + 'static,
) -> ModelCase {
    ModelCase { name, edit: Box::new(edit), needles, config }
}

#[test]
fn crafted_gguf_bad_model() {
    let dir = scratch("gguf-model");
    let cases = vec![
        case("mamba", true, &["unsupported", "mamba9"], |g| g.set("general.architecture", v_str("mamba9"))),
        case("no-arch", true, &["general.architecture"], |g| g.remove("general.architecture")),
        case("arch-not-str", true, &["general.architecture"], |g| g.set("general.architecture", v_u32(7))),
        case("no-hidden", true, &["llama.embedding_length"], |g| g.remove("llama.embedding_length")),
        case("layers", true, &["layer count"], |g| g.set("llama.block_count", v_u64(1 << 39))),
        case("rope", true, &["yarn9"], |g| g.set("llama.rope.scaling.type", v_str("yarn9"))),
        case("layers-more", false, &["missing", "blk.1.attn_norm"], |g| g.set("llama.block_count", v_u32(2))),
        case("heads0", false, &["zero"], |g| g.set("llama.attention.head_count", v_u32(0))),
        case("kv-heads", false, &["KV heads"], |g| g.set("llama.attention.head_count_kv", v_u32(3))),
        case("head-dim-odd", false, &["odd"], |g| g.set("llama.attention.key_length", v_u32(3))),
        case("q-shape", false, &["attn_q", "expected [8, 8]"], |g| {
            g.tensor("blk.0.attn_q.weight").dims = vec![HIDDEN, 6]
        }),
        case("k-transposed", false, &["attn_k"], |g| g.tensor("blk.0.attn_k.weight").dims = vec![4, HIDDEN]),
        case("norm-shape", false, &["ffn_norm"], |g| g.tensor("blk.0.ffn_norm.weight").dims = vec![4]),
        case("no-down", false, &["missing", "ffn_down"], |g| g.tensors.retain(|t| t.name != "blk.0.ffn_down.weight")),
        case("vocab", false, &["token_embd"], |g| g.set("llama.vocab_size", v_u32(1 << 30))),
        // Values that would make every logit NaN or noise, and a layer count
        // short of the weights: refused, not run.
        case("eps", false, &["epsilon", "-1"], |g| g.set("llama.attention.layer_norm_rms_epsilon", v_f32(-1.0))),
        case("rope-nan", false, &["RoPE base", "NaN"], |g| g.set("llama.rope.freq_base", v_f32(f32::NAN))),
        case("rope-neg", false, &["RoPE base", "-1"], |g| g.set("llama.rope.freq_base", v_f32(-1.0))),
        case("layers-fewer", false, &["layer count is 1", "blk.1."], |g| {
            let extra =
                Tensor { name: "blk.1.attn_norm.weight".into(), dims: vec![HIDDEN], ty: 0, data: f32_data(8, 9) };
            g.tensors.push(extra);
        }),
    ];
    for c in cases {
        let mut g = tiny_llama();
        (c.edit)(&mut g);
        let p = write_gguf(&dir, c.name, &g.bytes());
        fails(&["score", s(&p), "--tokens", "1,2"], c.needles);
        if c.config {
            fails(&["run", s(&p), "--prompt", "hi"], c.needles);
            fails(&["inspect", s(&p)], c.needles);
        } else {
            fails(&["run", s(&p), "--prompt", "hi"], &["tokenizer"]);
        }
    }
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn crafted_gguf_as_bench_and_perplexity_input() {
    // The commands that load a model all report the same clear error.
    let dir = scratch("gguf-cmds");
    let mut g = tiny_llama();
    g.set("general.architecture", v_str("mamba9"));
    let p = write_gguf(&dir, "mamba", &g.bytes());
    let txt = dir.join("t.txt");
    std::fs::write(&txt, "hello ".repeat(100)).unwrap();
    fails(&["bench", s(&p), "--prompt-tokens", "4", "--gen-tokens", "2"], &["mamba9"]);
    fails(&["perplexity", s(&p), "--file", s(&txt), "--ctx", "16"], &["mamba9"]);
    fails(&["inspect", s(&p)], &["mamba9"]);
    std::fs::remove_dir_all(&dir).ok();
}
