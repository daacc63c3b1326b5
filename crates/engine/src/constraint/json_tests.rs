//! Tests for the JSON constraint: the automaton against hand-written and
//! randomly generated documents (checked with serde_json), the trie walk
//! against per-token simulation, random sampling walks, and mask() timing.

use super::super::format::{Constraint, OutputFormat};
use super::*;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

/// A small deterministic PRNG (splitmix64), so tests need no extra crates.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }

    fn chance(&mut self, one_in: usize) -> bool {
        self.below(one_in) == 0
    }

    fn pick<T: Copy>(&mut self, items: &[T]) -> T {
        items[self.below(items.len())]
    }
}

/// Feeds `bytes` one at a time; `Err(i)` if byte `i` is rejected.
fn feed(state: State, bytes: &[u8]) -> Result<State, usize> {
    bytes.iter().enumerate().try_fold(state, |s, (i, &b)| s.step(b).ok_or(i))
}

/// Whether serde_json reads `bytes` as one object. serde_json limits numbers
/// to f64's range and JSON does not, so for that error only the syntax is
/// checked (raw UTF-8 validity separately, as `IgnoredAny` skips strings).
fn is_object(bytes: &[u8]) -> bool {
    match serde_json::from_slice::<serde_json::Value>(bytes) {
        Ok(v) => v.is_object(),
        Err(e) if e.to_string().starts_with("number out of range") => {
            std::str::from_utf8(bytes).is_ok()
                && serde_json::from_slice::<serde::de::IgnoredAny>(bytes).is_ok()
                && bytes.trim_ascii_start().starts_with(b"{")
        }
        Err(_) => false,
    }
}

/// Bytes that finish any accepted state: each step takes the first of a few
/// preferred bytes that the automaton accepts (these close strings, values
/// and containers as soon as possible), else the lowest accepted byte.
fn completion(mut s: State) -> Vec<u8> {
    let mut out = Vec::new();
    while s.mode != Mode::Done {
        let preferred: &[u8] = if matches!(s.mode, Mode::Str { .. }) { b"\"0dc\\u" } else { b"}]\":0{" };
        let b = preferred.iter().copied().chain(0..=255).find(|&b| s.step(b).is_some());
        let b = b.unwrap_or_else(|| panic!("dead state {s:?}"));
        s = s.step(b).unwrap();
        out.push(b);
        assert!(out.len() < 10_000, "completion does not terminate from {s:?}");
    }
    out
}

/// Valid documents covering the grammar (each within the whitespace and depth limits).
const VALID: &[&str] = &[
    "{}",
    "  {}",
    "{ }",
    "{\"a\":1}",
    "{\"a\": [1, -2, 3.5, -0.25e-3, 0, 0e0, 1E+9, 10, -0]}",
    "{\"t\":true,\"f\":false,\"n\":null}",
    "{\"nested\":{\"x\":[[],[{}],{\"y\":[null]}]}}",
    "{\n  \"k\": \"v\",\n  \"list\": [\n    1,\n    2\n  ]\n}",
    "{\"esc\":\"\\\" \\\\ \\/ \\b \\f \\n \\r \\t \\u00e9 \\u0000 \\uD83D\\uDE00 \\uffff\"}",
    "{\"utf8\":\"héllo €uro 😀 \u{7f} \u{10ffff} \u{800} \u{fffd}\"}",
    "{\"\":\"\"}",
    "{\"a\":{\"b\":{\"c\":{\"d\":[1,[2,[3]]]}}}}",
    "{\"n\":123456789012345678901234567890}",
    "{\"a\":1 ,\"b\" : 2\t}",
    "{\"a\":[1 ]}",
];

/// Invalid documents and the index of the first byte that must be rejected.
const INVALID: &[(&[u8], usize)] = &[
    (b"[]", 0),
    (b"\"a\"", 0),
    (b"1", 0),
    (b"{]", 1),
    (b"{\"a\"}", 4),
    (b"{\"a\":}", 5),
    (b"{\"a\":1,}", 7),
    (b"{\"a\":[1,]}", 8),
    (b"{\"a\":[1}", 7),
    (b"{\"a\":{]}", 6),
    (b"{a:1}", 1),
    (b"{'a':1}", 1),
    (b"{\"a\":01}", 6),
    (b"{\"a\":-}", 6),
    (b"{\"a\":1.}", 7),
    (b"{\"a\":.5}", 5),
    (b"{\"a\":1e}", 7),
    (b"{\"a\":1e+}", 8),
    (b"{\"a\":+1}", 5),
    (b"{\"a\":--1}", 6),
    (b"{\"a\":1.2.3}", 8),
    (b"{\"a\":tru}", 8),
    (b"{\"a\":True}", 5),
    (b"{\"a\":nul1}", 8),
    (b"{\"a\":1}}", 7),
    (b"{} ", 2),
    (b"{}x", 2),
    (b"{\"a\nb\":1}", 3),
    (b"{\"a\":\"\x01\"}", 6),
    (b"{\"a\":\"\\x\"}", 7),
    (b"{\"a\":\"\\u12g4\"}", 10),
    (b"{\"a\":\"\\uDC00\"}", 9),
    (b"{\"a\":\"\\uD800\"}", 12),
    (b"{\"a\":\"\\uD800\\n\"}", 13),
    (b"{\"a\":\"\\uD800\\uD800\"}", 15),
    (b"{\"a\":\"\\uD800\\u0041\"}", 14),
    (b"{\"a\":\"\x80\"}", 6),
    (b"{\"a\":\"\xc0\xaf\"}", 6),
    (b"{\"a\":\"\xc3\"}", 7),
    (b"{\"a\":\"\xe0\x80\x80\"}", 7),
    (b"{\"a\":\"\xed\xa0\x80\"}", 7),
    (b"{\"a\":\"\xf0\x80\x80\x80\"}", 7),
    (b"{\"a\":\"\xf4\x90\x80\x80\"}", 7),
    (b"{\"a\":\"\xf5\x80\"}", 6),
    (b"{\"a\":\"\xe2\x82\"}", 8),
    (b"{\"a\":\"\xff\"}", 6),
];

#[test]
fn constraint_valid_documents_accepted_bytewise() {
    for doc in VALID {
        assert!(is_object(doc.as_bytes()), "test document is not JSON: {doc}");
        let s = feed(State::START, doc.as_bytes()).unwrap_or_else(|i| panic!("{doc:?} rejected at {i}"));
        assert_eq!(s.mode, Mode::Done, "{doc:?} incomplete");
        // Every proper prefix is incomplete (the object closes only at the end).
        for end in 0..doc.len() {
            assert_ne!(feed(State::START, &doc.as_bytes()[..end]).unwrap().mode, Mode::Done);
        }
    }
}

#[test]
fn constraint_invalid_documents_rejected_at_first_bad_byte() {
    for &(doc, at) in INVALID {
        assert!(!is_object(doc) || doc.ends_with(b" "), "test document is valid JSON: {doc:?}");
        assert_eq!(feed(State::START, doc), Err(at), "{:?}", String::from_utf8_lossy(doc));
        // The accepted prefix can still be completed into a valid object.
        let s = feed(State::START, &doc[..at]).unwrap();
        let mut done = doc[..at].to_vec();
        done.extend(completion(s));
        assert!(is_object(&done), "{:?}", String::from_utf8_lossy(&done));
    }
}

#[test]
fn constraint_whitespace_runs_capped() {
    let n = MAX_WS_RUN as usize;
    let ws = |k: usize| " \n\t\r".bytes().cycle().take(k).collect::<Vec<u8>>();
    // Before the top-level `{`.
    assert!(feed(State::START, &[ws(n), b"{}".to_vec()].concat()).is_ok());
    assert_eq!(feed(State::START, &ws(n + 1)), Err(n));
    // Between tokens, including after a number; a non-space byte resets the run.
    let ok =
        [b"{".to_vec(), ws(n), b"\"a\"".to_vec(), ws(n), b":".to_vec(), ws(n), b"1".to_vec(), ws(n), b"}".to_vec()];
    assert_eq!(feed(State::START, &ok.concat()).unwrap().mode, Mode::Done);
    let bad = [b"{\"a\":1".to_vec(), ws(n + 1)].concat();
    assert_eq!(feed(State::START, &bad), Err(bad.len() - 1));
    // Inside strings whitespace is content, not limited.
    let long = [b"{\"a\":\"".to_vec(), vec![b' '; 100], b"\"}".to_vec()].concat();
    assert_eq!(feed(State::START, &long).unwrap().mode, Mode::Done);
    // Nothing after the object, not even whitespace.
    assert_eq!(feed(State::START, b"{}\n"), Err(2));
}

#[test]
fn constraint_depth_capped() {
    let d = MAX_DEPTH as usize;
    let deep = format!("{{\"a\":{}1{}}}", "[".repeat(d - 1), "]".repeat(d - 1));
    assert_eq!(feed(State::START, deep.as_bytes()).unwrap().mode, Mode::Done);
    assert!(is_object(deep.as_bytes()));
    let deeper = format!("{{\"a\":{}", "[".repeat(d));
    assert_eq!(feed(State::START, deeper.as_bytes()), Err(deeper.len() - 1));
    // Mixed containers pop in the right order at full depth.
    let mixed = format!("{}{}", "{\"a\":[".repeat(d / 2), "]}".repeat(d / 2));
    assert_eq!(feed(State::START, mixed.as_bytes()).unwrap().mode, Mode::Done);
}

/// A vocabulary of every single byte (ids 0..256) plus `extra` tokens, then
/// an EOS id and a special token with no bytes.
fn vocab_with(extra: &[Vec<u8>]) -> (Arc<JsonVocab>, u32, u32) {
    let mut bytes: Vec<Vec<u8>> = (0..=255u8).map(|b| vec![b]).collect();
    bytes.extend(extra.iter().cloned());
    let eos = bytes.len() as u32;
    bytes.push(b"</s>".to_vec()); // an EOS with literal text is still only EOS
    let special = bytes.len() as u32;
    bytes.push(Vec::new());
    (Arc::new(JsonVocab::new(bytes, &[eos])), eos, special)
}

/// Random valid JSON text, exercising escapes, UTF-8, numbers and whitespace
/// within the limits.
struct Gen<'a> {
    rng: &'a mut Rng,
    out: String,
}

impl Gen<'_> {
    fn ws(&mut self) {
        if self.rng.chance(3) {
            let n = self.rng.below(MAX_WS_RUN as usize + 1);
            for _ in 0..n {
                self.out.push(self.rng.pick(&[' ', '\n', '\t', '\r']));
            }
        }
    }

    fn string(&mut self) {
        self.out.push('"');
        for _ in 0..self.rng.below(8) {
            match self.rng.below(10) {
                0 => {
                    let e = self.rng.pick(&["\\\"", "\\\\", "\\/", "\\b", "\\f", "\\n", "\\r", "\\t"]);
                    self.out.push_str(e);
                }
                1 => {
                    let c = self.rng.pick(&[0x0041u32, 0x00e9, 0x20ac, 0xfffd, 0x0000, 0xd7ff, 0xe000]);
                    self.out.push_str(&format!("\\u{c:04x}"));
                }
                2 => {
                    let (hi, lo) = (0xd800 + self.rng.below(0x400), 0xdc00 + self.rng.below(0x400));
                    self.out.push_str(&format!("\\u{hi:04X}\\u{lo:04x}"));
                }
                3 => self.out.push(self.rng.pick(&['é', '€', '😀', '中', '\u{7f}', '\u{80}', '\u{10ffff}'])),
                _ => self.out.push(self.rng.pick(&['a', 'b', 'z', ' ', '0', '{', '}', '[', ']', ':', ',', '\''])),
            }
        }
        self.out.push('"');
    }

    fn number(&mut self) {
        if self.rng.chance(3) {
            self.out.push('-');
        }
        if self.rng.chance(3) {
            self.out.push('0');
        } else {
            self.out.push_str(&(1 + self.rng.below(100_000)).to_string());
        }
        if self.rng.chance(2) {
            self.out.push_str(&format!(".{}", self.rng.below(1000)));
        }
        if self.rng.chance(3) {
            self.out.push_str(self.rng.pick(&["e", "E"]));
            self.out.push_str(self.rng.pick(&["", "+", "-"]));
            self.out.push_str(&self.rng.below(300).to_string());
        }
    }

    fn value(&mut self, depth: usize) {
        match self.rng.below(if depth < 5 { 8 } else { 6 }) {
            0 | 1 => self.string(),
            2 | 3 => self.number(),
            4 => self.out.push_str(["true", "false", "null"][self.rng.below(3)]),
            5 => self.out.push_str(["[]", "{}"][self.rng.below(2)]),
            6 => self.array(depth + 1),
            _ => self.object(depth + 1),
        }
    }

    fn array(&mut self, depth: usize) {
        self.out.push('[');
        for i in 0..self.rng.below(4) {
            if i > 0 {
                self.out.push(',');
            }
            self.ws();
            self.value(depth);
            self.ws();
        }
        self.out.push(']');
    }

    fn object(&mut self, depth: usize) {
        self.out.push('{');
        for i in 0..self.rng.below(4) {
            if i > 0 {
                self.out.push(',');
            }
            self.ws();
            self.string();
            self.ws();
            self.out.push(':');
            self.ws();
            self.value(depth);
            self.ws();
        }
        if self.out.ends_with('{') {
            self.ws();
        }
        self.out.push('}');
    }

    fn document(rng: &mut Rng) -> String {
        let mut g = Gen { rng, out: String::new() };
        g.ws();
        g.object(1);
        g.out
    }
}

#[test]
fn constraint_generated_documents_accepted_with_random_tokenizations() {
    let mut rng = Rng(1);
    let docs: Vec<String> = (0..300).map(|_| Gen::document(&mut rng)).collect();
    // Extra tokens: random substrings of the documents, which often split
    // multi-byte characters and escapes.
    let mut extra = Vec::new();
    for d in &docs {
        let b = d.as_bytes();
        for _ in 0..20 {
            let start = rng.below(b.len());
            let len = 2 + rng.below(6);
            extra.push(b[start..(start + len).min(b.len())].to_vec());
        }
    }
    let (vocab, eos, special) = vocab_with(&extra);
    let ids: HashMap<&[u8], u32> = vocab.token_bytes.iter().enumerate().map(|(i, b)| (&b[..], i as u32)).collect();
    for doc in &docs {
        assert!(is_object(doc.as_bytes()), "generator made invalid JSON: {doc}");
        for _ in 0..3 {
            let mut c = Constraint::new(vocab.clone(), &OutputFormat::Object);
            let mut rest = doc.as_bytes();
            while !rest.is_empty() {
                assert!(!c.is_complete());
                assert!(!c.advance(eos) && !c.advance(special));
                // The longest prefix of `rest` (up to a random length) that is a token.
                let max = (1 + rng.below(7)).min(rest.len());
                let len = (1..=max).rev().find(|&l| ids.contains_key(&rest[..l])).unwrap();
                assert!(c.advance(ids[&rest[..len]]), "{doc:?} rejected at {:?}", String::from_utf8_lossy(rest));
                rest = &rest[len..];
            }
            assert!(c.is_complete(), "{doc:?}");
            let before = c.object_state();
            assert!(!c.advance(b'}' as u32) && !c.advance(b' ' as u32) && c.object_state() == before);
            assert!(c.advance(eos));
        }
    }
}

#[test]
fn constraint_agrees_with_serde_json_on_mutated_documents() {
    let mut rng = Rng(2);
    let alphabet = b"{}[]\":,0123456789-+.eEtrufalsn \n\\u\x01\x7f\x80\xc3\xa9\xed\xf0\xff";
    let mut completed = 0;
    for _ in 0..20_000 {
        let mut doc = Gen::document(&mut rng).into_bytes();
        for _ in 0..1 + rng.below(3) {
            let at = rng.below(doc.len() + 1);
            let b = rng.pick(alphabet);
            match rng.below(3) {
                0 if at < doc.len() => doc[at] = b,
                1 if at < doc.len() => {
                    doc.remove(at);
                }
                _ => doc.insert(at, b),
            }
        }
        let serde_ok = is_object(&doc);
        match feed(State::START, &doc) {
            Ok(s) if s.mode == Mode::Done => {
                assert!(serde_ok, "accepted, but serde_json rejects {:?}", String::from_utf8_lossy(&doc));
                completed += 1;
            }
            result => {
                // Where serde_json accepts, only our extra limits may reject
                // (the generator stays within the depth limit).
                let ws_run = doc.split(|b| !b" \n\t\r".contains(b)).any(|run| run.len() > MAX_WS_RUN as usize);
                let trailing_ws = doc.last().is_some_and(|b| b" \n\t\r".contains(b));
                assert!(!serde_ok || ws_run || trailing_ws, "rejected valid {:?}", String::from_utf8_lossy(&doc));
                // Whatever prefix was accepted still completes to a valid object.
                let at = result.err().unwrap_or(doc.len());
                let s = feed(State::START, &doc[..at]).unwrap();
                let mut done = doc[..at].to_vec();
                done.extend(completion(s));
                assert!(is_object(&done), "{:?}", String::from_utf8_lossy(&done));
            }
        }
    }
    assert!(completed > 1000, "too few mutants stayed valid: {completed}");
}

#[test]
fn constraint_utf8_split_across_tokens() {
    let extra: Vec<Vec<u8>> = vec![
        b"{\"a\":\"".to_vec(),
        b"\xe2\x82".to_vec(), // first two bytes of €
        b"\xac\"}".to_vec(),  // its last byte, then close
        b"\xf0\x9f".to_vec(), // half of 😀
        b"\x98".to_vec(),
        b"\x80x".to_vec(),
        b"\xc3".to_vec(),
        b"\xa9".to_vec(),
        b"\xed\xa0".to_vec(), // would start a UTF-16 surrogate: invalid
        b"\xe0\x9f".to_vec(), // overlong: invalid
    ];
    let (vocab, _, _) = vocab_with(&extra);
    let id = |b: &[u8]| vocab.token_bytes.iter().position(|t| t == b).unwrap() as u32;
    let mut c = Constraint::new(vocab.clone(), &OutputFormat::Object);
    for tok in [&b"{\"a\":\""[..], b"\xe2\x82", b"\xac\"}"] {
        assert!(c.advance(id(tok)));
    }
    assert!(c.is_complete());

    let mut c = Constraint::new(vocab.clone(), &OutputFormat::Object);
    assert!(c.advance(id(b"{\"a\":\"")));
    assert!(!c.advance(id(b"\xed\xa0")) && !c.advance(id(b"\xe0\x9f")) && !c.advance(id(b"\x98")));
    assert!(c.advance(id(b"\xf0\x9f")));
    // Mid-character only continuation bytes fit: not `"`, ASCII or a new lead.
    let mut logits = vec![0.0; vocab.token_bytes.len()];
    c.mask(&mut logits);
    let allowed: Vec<&[u8]> =
        (0..logits.len()).filter(|&i| logits[i] == 0.0).map(|i| &vocab.token_bytes[i][..]).collect();
    assert!(allowed.iter().all(|t| (0x80..=0xbf).contains(&t[0])), "{allowed:?}");
    assert!(allowed.contains(&&b"\x98"[..]) && !allowed.contains(&&b"\x80x"[..]));
    assert!(c.advance(id(b"\x98")) && c.advance(id(b"\x80x")));
    assert!(c.advance(id(b"\xc3")) && !c.advance(b'"' as u32) && c.advance(id(b"\xa9")));
    assert!(c.advance(b'"' as u32) && c.advance(b'}' as u32) && c.is_complete());
}

/// Small JSON-flavoured tokens for the synthetic vocabularies.
const PIECES: &[&str] = &[
    "{", "}", "[", "]", ":", ",", "\"", "{\"", "\":", "\",", "\":\"", "\"}", "},", "}}", "]}", "],", "[{", "[[", " {",
    " [", " \"", ": ", ", ", "\n", "\n ", "\n  ", "\n    ", "  ", "    ", "\t", "\r\n", "true", "false", "null",
    " true", "tr", "ue", "fal", "se", "nu", "ll", "0", "1", "12", "123", "-", "-1", ".", ".5", "e", "E", "e-", "e+",
    "1e", "0.", "00", "\\", "\\\"", "\\n", "\\u", "\\u00", "D83D", "\\uD83D", "\\uDE00", "DE00", "00e9", "é", "€",
    "😀", "\u{a0}", "\x01", "name", " name", "value", "\"name", "id", "\"id\":", " the", " of", "json", "x", "abc",
    "\u{7f}",
];

/// About `target` realistic tokens: all single bytes, all printable ASCII
/// pairs, JSON pieces, then pseudo-words with and without a leading space,
/// quote or newline.
fn synthetic_vocab(target: usize, rng: &mut Rng) -> Vec<Vec<u8>> {
    let mut v: Vec<Vec<u8>> = (0..=255u8).map(|b| vec![b]).collect();
    for a in 0x20..0x7f {
        for b in 0x20..0x7f {
            v.push(vec![a, b]);
        }
    }
    v.extend(PIECES.iter().map(|p| p.as_bytes().to_vec()));
    let letters = b"etaoinshrdlucmfwypvbgkjqxz";
    while v.len() < target {
        let mut w: Vec<u8> = match rng.below(6) {
            0 | 1 => b" ".to_vec(),
            2 => b"\"".to_vec(),
            3 => b"\n".to_vec(),
            _ => Vec::new(),
        };
        for _ in 0..2 + rng.below(9) {
            w.push(letters[rng.below(letters.len()).min(rng.below(letters.len()))]);
        }
        if rng.chance(8) {
            let suffixes: [&[u8]; 7] = [b"\":", b"\",", b"\"", b"ing", b"123", b"(", b"\xc3\xa9"];
            w.extend_from_slice(rng.pick(&suffixes));
        }
        v.push(w);
    }
    v
}

/// Random walk: picks uniformly among unmasked tokens for `wander` steps,
/// then (to finish) prefers single-byte tokens in [`completion`]'s order.
/// Returns the output, or panics if the walk gets stuck or never completes.
fn random_walk(vocab: &Arc<JsonVocab>, eos: u32, rng: &mut Rng, wander: usize) -> Vec<u8> {
    let single: HashMap<u8, u32> =
        vocab.token_bytes.iter().enumerate().filter(|(_, b)| b.len() == 1).map(|(i, b)| (b[0], i as u32)).collect();
    let mut c = Constraint::new(vocab.clone(), &OutputFormat::Object);
    let mut out = Vec::new();
    let mut logits = vec![0.0f32; vocab.token_bytes.len() + 3];
    for step in 0..wander + 10_000 {
        logits.fill(0.0);
        c.mask(&mut logits);
        let allowed: Vec<u32> = (0..logits.len() as u32).filter(|&i| logits[i as usize] == 0.0).collect();
        assert!(!allowed.is_empty(), "no token allowed after {:?}", String::from_utf8_lossy(&out));
        if c.is_complete() {
            assert!(allowed.contains(&eos) && allowed.iter().all(|&t| vocab.is_eos(t)), "{allowed:?}");
            return out;
        }
        let tok = if step < wander {
            rng.pick(&allowed)
        } else {
            let next = completion(c.object_state())[0];
            single.get(&next).copied().filter(|t| allowed.contains(t)).unwrap_or_else(|| rng.pick(&allowed))
        };
        assert!(c.advance(tok));
        out.extend_from_slice(&vocab.token_bytes[tok as usize]);
    }
    panic!("walk did not complete: {:?}", String::from_utf8_lossy(&out));
}

#[test]
fn constraint_random_walks_complete_and_parse() {
    let mut rng = Rng(3);
    let mut bytes = synthetic_vocab(3000, &mut rng);
    let eos = bytes.len() as u32;
    bytes.push(Vec::new());
    let vocab = Arc::new(JsonVocab::new(bytes, &[eos]));
    for i in 0..200 {
        let out = random_walk(&vocab, eos, &mut rng, i * 3);
        assert!(is_object(&out), "{:?}", String::from_utf8_lossy(&out));
    }
}

#[test]
fn constraint_mask_matches_per_token_simulation() {
    let mut rng = Rng(4);
    let mut bytes = synthetic_vocab(2000, &mut rng);
    // Random byte soup, often splitting, misordering or breaking UTF-8 and escapes.
    let soup = b"ab 1\"\\uD8C0e{}[]:,\x80\x8f\x9f\xa0\xbf\xc3\xe0\xe2\xed\xef\xf0\xf4";
    for _ in 0..1000 {
        let len = 1 + rng.below(6);
        bytes.push((0..len).map(|_| rng.pick(soup)).collect());
    }
    bytes.push(Vec::new()); // special
    let eos = [bytes.len() as u32, bytes.len() as u32 + 5]; // one EOS beyond the token list
    bytes.push(Vec::new());
    let vocab = Arc::new(JsonVocab::new(bytes, &eos));
    let n = vocab.token_bytes.len();
    let mut states = 0;
    for _ in 0..60 {
        let mut c = Constraint::new(vocab.clone(), &OutputFormat::Object);
        for _ in 0..rng.below(120) + 1 {
            // Logits shorter and longer than the vocabulary.
            let len = rng.pick(&[n, n + 10, n / 2, 100]);
            let mut logits = vec![1.0f32; len];
            c.mask(&mut logits);
            states += 1;
            for (id, &l) in logits.iter().enumerate() {
                let mut sim = c.clone();
                let ok = sim.advance(id as u32);
                assert_eq!(l == 1.0, ok, "token {id} {:?} in {:?}", vocab.token_bytes.get(id), c.object_state());
                assert!(ok || sim.object_state() == c.object_state());
            }
            if c.is_complete() {
                break;
            }
            let mut logits = vec![0.0f32; n];
            c.mask(&mut logits);
            let allowed: Vec<usize> = (0..n).filter(|&i| logits[i] == 0.0).collect();
            assert!(c.advance(rng.pick(&allowed) as u32));
        }
    }
    assert!(states > 1000);
}

/// Median time of `mask()` over a few states reached by feeding `prefix`es.
fn time_masks(name: &str, vocab: &Arc<JsonVocab>, prefixes: &[&[u8]]) {
    let mut logits = vec![0.0f32; vocab.token_bytes.len()];
    for prefix in prefixes {
        let mut c = Constraint::new(vocab.clone(), &OutputFormat::Object);
        c.set_object_state(feed(State::START, prefix).unwrap());
        let median = super::super::median_mask_ms(&c, &mut logits, 21);
        let allowed = logits.iter().filter(|&&l| l == 0.0).count();
        println!(
            "{name}: mask() after {:<16} {median:.3} ms median ({allowed} allowed)",
            format!("{:?}", String::from_utf8_lossy(prefix)),
        );
    }
}

const TIMING_PREFIXES: &[&[u8]] =
    &[b"", b"{", b"{\"a\":", b"{\"a\":\"text ", b"{\"a\":[1", b"{\"a\":{\"b\":[true,", b"{\"a\":\"\xe2"];

#[test]
fn constraint_mask_timing_synthetic() {
    let mut bytes = synthetic_vocab(49_152, &mut Rng(5));
    let eos = bytes.len() as u32;
    bytes.push(Vec::new());
    let t = Instant::now();
    let vocab = Arc::new(JsonVocab::new(bytes, &[eos]));
    println!("synthetic: JsonVocab::new {:.1} ms, {vocab:?}", t.elapsed().as_secs_f64() * 1e3);
    time_masks("synthetic", &vocab, TIMING_PREFIXES);
}

/// With the real SmolLM2 tokenizer, when the model file is present: timing,
/// and random walks through the real vocabulary.
#[test]
fn constraint_real_tokenizer() {
    let Some(tok) = super::super::smollm2_tokenizer() else { return };
    let bytes: Vec<Vec<u8>> = (0..tok.vocab_size() as u32)
        .map(|id| if tok.is_special(id) { Vec::new() } else { tok.token_bytes(id) })
        .collect();
    let t = Instant::now();
    let vocab = Arc::new(JsonVocab::new(bytes, tok.eos_ids()));
    println!("smollm2: JsonVocab::new {:.1} ms, {vocab:?}", t.elapsed().as_secs_f64() * 1e3);
    time_masks("smollm2", &vocab, TIMING_PREFIXES);
    let mut rng = Rng(6);
    for i in 0..10 {
        let out = random_walk(&vocab, tok.eos_ids()[0], &mut rng, i * 20);
        assert!(is_object(&out), "{:?}", String::from_utf8_lossy(&out));
    }
}
