//! Embedding models against independent references (fixtures made by
//! scripts/make_embedding_goldens.py): all-MiniLM-L6-v2 against
//! sentence-transformers, tiny random ModernBERT and BERT checkpoints against HF
//! transformers; batched equals single; and `ferrite embed` as a user runs it.

mod common;
use common::*;

use std::path::Path;
use std::process::Command;

use ferrite_backend::cpu::CpuBackend;
use ferrite_engine::embed::{Embedder, PoolingConfig};
use ferrite_loader::source::resolve;
use ferrite_loader::tokenizer::Tokenizer;
use ferrite_models::encoder::load_encoder;
use ferrite_models::Checkpoint;
use serde_json::Value;

fn embedder(dir: &Path) -> Embedder {
    embedder_on(dir, CpuBackend::F32)
}

fn embedder_on(dir: &Path, backend: CpuBackend) -> Embedder {
    let ck = Checkpoint::open(&resolve(dir.to_str().unwrap()).unwrap()).unwrap();
    let model = load_encoder(backend, &ck).unwrap();
    Embedder::new(model, Tokenizer::from_hf_dir(dir).unwrap(), &PoolingConfig::from_dir(dir).unwrap())
}

fn floats(v: &Value) -> Vec<f32> {
    v.as_array().unwrap().iter().map(|x| x.as_f64().unwrap() as f32).collect()
}

fn cosine(a: &[f32], b: &[f32]) -> f64 {
    let dot: f64 = a.iter().zip(b).map(|(&x, &y)| x as f64 * y as f64).sum();
    let n = |v: &[f32]| v.iter().map(|&x| x as f64 * x as f64).sum::<f64>().sqrt();
    dot / (n(a) * n(b))
}

fn max_abs(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0.0, f32::max)
}

/// Every non-empty reference input (ferrite rejects "", as other servers do).
fn items(case: &Value) -> Vec<&Value> {
    case["items"].as_array().unwrap().iter().filter(|i| !i["text"].as_str().unwrap().is_empty()).collect()
}

#[test]
fn minilm_matches_sentence_transformers() {
    let refs = read_json("embed/minilm.json");
    let mut e = embedder(&model_path("all-minilm-l6-v2"));
    for (case, max_length) in [("default", 256), ("max512", 512)] {
        let case = &refs["cases"][case];
        assert_eq!(case["max_length"].as_u64(), Some(max_length as u64));
        e.max_length = max_length;
        let items = items(case);
        let texts: Vec<String> = items.iter().map(|i| i["text"].as_str().unwrap().to_string()).collect();
        let ids = e.tokenize_all(&texts, true).unwrap();
        for (got, item) in ids.iter().zip(&items) {
            assert_eq!(got, &common::ids(&item["ids"]), "token ids of {:?}", item["text"]);
        }
        // Batched (one forward over every input) and single must agree bit for bit.
        let batched = e.embed_tokens(&ids, false).unwrap();
        for ((one_ids, got), item) in ids.iter().zip(&batched).zip(&items) {
            let cos = cosine(got, &floats(&item["embedding"]));
            assert!(cos >= 0.9999, "cosine {cos} for {:?} (max length {max_length})", item["text"]);
            let single = e.embed_tokens(std::slice::from_ref(one_ids), false).unwrap();
            assert_eq!(&single[0], got, "batched differs from single for {:?}", item["text"]);
        }
    }
    // Without the Normalize module: the raw mean.
    e.max_length = 256;
    e.normalize = false;
    for item in items(&refs["cases"]["default"]).into_iter().filter(|i| i.get("mean_pooled").is_some()) {
        let got = e.embed_tokens(&[common::ids(&item["ids"])], false).unwrap();
        assert!(max_abs(&got[0], &floats(&item["mean_pooled"])) < 1e-4, "mean pooling of {:?}", item["text"]);
    }
}

/// bf16 products (where the CPU has them) keep every vector within cosine
/// 0.9999 of sentence-transformers' f32 ones, and batched still equals single.
#[test]
fn minilm_in_bf16_stays_within_tolerance() {
    let refs = read_json("embed/minilm.json");
    let (backend, on) = CpuBackend::with_bf16_dense();
    let e = embedder_on(&model_path("all-minilm-l6-v2"), backend);
    let items = items(&refs["cases"]["default"]);
    let texts: Vec<String> = items.iter().map(|i| i["text"].as_str().unwrap().to_string()).collect();
    let ids = e.tokenize_all(&texts, true).unwrap();
    let batched = e.embed_tokens(&ids, false).unwrap();
    for ((one, got), item) in ids.iter().zip(&batched).zip(&items) {
        let cos = cosine(got, &floats(&item["embedding"]));
        assert!(cos >= 0.9999, "bf16={on}: cosine {cos} for {:?}", item["text"]);
        assert_eq!(&e.embed_tokens(std::slice::from_ref(one), false).unwrap()[0], got);
    }
}

/// Checks every item of one fixture checkpoint: token ids, last hidden state
/// of every token and the pooled vector, raw and normalized.
fn check_checkpoint(dir: &Path, refs: &Value) {
    let mut e = embedder(dir);
    let items = items(refs);
    let texts: Vec<String> = items.iter().map(|i| i["text"].as_str().unwrap().to_string()).collect();
    let ids = e.tokenize_all(&texts, false).unwrap();
    for (got, item) in ids.iter().zip(&items) {
        assert_eq!(got, &common::ids(&item["ids"]), "{}: token ids of {:?}", dir.display(), item["text"]);
    }
    let hidden = e.model().forward(&ferrite_models::encoder::EncodeBatch::new(&ids)).unwrap();
    let dim = e.dim();
    let mut row = 0;
    for item in &items {
        for (t, want) in item["last_hidden_state"].as_array().unwrap().iter().enumerate() {
            let got = &hidden[(row + t) * dim..(row + t + 1) * dim];
            let d = max_abs(got, &floats(want));
            assert!(d < 1e-4, "{}: token {t} of {:?}: max abs diff {d}", dir.display(), item["text"]);
        }
        row += item["n_tokens"].as_u64().unwrap() as usize;
    }
    e.normalize = false;
    let raw = e.embed_tokens(&ids, false).unwrap();
    let normalized = e.embed_tokens(&ids, true).unwrap();
    for ((r, n), item) in raw.iter().zip(&normalized).zip(&items) {
        assert!(max_abs(r, &floats(&item["pooled"])) < 1e-4, "{}: pooled {:?}", dir.display(), item["text"]);
        assert!(max_abs(n, &floats(&item["pooled_normalized"])) < 1e-5, "{}: normalized", dir.display());
    }
}

#[test]
fn modernbert_matches_transformers_in_both_config_generations() {
    let refs = read_json("embed/modernbert.json");
    for name in ["modernbert-tiny-a", "modernbert-tiny-b"] {
        let dir = fixture(&format!("embed/{name}"));
        let r = &refs["checkpoints"][name];
        check_checkpoint(&dir, r);
        // The same checkpoint described by an older config.json (global_attn_every_n_layers,
        // global/local_rope_theta instead of layer_types and rope_parameters).
        let tmp = std::env::temp_dir().join(format!("ferrite-{name}-v4-{}", std::process::id()));
        std::fs::create_dir_all(tmp.join("1_Pooling")).unwrap();
        for f in
            ["model.safetensors", "tokenizer.json", "tokenizer_config.json", "modules.json", "1_Pooling/config.json"]
        {
            std::fs::copy(dir.join(f), tmp.join(f)).unwrap();
        }
        std::fs::copy(dir.join("config.v4.json"), tmp.join("config.json")).unwrap();
        check_checkpoint(&tmp, r);
        std::fs::remove_dir_all(&tmp).unwrap();
    }
}

#[test]
fn bert_with_cls_pooling_matches_transformers() {
    let refs = read_json("embed/bert-tiny.json");
    check_checkpoint(&fixture("embed/bert-tiny-cls"), &refs["checkpoints"]["bert-tiny-cls"]);
}

// ---------------------------------------------------------------------------
// The command line

fn ferrite(args: &[&str]) -> (bool, String, String) {
    let o = Command::new(env!("CARGO_BIN_EXE_ferrite")).args(args).output().unwrap();
    let (out, err) = (String::from_utf8_lossy(&o.stdout).into_owned(), String::from_utf8_lossy(&o.stderr).into_owned());
    assert!(!err.contains("panicked"), "ferrite {args:?} panicked: {err}");
    (o.status.success(), out, err)
}

fn copy_tree(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let path = entry.unwrap().path();
        let dest = to.join(path.file_name().unwrap());
        if path.is_dir() {
            copy_tree(&path, &dest);
        } else {
            std::fs::copy(&path, dest).unwrap();
        }
    }
}

fn fails_with(args: &[&str], needles: &[&str]) {
    let (ok, out, err) = ferrite(args);
    assert!(!ok && out.is_empty(), "ferrite {args:?} should fail: {out} {err}");
    let last = err.lines().last().unwrap_or("").to_lowercase();
    assert!(last.starts_with("error: "), "ferrite {args:?}: {err}");
    for n in needles {
        assert!(last.contains(n), "ferrite {args:?}: {last:?} lacks {n:?}");
    }
}

#[test]
fn embed_command_prints_json_lines_in_order() {
    let dir = fixture("embed/modernbert-tiny-a");
    let dir = dir.to_str().unwrap();
    let refs = read_json("embed/modernbert.json");
    // One input per line: inputs holding a line break cannot go in the file.
    let items: Vec<&Value> = items(&refs["checkpoints"]["modernbert-tiny-a"])
        .into_iter()
        .filter(|i| !i["text"].as_str().unwrap().contains(['\n', '\r']))
        .collect();
    let file = std::env::temp_dir().join(format!("ferrite-embed-{}.txt", std::process::id()));
    let lines: Vec<&str> = items[1..].iter().map(|i| i["text"].as_str().unwrap()).collect();
    std::fs::write(&file, lines.join("\n") + "\n").unwrap();
    let first = items[0]["text"].as_str().unwrap();
    let (ok, out, err) =
        ferrite(&["embed", dir, first, "--file", file.to_str().unwrap(), "--batch-size", "3", "--precision", "f32"]);
    assert!(ok, "{err}");
    let rows: Vec<Value> = out.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(rows.len(), items.len());
    for (i, (row, item)) in rows.iter().zip(&items).enumerate() {
        assert_eq!(row["index"].as_u64(), Some(i as u64));
        assert!(max_abs(&floats(&row["embedding"]), &floats(&item["pooled"])) < 1e-4, "line {i}");
    }
    // --normalize gives unit vectors.
    let (ok, out, _) = ferrite(&["embed", dir, first, "--normalize"]);
    assert!(ok);
    let v: Value = serde_json::from_str(out.trim()).unwrap();
    let n: f64 = floats(&v["embedding"]).iter().map(|&x| x as f64 * x as f64).sum();
    assert!((n - 1.0).abs() < 1e-5);
    std::fs::remove_file(&file).unwrap();
}

#[test]
fn embed_command_rejects_bad_input_clearly() {
    let dir = fixture("embed/modernbert-tiny-a");
    let d = dir.to_str().unwrap();
    fails_with(&["embed", d, ""], &["empty"]);
    fails_with(&["embed", d], &["nothing to embed"]);
    let long = "word ".repeat(400);
    fails_with(&["embed", d, &long], &["tokens", "--truncate"]);
    let (ok, out, _) = ferrite(&["embed", d, &long, "--truncate"]);
    assert!(ok && out.lines().count() == 1);
    fails_with(&["embed", d, "x", "--file", "/nonexistent/inputs.txt"], &["/nonexistent/inputs.txt"]);
    // A file's bad lines are named by number; an empty file is said to be one.
    let files = std::env::temp_dir().join(format!("ferrite-embed-files-{}", std::process::id()));
    std::fs::create_dir_all(&files).unwrap();
    for (name, bytes, needles) in [
        ("blank.txt", &b"a\nb\n\n"[..], &["line 3 is empty"][..]),
        ("bytes.txt", b"a\n\xff\n", &["line 2", "utf-8"]),
        ("none.txt", b"", &["none.txt", "no lines"]),
    ] {
        let f = files.join(name);
        std::fs::write(&f, bytes).unwrap();
        fails_with(&["embed", d, "--file", f.to_str().unwrap()], needles);
    }
    std::fs::remove_dir_all(&files).ok();
    fails_with(&["embed", d, "x", "--batch-size", "0"], &["batch-size"]);
    // `inspect` describes an embedding model.
    let (ok, out, _) = ferrite(&["inspect", d]);
    assert!(ok && out.contains("ModernBert encoder") && out.contains("pooling:       Mean"), "{out}");
    // A decoder is not an embedding model, and an embedding model does not generate.
    let smollm = model_path("smollm2.gguf");
    fails_with(&["embed", smollm.to_str().unwrap(), "hello"], &["not an embedding model"]);
    fails_with(&["run", d, "--prompt", "hi"], &["embedding model", "ferrite embed"]);
    // Corrupt configs: one error line each, no panic and no huge allocation.
    let bert = fixture("embed/bert-tiny-cls");
    let corrupt = |tag: &str, key: &str, value: u64| {
        let dir = std::env::temp_dir().join(format!("ferrite-embed-cfg-{}-{tag}", std::process::id()));
        copy_tree(&bert, &dir);
        let mut cfg: Value = serde_json::from_str(&std::fs::read_to_string(dir.join("config.json")).unwrap()).unwrap();
        cfg[key] = value.into();
        std::fs::write(dir.join("config.json"), cfg.to_string()).unwrap();
        dir
    };
    for (tag, key, value, needle) in
        [("layers", "num_hidden_layers", 1u64 << 60, "layer count"), ("types", "type_vocab_size", 0, "type_vocab_size")]
    {
        let dir = corrupt(tag, key, value);
        fails_with(&["embed", dir.to_str().unwrap(), "hi"], &[needle]);
        std::fs::remove_dir_all(&dir).ok();
    }
}

/// Many inputs (more than one tokenizing group of 1,024): every line comes
/// out once, in order, equal to embedding that input alone; and a bad input
/// at the very end, found after many batches were embedded, fails the run
/// with nothing printed.
#[test]
fn embed_command_pipelines_many_inputs_and_holds_output_until_all_tokenize() {
    let dir = fixture("embed/bert-tiny-cls");
    let d = dir.to_str().unwrap();
    let texts: Vec<String> = (0..1100).map(|i| format!("sentence number {i} about {}", i % 7)).collect();
    let file = std::env::temp_dir().join(format!("ferrite-embed-many-{}.txt", std::process::id()));
    std::fs::write(&file, texts.join("\n") + "\n").unwrap();
    let f = file.to_str().unwrap();
    let (ok, out, err) = ferrite(&["embed", d, "--file", f, "--batch-size", "16", "--precision", "f32"]);
    assert!(ok, "{err}");
    let rows: Vec<Value> = out.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(rows.len(), texts.len());
    for (i, row) in rows.iter().enumerate() {
        assert_eq!(row["index"].as_u64(), Some(i as u64));
    }
    for i in [0, 517, 1099] {
        let (ok, one, _) = ferrite(&["embed", d, &texts[i], "--precision", "f32"]);
        assert!(ok);
        let alone: Value = serde_json::from_str(one.trim()).unwrap();
        let diff = max_abs(&floats(&rows[i]["embedding"]), &floats(&alone["embedding"]));
        assert!(diff < 1e-5, "input {i}: batched differs from alone by {diff}");
    }
    let mut bad = texts.clone();
    bad.push("word ".repeat(600));
    std::fs::write(&file, bad.join("\n") + "\n").unwrap();
    fails_with(&["embed", d, "--file", f, "--batch-size", "16"], &["input 1100", "--truncate"]);
    // A reader that stops early (`| head -1`) ends the run quietly.
    std::fs::write(&file, texts.join("\n") + "\n").unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_ferrite"))
        .args(["embed", d, "--file", f, "--batch-size", "16"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut first = String::new();
    std::io::BufRead::read_line(&mut std::io::BufReader::new(child.stdout.take().unwrap()), &mut first).unwrap();
    assert!(first.starts_with("{\"index\":0,"), "{first}");
    let o = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success() && !err.contains("error"), "{err}");
    std::fs::remove_file(&file).unwrap();
}

// ---------------------------------------------------------------------------
// The serving engine (what /v1/embeddings runs on)

#[test]
fn embed_engine_is_fair_validates_and_shuts_down_cleanly() {
    use ferrite_engine::embed::{EmbedEngine, EmbedEngineConfig, MAX_INPUTS};
    let dir = fixture("embed/bert-tiny-cls");
    let reference = embedder(&dir);
    let engine = EmbedEngine::start(embedder(&dir), EmbedEngineConfig { max_batch_tokens: 64, max_waiting: 8 });
    let long: Vec<u32> = (0..60).map(|i| 5 + i % 300).collect();
    let short = vec![2u32, 40, 41, 3];

    // A huge request first, then a small one: the small one is answered while
    // the huge one is still running (inputs are taken from requests in turn).
    let big = engine.submit(vec![long.clone(); MAX_INPUTS], None, None).unwrap();
    let mut small = engine.submit(vec![short.clone()], None, Some(16)).unwrap();
    let got = loop {
        match small.try_recv() {
            Ok(r) => break r.unwrap(),
            Err(tokio::sync::oneshot::error::TryRecvError::Empty) => std::thread::yield_now(),
            Err(e) => panic!("{e}"),
        }
    };
    let raw = reference.pooled(&[short.as_slice()]).unwrap();
    // `dimensions` keeps the leading values, then normalizes (this checkpoint normalizes).
    let mut cut = raw[0][..16].to_vec();
    ferrite_engine::embed::l2_normalize(&mut cut);
    assert_eq!(got, vec![cut]);
    let big = big.blocking_recv().unwrap().unwrap();
    assert_eq!(big.len(), MAX_INPUTS);
    assert_eq!(big[0], reference.embed_tokens(std::slice::from_ref(&long), false).unwrap()[0]);

    // Validation happens on submit, with the offending input named.
    assert!(engine.submit(Vec::new(), None, None).unwrap().blocking_recv().unwrap().unwrap().is_empty());
    let err = |r: ferrite_core::Result<_>| r.err().map(|e: ferrite_core::Error| e.to_string()).unwrap_or_default();
    assert!(err(engine.submit(vec![short.clone(); MAX_INPUTS + 1], None, None)).contains("at most"));
    assert!(err(engine.submit(vec![short.clone(), vec![2, 99_999]], None, None)).contains("input 1"));
    assert!(err(engine.submit(vec![vec![]], None, None)).contains("input 0"));
    assert!(err(engine.submit(vec![short.clone()], None, Some(0))).contains("dimensions"));

    // Shutdown with work queued: every receiver gets an answer, none hangs.
    let pending: Vec<_> = (0..4).map(|_| engine.submit(vec![long.clone(); 256], None, None).unwrap()).collect();
    engine.shutdown();
    for rx in pending {
        let _ = rx.blocking_recv().expect("a queued request must get a reply on shutdown");
    }
    assert_eq!(engine.metrics().waiting, 0);
    assert!(engine.submit(vec![short], None, None).is_err());
}
