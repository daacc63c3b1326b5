//! Runs of free text through the vocabulary walk: the masks of grammars
//! with runs (GBNF classes under a repetition, a regex's `.*`) allow
//! exactly the tokens whose bytes step one by one, over a vocabulary of
//! quotes, escapes, DEL, whole and partial multi-byte characters and stray
//! bytes; and the runs are found where they should be.

use std::sync::Arc;

use super::super::format::{Constraint, OutputFormat};
use super::super::gbnf_run::Gbnf;
use super::super::json::JsonVocab;
use super::super::pattern::{Pattern, PatternUse};
use super::super::trie::Grammar;
use super::*;

/// llama.cpp's JSON grammar (its `json.gbnf`, numbers shortened).
const JSON_GBNF: &str = r#"
root   ::= object
value  ::= object | array | string | number | ("true" | "false" | "null") ws
object ::= "{" ws ( string ":" ws value ("," ws string ":" ws value)* )? "}" ws
array  ::= "[" ws ( value ("," ws value)* )? "]" ws
string ::= "\"" ( [^"\\\x7F\x00-\x1F] | "\\" (["\\bfnrt] | "u" [0-9a-fA-F]{4}) )* "\"" ws
number ::= ("-"? ([0-9] | [1-9] [0-9]{0,15})) ("." [0-9]+)? ws
ws ::= | " " | "\n" [ \t]{0,20}
"#;

/// Tokens of the soup's pieces, one to four each, plus every single byte.
fn vocabulary(next: &mut impl FnMut(usize) -> usize) -> (Arc<JsonVocab>, u32) {
    let pieces: [&[u8]; 24] = [
        b"a",
        b"b",
        b"q",
        b" ",
        b"\"",
        b"\\",
        b"n",
        b"u",
        b"0",
        b"7",
        b"{",
        b"}",
        b":",
        b",",
        b"<",
        b">",
        b"\n",
        b"\x7f",
        "é".as_bytes(),
        "🦀".as_bytes(),
        b"\xc3",
        b"\xf0\x9f",
        b"\xa9",
        b"\xff",
    ];
    let mut bytes: Vec<Vec<u8>> = (0..=255u8).map(|b| vec![b]).collect();
    for _ in 0..3000 {
        bytes.push((0..1 + next(4)).flat_map(|_| pieces[next(pieces.len())].to_vec()).collect());
    }
    let eos = bytes.len() as u32;
    bytes.push(Vec::new());
    (Arc::new(JsonVocab::new(bytes, &[eos])), eos)
}

/// Samples from `format`'s masks, checking each against stepping every
/// token on a copy, until the end of generation or `most` tokens; returns
/// the output. `prefer` is picked first where the mask allows it.
fn sample_checked(vocab: &Arc<JsonVocab>, eos: u32, format: &OutputFormat, prefer: &[u8], most: usize) -> Vec<u8> {
    let mut next = super::super::picker(0x0123_4567 ^ most as u64);
    let n = vocab.token_bytes.len();
    let mut c = Constraint::new(vocab.clone(), format);
    let mut out = Vec::new();
    for _ in 0..most {
        let mut allowed = super::super::checked_mask(&c, n, &out);
        allowed.retain(|&i| i != eos as usize);
        let preferred: Vec<usize> =
            allowed.iter().copied().filter(|&i| vocab.token_bytes[i].iter().all(|b| prefer.contains(b))).collect();
        let pool = if !preferred.is_empty() && next(3) != 0 { &preferred } else { &allowed };
        if pool.is_empty() {
            break;
        }
        let id = pool[next(pool.len())];
        assert!(c.advance(id as u32));
        out.extend_from_slice(&vocab.token_bytes[id]);
    }
    out
}

#[test]
fn masks_with_runs_match_stepping_each_token() {
    let (vocab, eos) = vocabulary(&mut super::super::picker(0xabc));
    let formats = [
        (OutputFormat::grammar(JSON_GBNF).unwrap(), &b"{\"ab q\\n\x7f\xc3\xa9"[..]),
        (OutputFormat::grammar("root ::= (\"<\" [^>]* \">\")+").unwrap(), &b"<ab >\xc3\xa9"[..]),
        // Non-ASCII characters in part: the run is its ASCII bytes only.
        (OutputFormat::grammar("root ::= [a-z é]* \".\"").unwrap(), &b"ab \xc3\xa9"[..]),
        (OutputFormat::regex("Answer: .*").unwrap(), &b"Answer: bq\xf0\x9f\xa6\x80"[..]),
        (OutputFormat::regex("(<[^>\\n]*>)+").unwrap(), &b"<ab \xc3\xa9>"[..]),
    ];
    for (format, prefer) in &formats {
        sample_checked(&vocab, eos, format, prefer, 40);
    }
}

/// A grammar of many runs, more sets than the trie keeps: masks still
/// match stepping (sets met deeper than a walk's start are used only where
/// kept).
#[test]
fn many_runs_past_the_kept_sets() {
    let mut next = super::super::picker(0x5e75);
    let letters = b"abcdefghijklmnopqrst";
    let mut bytes: Vec<Vec<u8>> = (0..=255u8).map(|b| vec![b]).collect();
    for _ in 0..3000 {
        let (a, b) = (letters[next(letters.len())], letters[next(letters.len())]);
        bytes.push([vec![a; 1 + next(4)], vec![b; next(3)]].concat());
    }
    let eos = bytes.len() as u32;
    bytes.push(Vec::new());
    let vocab = Arc::new(JsonVocab::new(bytes, &[eos]));
    let runs: Vec<String> = letters.iter().map(|&c| format!("{}+", c as char)).collect();
    let regex = OutputFormat::regex(&format!("({})*", runs.join("|"))).unwrap();
    let rules: Vec<String> = letters.iter().map(|&c| format!("\"{0}\" [{0}]*", c as char)).collect();
    let gbnf = OutputFormat::grammar(&format!("root ::= ({})*", rules.join(" | "))).unwrap();
    for format in [regex, gbnf] {
        sample_checked(&vocab, eos, &format, letters, 60);
    }
}

/// The state `text` leaves `g` in.
fn after<G: Grammar>(g: &G, start: G::State, text: &[u8]) -> G::State {
    text.iter().try_fold(start, |s, &b| g.step(s, b)).unwrap()
}

/// The characters of a set, as ASCII bytes.
fn ascii_of(chars: CharSet) -> Vec<u8> {
    (0..0x80u8).filter(|&b| chars.ascii >> b & 1 == 1).collect()
}

#[test]
fn runs_are_found_where_characters_loop() {
    // Inside a GBNF string: every JSON string character but DEL, once a
    // step has shown that some character loops.
    let g = Gbnf::new(JSON_GBNF).unwrap();
    let s = after(&g, g.start(), b"{\"ab");
    let run = g.free_run(&s, 0).unwrap();
    let json = CharSet { ascii: CharSet::JSON_STRING.ascii & !(1 << 0x7f), non_ascii: true };
    assert_eq!(run.chars, json);
    assert!(g.free_run(&after(&g, g.start(), b"{"), 0).is_none(), "no loop found yet");
    // Some non-ASCII characters only: ASCII bytes alone.
    let g = Gbnf::new("root ::= [a-cé]* \".\"").unwrap();
    let s = after(&g, g.start(), b"ab");
    assert_eq!(g.free_run(&s, 0).map(|r| (ascii_of(r.chars), r.chars.non_ascii)), Some((b"abc".to_vec(), false)));
    // A character taken but not looping: no run.
    let g = Gbnf::new("root ::= \"x\"* [^x] \"!\"").unwrap();
    let s = after(&g, g.start(), b"xx");
    assert_eq!(g.free_run(&s, 0).map(|r| ascii_of(r.chars)), Some(b"x".to_vec()));
    // A regex's `.`: all but a newline.
    let p = Pattern::new("Answer: .*", PatternUse::Whole).unwrap();
    let s = after(&p, p.start(), b"Answer: b");
    let run = Grammar::free_run(&p, &s, 0).unwrap();
    assert_eq!(run.chars, CharSet { ascii: !(1u128 << b'\n'), non_ascii: true });
    assert!(Grammar::free_run(&p, &p.start(), 0).is_none());
}

/// With the real SmolLM2 tokenizer, when the model file is present: inside
/// a string of llama.cpp's JSON grammar and between numbers, the mask
/// equals stepping each token, and (printed) what a mask costs against JSON
/// mode's.
#[test]
fn real_vocabulary_through_a_grammar() {
    let Some(tok) = super::super::smollm2_tokenizer() else { return };
    let vocab = Arc::new(JsonVocab::for_tokenizer(&tok, tok.vocab_size()));
    let n = vocab.token_bytes.len();
    for prefix in ["{\"name\": \"A cat with a long, fluffy coat", "{\"n\": [1, 22, 333, 4444, "] {
        let text = tok.encode(prefix, false).unwrap();
        for (name, format) in [("grammar", OutputFormat::grammar(JSON_GBNF).unwrap()), ("json", OutputFormat::Object)] {
            let mut c = Constraint::new(vocab.clone(), &format);
            for &t in &text {
                let mut logits = vec![0.0f32; n];
                c.mask(&mut logits);
                assert!(c.advance(t));
            }
            let median = super::super::median_mask_ms(&c, &mut vec![0.0f32; n], 11);
            let allowed = super::super::checked_mask(&c, n, &(name, prefix)).len();
            println!("{name}: mask after {prefix:?} {median:.3} ms median ({allowed} allowed)");
        }
    }
}
