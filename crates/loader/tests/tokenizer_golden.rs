//! Tokenizers against independent references: llama.cpp for GGUF files (token
//! ids, detokenized text, token pieces, BOS/EOS/EOG and control flags) and HF
//! `tokenizers` for tokenizer.json. Fixtures come from
//! scripts/golden_tokenizer.py; models from scripts/fetch-models.sh.
//!
//! Some fixtures are GGUF variants (another `tokenizer.ggml.pre`, other flags):
//! the fixture lists its metadata edits and the test applies them to the
//! shipped file, writing a tensor-free GGUF as the script did.

use std::collections::BTreeSet;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::time::Instant;

use ferrite_core::Error;
use ferrite_loader::gguf::{GgufFile, MetaArray, MetaValue};
use ferrite_loader::tokenizer::Tokenizer;
use serde::Deserialize;
use serde_json::Value;

/// `FERRITE_TOKENIZER_FIXTURES` points the golden tests at another fixture set
/// (e.g. a large random corpus written by the script for a one-off check).
fn fixture_dir() -> PathBuf {
    ferrite_core::env::path("FERRITE_TOKENIZER_FIXTURES")
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/tokenizer"))
}

fn models_dir() -> PathBuf {
    ferrite_loader::source::models_dir()
}

/// A model file or directory; missing models fail the test, never skip it.
fn model(name: &str) -> PathBuf {
    let path = models_dir().join(name);
    assert!(path.exists(), "model {} is missing: run scripts/fetch-models.sh", path.display());
    path
}

fn temp_path(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("ferrite-tok-{}-{name}.gguf", std::process::id()))
}

// ---------------------------------------------------------------- GGUF writer

fn put_str(w: &mut impl Write, s: &str) {
    w.write_all(&(s.len() as u64).to_le_bytes()).unwrap();
    w.write_all(s.as_bytes()).unwrap();
}

fn put_value(w: &mut impl Write, v: &MetaValue) {
    let mut scalar = |ty: u32, bytes: &[u8]| {
        w.write_all(&ty.to_le_bytes()).unwrap();
        w.write_all(bytes).unwrap();
    };
    match v {
        MetaValue::U8(x) => scalar(0, &x.to_le_bytes()),
        MetaValue::I8(x) => scalar(1, &x.to_le_bytes()),
        MetaValue::U16(x) => scalar(2, &x.to_le_bytes()),
        MetaValue::I16(x) => scalar(3, &x.to_le_bytes()),
        MetaValue::U32(x) => scalar(4, &x.to_le_bytes()),
        MetaValue::I32(x) => scalar(5, &x.to_le_bytes()),
        MetaValue::F32(x) => scalar(6, &x.to_le_bytes()),
        MetaValue::Bool(x) => scalar(7, &[*x as u8]),
        MetaValue::U64(x) => scalar(10, &x.to_le_bytes()),
        MetaValue::I64(x) => scalar(11, &x.to_le_bytes()),
        MetaValue::F64(x) => scalar(12, &x.to_le_bytes()),
        MetaValue::Str(s) => {
            w.write_all(&8u32.to_le_bytes()).unwrap();
            put_str(w, s);
        }
        MetaValue::Array(a) => {
            w.write_all(&9u32.to_le_bytes()).unwrap();
            let header = |w: &mut dyn Write, ty: u32, n: usize| {
                w.write_all(&ty.to_le_bytes()).unwrap();
                w.write_all(&(n as u64).to_le_bytes()).unwrap();
            };
            match a {
                MetaArray::Int(v) if v.iter().all(|&x| i32::try_from(x).is_ok()) => {
                    header(w, 5, v.len());
                    v.iter().for_each(|&x| w.write_all(&(x as i32).to_le_bytes()).unwrap());
                }
                MetaArray::Int(v) => {
                    header(w, 11, v.len());
                    v.iter().for_each(|x| w.write_all(&x.to_le_bytes()).unwrap());
                }
                MetaArray::Float(v) => {
                    header(w, 6, v.len());
                    v.iter().for_each(|&x| w.write_all(&(x as f32).to_le_bytes()).unwrap());
                }
                MetaArray::Bool(v) => {
                    header(w, 7, v.len());
                    v.iter().for_each(|&x| w.write_all(&[x as u8]).unwrap());
                }
                MetaArray::Str(v) => {
                    header(w, 8, v.len());
                    v.iter().for_each(|s| put_str(w, s));
                }
                MetaArray::Nested(_) => panic!("nested arrays are not needed here"),
            }
        }
    }
}

/// Writes a metadata-only GGUF v3 file.
fn write_gguf(path: &Path, metadata: &[(String, MetaValue)]) {
    let mut w = BufWriter::new(File::create(path).unwrap());
    w.write_all(b"GGUF").unwrap();
    w.write_all(&3u32.to_le_bytes()).unwrap();
    w.write_all(&0u64.to_le_bytes()).unwrap();
    w.write_all(&(metadata.len() as u64).to_le_bytes()).unwrap();
    for (key, value) in metadata {
        put_str(&mut w, key);
        put_value(&mut w, value);
    }
    w.flush().unwrap();
}

/// Writes `metadata` to a temporary GGUF and builds its tokenizer.
fn tokenizer_from_metadata(name: &str, metadata: &[(String, MetaValue)]) -> ferrite_core::Result<Tokenizer> {
    let path = temp_path(name);
    write_gguf(&path, metadata);
    let result = GgufFile::open(&path).and_then(|g| Tokenizer::from_gguf(&g));
    let _ = std::fs::remove_file(&path);
    result
}

// ---------------------------------------------------------------- fixtures

#[derive(Deserialize)]
struct GgufFixture {
    model: String,
    set: serde_json::Map<String, Value>,
    remove: Vec<String>,
    n_vocab: usize,
    bos: i64,
    eos: i64,
    eog: Vec<u32>,
    control_ranges: Vec<[u32; 2]>,
    pieces_hex: std::collections::BTreeMap<String, String>,
    cases: Vec<GgufCase>,
}

#[derive(Deserialize)]
struct GgufCase {
    text: String,
    ids: Vec<u32>,
    ids_plain: Vec<u32>,
    decoded_hex: String,
    decoded_skip_hex: String,
}

#[derive(Deserialize)]
struct HfFixture {
    model: String,
    n_vocab: usize,
    cases: Vec<HfCase>,
}

#[derive(Deserialize)]
struct HfCase {
    text: String,
    ids: Vec<u32>,
    ids_plain: Vec<u32>,
    decoded: String,
    decoded_skip: String,
}

fn load_fixture<T: for<'de> Deserialize<'de>>(name: &str) -> T {
    let path = fixture_dir().join(format!("{name}.json"));
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{}: {e} (run scripts/golden_tokenizer.py)", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn unhex(s: &str) -> Vec<u8> {
    (0..s.len()).step_by(2).map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap()).collect()
}

fn lossy(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// The fixture's tokenizer: the shipped GGUF, or a copy with the fixture's edits.
fn gguf_tokenizer(name: &str, fx: &GgufFixture) -> Tokenizer {
    let gguf = GgufFile::open(&model(&fx.model)).unwrap();
    if fx.set.is_empty() && fx.remove.is_empty() {
        let start = Instant::now();
        let tok = Tokenizer::from_gguf(&gguf).unwrap();
        eprintln!("{name}: built {} in {:?}", tok.kind(), start.elapsed());
        return tok;
    }
    let mut metadata: Vec<(String, MetaValue)> =
        gguf.metadata.iter().filter(|(k, _)| !fx.remove.contains(k) && !fx.set.contains_key(k)).cloned().collect();
    for (key, value) in &fx.set {
        let value = match value {
            Value::String(s) => MetaValue::Str(s.clone()),
            Value::Bool(b) => MetaValue::Bool(*b),
            other => panic!("unsupported edit {key} = {other}"),
        };
        metadata.push((key.clone(), value));
    }
    tokenizer_from_metadata(name, &metadata).unwrap()
}

fn check_gguf(name: &str) {
    let fx: GgufFixture = load_fixture(name);
    let tok = gguf_tokenizer(name, &fx);
    let mut failures: Vec<String> = Vec::new();
    let mut fail = |msg: String| {
        if failures.len() < 40 {
            failures.push(msg);
        }
    };

    if tok.vocab_size() != fx.n_vocab {
        fail(format!("vocab_size {} != {}", tok.vocab_size(), fx.n_vocab));
    }
    let want_bos = u32::try_from(fx.bos).ok();
    if tok.bos_id() != want_bos {
        fail(format!("bos {:?} != {want_bos:?}", tok.bos_id()));
    }
    let want_eos = u32::try_from(fx.eos).ok();
    if tok.eos_ids().first().copied() != want_eos || tok.eos_token() != want_eos.and_then(|id| tok.id_to_token(id)) {
        fail(format!("eos {:?} != {want_eos:?}", tok.eos_ids().first()));
    }
    let eog: BTreeSet<u32> = tok.eos_ids().iter().copied().collect();
    if eog != fx.eog.iter().copied().collect() || eog.len() != tok.eos_ids().len() {
        fail(format!("eos_ids {:?} != llama.cpp EOG {:?}", tok.eos_ids(), fx.eog));
    }
    let control: BTreeSet<u32> = fx.control_ranges.iter().flat_map(|r| r[0]..=r[1]).collect();
    for id in 0..fx.n_vocab as u32 {
        if tok.is_special(id) != control.contains(&id) {
            fail(format!("is_special({id}) [{:?}] = {}", tok.id_to_token(id), tok.is_special(id)));
        }
    }
    for (id, hex) in &fx.pieces_hex {
        let id: u32 = id.parse().unwrap();
        if tok.token_bytes(id) != unhex(hex) {
            fail(format!("token_bytes({id}) = {:?}, llama.cpp {:?}", tok.token_bytes(id), unhex(hex)));
        }
    }

    let mut round_trips = 0;
    for case in &fx.cases {
        let t = &case.text;
        match tok.encode(t, true) {
            Ok(ids) if ids == case.ids => {}
            other => fail(format!("encode({t:?}, true)\n   got  {other:?}\n   want {:?}", case.ids)),
        }
        match tok.encode(t, false) {
            Ok(ids) if ids == case.ids_plain => {}
            other => fail(format!("encode({t:?}, false)\n   got  {other:?}\n   want {:?}", case.ids_plain)),
        }
        let want = lossy(&unhex(&case.decoded_hex));
        let got = tok.decode(&case.ids, false);
        if got != want {
            fail(format!("decode(ids of {t:?}, false)\n   got  {got:?}\n   want {want:?}"));
        }
        let want_skip = lossy(&unhex(&case.decoded_skip_hex));
        let got_skip = tok.decode(&case.ids, true);
        if got_skip != want_skip {
            fail(format!("decode(ids of {t:?}, true)\n   got  {got_skip:?}\n   want {want_skip:?}"));
        }
        // Where llama.cpp gives the text back, so must we (from our own ids).
        if want_skip == *t {
            round_trips += 1;
            let ours = tok.encode(t, true).map(|ids| tok.decode(&ids, true));
            if ours.as_deref().ok() != Some(t.as_str()) {
                fail(format!("round trip of {t:?} gave {ours:?}"));
            }
        }
    }
    assert!(failures.is_empty(), "{name}: {} mismatches with llama.cpp:\n{}", failures.len(), failures.join("\n"));
    eprintln!("{name}: {} cases match llama.cpp ({round_trips} round trips)", fx.cases.len());
}

#[test]
fn smollm2_matches_llama_cpp() {
    check_gguf("smollm2");
}

#[test]
fn qwen2_pre_tokenizer_matches_llama_cpp() {
    check_gguf("smollm2-qwen2");
}

#[test]
fn llama_bpe_pre_tokenizer_matches_llama_cpp() {
    check_gguf("smollm2-llama-bpe");
}

#[test]
fn gpt2_pre_tokenizer_matches_llama_cpp() {
    check_gguf("smollm2-gpt2");
}

#[test]
fn default_pre_tokenizer_matches_llama_cpp() {
    check_gguf("smollm2-default");
}

#[test]
fn gemma3_matches_llama_cpp() {
    check_gguf("gemma3");
}

#[test]
fn spm_space_prefix_matches_llama_cpp() {
    check_gguf("gemma3-space-prefix");
}

#[test]
fn minilm_matches_hf_tokenizers() {
    let fx: HfFixture = load_fixture("minilm");
    let tok = Tokenizer::from_hf_dir(&model(&fx.model)).unwrap();
    assert_eq!(tok.vocab_size(), fx.n_vocab);
    assert!(tok.kind().starts_with("hf WordPiece"), "{}", tok.kind());
    let mut failures = Vec::new();
    for case in &fx.cases {
        let t = &case.text;
        let ids = tok.encode(t, true).unwrap();
        if ids != case.ids {
            failures.push(format!("encode({t:?}, true)\n   got  {ids:?}\n   want {:?}", case.ids));
        }
        let plain = tok.encode(t, false).unwrap();
        if plain != case.ids_plain {
            failures.push(format!("encode({t:?}, false)\n   got  {plain:?}\n   want {:?}", case.ids_plain));
        }
        if tok.decode(&case.ids, false) != case.decoded || tok.decode(&case.ids, true) != case.decoded_skip {
            failures.push(format!("decode of {t:?}: {:?}", tok.decode(&case.ids, false)));
        }
    }
    assert!(failures.is_empty(), "minilm: {} mismatches:\n{}", failures.len(), failures.join("\n"));
    // Padding/truncation at 128 in the file must be off.
    let long = "word ".repeat(300);
    assert_eq!(tok.encode(&long, true).unwrap().len(), 302);
    let cls = tok.token_to_id("[CLS]").unwrap();
    assert!(tok.is_special(cls));
    assert_eq!(tok.id_to_token(cls), Some("[CLS]"));
    assert_eq!(tok.token_bytes(cls), b"[CLS]");
}

#[test]
fn smollm2_api_facts() {
    let tok = Tokenizer::from_gguf(&GgufFile::open(&model("smollm2.gguf")).unwrap()).unwrap();
    assert_eq!(tok.kind(), "gguf gpt2 BPE (pre: smollm), 49152 tokens");
    assert_eq!(tok.bos_token(), Some("<|im_start|>"));
    assert_eq!(tok.eos_token(), Some("<|im_end|>"));
    let im_end = tok.token_to_id("<|im_end|>").unwrap();
    assert!(tok.eos_ids().contains(&im_end));
    assert!(tok.is_special(im_end));
    assert_eq!(tok.token_bytes(im_end), b"<|im_end|>");
    // "Ġworld" decodes to " world"; byte pieces of a split emoji concatenate back.
    let ids = tok.encode("😀 world", false).unwrap();
    let bytes: Vec<u8> = ids.iter().flat_map(|&id| tok.token_bytes(id)).collect();
    assert_eq!(bytes, "😀 world".as_bytes());
    // Out-of-range ids never panic.
    assert_eq!(tok.token_bytes(u32::MAX), b"");
    assert_eq!(tok.id_to_token(u32::MAX), None);
    assert_eq!(tok.decode(&[u32::MAX, ids[0]], true), tok.decode(&ids[..1], true));
}

/// A prompt of ids that stops inside a character: its echo leaves the
/// character out, generation's text starts with its first bytes, and the
/// two together are the whole text, at every cut of every model's ids.
#[test]
fn prompts_cut_inside_a_character_lose_nothing() {
    let text = "a 😀 ü 日本語 🦀🦀 é 𓀀𐍈 🫨";
    for name in ["smollm2.gguf", "gemma3-270m.gguf"] {
        let tok = Tokenizer::from_gguf(&GgufFile::open(&model(name)).unwrap()).unwrap();
        let ids = tok.encode(text, false).unwrap();
        let whole = tok.decode(&ids, false);
        assert_eq!(whole, tok.decode_finished(&ids), "{name}");
        let mut cuts_inside = 0;
        for cut in 1..ids.len() {
            let tail = tok.unfinished_tail(&ids[..cut]);
            cuts_inside += usize::from(!tail.is_empty());
            let rest: Vec<u8> = tail.into_iter().chain(ids[cut..].iter().flat_map(|&id| tok.token_bytes(id))).collect();
            let echo = tok.decode_finished(&ids[..cut]);
            assert!(!echo.contains(char::REPLACEMENT_CHARACTER), "{name} cut {cut}: {echo:?}");
            assert_eq!(echo + std::str::from_utf8(&rest).unwrap(), whole, "{name} cut {cut}");
        }
        assert!(cuts_inside >= 3, "{name}: {cuts_inside} cuts inside a character");
    }
}

#[test]
fn gemma3_builds_quickly_and_knows_turn_tokens() {
    let gguf = GgufFile::open(&model("gemma3-270m.gguf")).unwrap();
    let start = Instant::now();
    let tok = Tokenizer::from_gguf(&gguf).unwrap();
    let took = start.elapsed();
    eprintln!("gemma3 tokenizer ({}) built in {took:?}", tok.kind());
    assert_eq!(tok.kind(), "gguf llama SPM, 262144 tokens");
    let end_of_turn = tok.token_to_id("<end_of_turn>").unwrap();
    assert!(tok.eos_ids().contains(&end_of_turn));
    assert_eq!(tok.encode("<start_of_turn>", false).unwrap(), [tok.token_to_id("<start_of_turn>").unwrap()]);
    assert_eq!(tok.bos_token(), Some("<bos>"));
    assert_eq!(tok.eos_token(), Some("<eos>"));
    // Byte-fallback tokens give their byte.
    assert_eq!(tok.token_bytes(tok.token_to_id("<0x0A>").unwrap()), b"\n");
}

// ---------------------------------------------------------------- bad input

fn meta(entries: Vec<(&str, MetaValue)>) -> Vec<(String, MetaValue)> {
    entries.into_iter().map(|(k, v)| (k.to_string(), v)).collect()
}

fn strs(v: &[&str]) -> MetaValue {
    MetaValue::Array(MetaArray::Str(v.iter().map(|s| s.to_string()).collect()))
}

fn tiny_bpe(pre: &str) -> Vec<(String, MetaValue)> {
    meta(vec![
        ("tokenizer.ggml.model", MetaValue::Str("gpt2".into())),
        ("tokenizer.ggml.pre", MetaValue::Str(pre.into())),
        ("tokenizer.ggml.tokens", strs(&["a", "b", "ab", "Ġ", "Ġab", "<|end|>"])),
        ("tokenizer.ggml.token_type", MetaValue::Array(MetaArray::Int(vec![1, 1, 1, 1, 1, 3]))),
        ("tokenizer.ggml.merges", strs(&["a b", "Ġ ab"])),
        ("tokenizer.ggml.eos_token_id", MetaValue::U32(5)),
    ])
}

fn expect_err(result: ferrite_core::Result<Tokenizer>, needle: &str) {
    match result {
        Err(Error::Tokenizer(msg)) => assert!(msg.contains(needle), "error {msg:?} should mention {needle:?}"),
        Err(other) => panic!("expected a tokenizer error mentioning {needle:?}, got {other:?}"),
        Ok(_) => panic!("expected an error mentioning {needle:?}"),
    }
}

#[test]
fn tiny_bpe_vocab_works() {
    let tok = tokenizer_from_metadata("tiny", &tiny_bpe("gpt2")).unwrap();
    assert_eq!(tok.encode("ab ab<|end|>", true).unwrap(), [2, 4, 5]);
    assert_eq!(tok.decode(&[2, 4, 5], false), "ab ab<|end|>");
    assert_eq!(tok.decode(&[2, 4, 5], true), "ab ab");
    assert_eq!(tok.eos_ids(), [5]);
    // Unknown characters have no byte token in this vocabulary: dropped, like llama.cpp.
    assert_eq!(tok.encode("a!", false).unwrap(), [0]);
}

#[test]
fn fill_in_the_middle_tokens_by_metadata_or_name() {
    let with_tokens = |extra: &[&str]| {
        let mut m = tiny_bpe("gpt2");
        let mut tokens = vec!["a", "b", "ab", "Ġ", "Ġab", "<|end|>"];
        tokens.extend(extra);
        m.retain(|(k, _)| k != "tokenizer.ggml.tokens" && k != "tokenizer.ggml.token_type");
        m.extend(meta(vec![
            ("tokenizer.ggml.tokens", strs(&tokens)),
            ("tokenizer.ggml.token_type", MetaValue::Array(MetaArray::Int(vec![1; tokens.len()]))),
        ]));
        m
    };
    // None: no such tokens.
    assert_eq!(tokenizer_from_metadata("tiny", &tiny_bpe("gpt2")).unwrap().fim(), None);
    // By name (Code Llama's spelling); its infill's end token ends generation.
    let tok = tokenizer_from_metadata("named", &with_tokens(&["<PRE>", "<SUF>", "<MID>", "<EOT>"])).unwrap();
    let fim = tok.fim().unwrap();
    assert_eq!((fim.prefix, fim.suffix, fim.middle), (6, 7, 8));
    assert!(tok.eos_ids().contains(&9), "{:?}", tok.eos_ids());
    // The metadata's ids win over names (llama.cpp's order).
    let mut m = with_tokens(&["<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>", "x", "y", "z"]);
    m.extend(meta(vec![
        ("tokenizer.ggml.fim_pre_token_id", MetaValue::U32(9)),
        ("tokenizer.ggml.fim_suf_token_id", MetaValue::U32(10)),
        ("tokenizer.ggml.fim_mid_token_id", MetaValue::U32(11)),
    ]));
    let fim = tokenizer_from_metadata("ids", &m).unwrap().fim().cloned().unwrap();
    assert_eq!((fim.prefix, fim.suffix, fim.middle), (9, 10, 11));
}

#[test]
fn missing_tokens_array_is_an_error() {
    let mut m = tiny_bpe("gpt2");
    m.retain(|(k, _)| k != "tokenizer.ggml.tokens");
    expect_err(tokenizer_from_metadata("no-tokens", &m), "tokenizer.ggml.tokens");
}

#[test]
fn missing_model_key_is_an_error() {
    let mut m = tiny_bpe("gpt2");
    m.retain(|(k, _)| k != "tokenizer.ggml.model");
    expect_err(tokenizer_from_metadata("no-model", &m), "tokenizer.ggml.model");
}

#[test]
fn unknown_pre_tokenizer_is_an_error_naming_it() {
    expect_err(tokenizer_from_metadata("bad-pre", &tiny_bpe("martian-bpe")), "'martian-bpe'");
}

#[test]
fn missing_merges_is_an_error() {
    let mut m = tiny_bpe("gpt2");
    m.retain(|(k, _)| k != "tokenizer.ggml.merges");
    expect_err(tokenizer_from_metadata("no-merges", &m), "merges");
}

#[test]
fn short_token_type_array_is_an_error() {
    let mut m = tiny_bpe("gpt2");
    for (k, v) in &mut m {
        if k == "tokenizer.ggml.token_type" {
            *v = MetaValue::Array(MetaArray::Int(vec![1, 1]));
        }
    }
    expect_err(tokenizer_from_metadata("short-types", &m), "token_type");
}

#[test]
fn duplicate_tokens_are_an_error() {
    let mut m = tiny_bpe("gpt2");
    for (k, v) in &mut m {
        if k == "tokenizer.ggml.tokens" {
            *v = strs(&["a", "b", "ab", "Ġ", "a", "<|end|>"]);
        }
    }
    expect_err(tokenizer_from_metadata("dup", &m), "duplicate");
}

#[test]
fn unsupported_model_type_is_an_error() {
    let mut m = tiny_bpe("gpt2");
    m[0].1 = MetaValue::Str("bert".into());
    expect_err(tokenizer_from_metadata("bert", &m), "'bert'");
}

#[test]
fn tokens_of_the_wrong_type_are_an_error() {
    let mut m = tiny_bpe("gpt2");
    for (k, v) in &mut m {
        if k == "tokenizer.ggml.tokens" {
            *v = MetaValue::Array(MetaArray::Int(vec![1, 2, 3]));
        }
    }
    expect_err(tokenizer_from_metadata("int-tokens", &m), "tokenizer.ggml.tokens");
}

#[test]
fn hf_dir_without_tokenizer_json_is_an_error() {
    let dir = std::env::temp_dir().join(format!("ferrite-tok-empty-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let result = Tokenizer::from_hf_dir(&dir);
    let _ = std::fs::remove_dir(&dir);
    expect_err(result, "tokenizer.json");
}

#[test]
fn long_inputs_encode_in_linearithmic_time() {
    // A quadratic algorithm would take minutes here; ours takes well under a second.
    let unit = "The quick brown fox, naïve café 日本語 😀 1234567!\n    indented\tcode();<|im_end|> ";
    let text = unit.repeat(3000);
    for name in ["smollm2.gguf", "gemma3-270m.gguf"] {
        let tok = Tokenizer::from_gguf(&GgufFile::open(&model(name)).unwrap()).unwrap();
        let start = Instant::now();
        let ids = tok.encode(&text, false).unwrap();
        let took = start.elapsed();
        eprintln!("{name}: {} bytes -> {} tokens in {took:?}", text.len(), ids.len());
        assert!(took.as_secs() < 20, "{name}: encoding {} bytes took {took:?}", text.len());
        assert_eq!(tok.decode(&ids, false), text);
    }
}

#[test]
fn hf_configs_give_bos_eos_and_generation_eos_list() {
    let dir = std::env::temp_dir().join(format!("ferrite-tok-hfcfg-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::copy(model("all-minilm-l6-v2").join("tokenizer.json"), dir.join("tokenizer.json")).unwrap();
    let config = r#"{"bos_token": "[CLS]", "eos_token": {"content": "[SEP]", "special": true},
                     "add_bos_token": true, "add_eos_token": true}"#;
    std::fs::write(dir.join("tokenizer_config.json"), config).unwrap();
    std::fs::write(dir.join("generation_config.json"), r#"{"eos_token_id": [103, 102]}"#).unwrap();
    let tok = Tokenizer::from_hf_dir(&dir);
    let _ = std::fs::remove_dir_all(&dir);
    let tok = tok.unwrap();
    assert_eq!(tok.bos_id(), Some(101));
    assert_eq!(tok.bos_token(), Some("[CLS]"));
    assert_eq!(tok.eos_token(), Some("[SEP]"));
    assert_eq!(tok.eos_ids(), [102, 103]);
    // The post-processor already adds [CLS] ... [SEP]; the config must not add them twice.
    let ids = tok.encode("hello", true).unwrap();
    assert_eq!(ids.iter().filter(|&&id| id == 101).count(), 1, "{ids:?}");
    assert_eq!(ids.iter().filter(|&&id| id == 102).count(), 1, "{ids:?}");
}
