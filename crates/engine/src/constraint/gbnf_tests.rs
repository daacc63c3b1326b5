use super::*;

/// The state after `text`, or `None` at the first byte refused.
fn walk(g: &Gbnf, text: &[u8]) -> Option<u32> {
    text.iter().try_fold(g.start(), |s, &b| g.step(s, b))
}

fn accepts(g: &Gbnf, text: &str) -> bool {
    accepts_from(g, g.start(), text)
}

fn accepts_from(g: &Gbnf, s: u32, text: &str) -> bool {
    text.bytes().try_fold(s, |s, b| g.step(s, b)).is_some_and(|s| g.may_end(&s))
}

/// A random output: bytes of `alphabet` the grammar allows, until it may
/// end and a coin says so (or it must).
fn random_output(g: &Gbnf, alphabet: &[u8], next: &mut impl FnMut(usize) -> usize, most: usize) -> Vec<u8> {
    let (mut s, mut out) = (g.start(), Vec::new());
    loop {
        let choices: Vec<(u8, u32)> = alphabet.iter().filter_map(|&b| g.step(s, b).map(|n| (b, n))).collect();
        if g.may_end(&s) && (choices.is_empty() || next(5) == 0 || out.len() > most) {
            return out;
        }
        assert!(!choices.is_empty(), "dead end after {:?}", String::from_utf8_lossy(&out));
        let (b, n) = choices[next(choices.len())];
        out.push(b);
        s = n;
    }
}

/// Hostile grammars are refused quickly, with a reason; none overflows a
/// stack or grows without bound.
#[test]
fn hostile_grammars_are_refused() {
    let deep = format!("root ::= {}\"a\"{}", "(".repeat(30_000), ")".repeat(30_000));
    let chain: String = (1..=40).map(|k| format!("r{k} ::= r{} | r{}\n", k - 1, k - 1)).collect();
    let doubling: String = (1..=30).map(|k| format!("r{k} ::= r{} \"a\" | r{} \"b\"\n", k - 1, k - 1)).collect();
    for (src, want) in [
        (deep, "nest deeper"),
        ("root ::= ((\"a\"?){1000}){1000} \"b\"".to_string(), "too ambiguous"),
        (format!("root ::= r30\nr0 ::= \"x\"\n{doubling}"), "too ambiguous"),
        ("root ::= \"a\" []".to_string(), "no finite text"),
        ("root ::= \"a\" root".to_string(), "no finite text"),
        ("root ::= [^\\x00-\\U0010FFFF]".to_string(), "no finite text"),
    ] {
        let t = std::time::Instant::now();
        let Err(err) = Gbnf::new(&src) else { panic!("accepted: {}", &src[..src.len().min(60)]) };
        assert!(err.contains(want), "{}: {err}", &src[..src.len().min(60)]);
        assert!(t.elapsed().as_secs() < 10, "{want}: {:?}", t.elapsed());
    }
    // Linear in the chain, not exponential: 2^40 ways to one stack.
    let g = Gbnf::new(&format!("root ::= r40\nr0 ::= \"x\"\n{chain}")).unwrap();
    assert!(accepts(&g, "x"));
    // Unproductive alternatives are dropped, not dead ends.
    let g = Gbnf::new("root ::= \"x\" | \"y\" z\nz ::= \"z\" z").unwrap();
    assert!(accepts(&g, "x") && walk(&g, b"y").is_none());
    // Repetitions of what can match nothing, nested, expand once.
    let g = Gbnf::new("root ::= (((\"a\"?)*)* | (\"b\"*)+)*").unwrap();
    assert!(accepts(&g, "") && accepts(&g, &"ab".repeat(3000)));
    // A long literal repeated is one rule of it, repeated, however often.
    let g = Gbnf::new(&format!("root ::= \"{}\"{{1000}}{{1000}}", "ab".repeat(500))).unwrap();
    assert!(walk(&g, "ab".repeat(600).as_bytes()).is_some());
}

/// Repetitions may stand after spaces and stack, as llama.cpp takes them.
#[test]
fn repetitions_after_spaces_and_stacked() {
    let g = Gbnf::new("root ::= [0-9] + ( \",\" [0-9] ) *").unwrap();
    assert!(accepts(&g, "12,3,4") && !accepts(&g, ",1"));
    let g = Gbnf::new("root ::= \"a\"+? \"b\"").unwrap();
    assert!(accepts(&g, "b") && accepts(&g, "aaab"));
}

#[test]
fn refusals_say_why() {
    for (src, want) in [
        ("a ::= \"x\"", "no `root`"),
        ("root ::= a", "`a` is used but not defined"),
        ("root ::= root \"x\" | \"y\"", "left-recursive"),
        ("root ::= a \"x\"\na ::= \"b\"? root", "left-recursive"),
        ("root ::= a\na ::= \"b\"? root", "no finite text"),
        ("root ::= ((\"a\"? root2) \"c\")\nroot2 ::= root | \"d\"", "left-recursive"),
        ("root ::= \"x", "closing"),
        ("root ::= [ab", "closing `]`"),
        ("root ::= [a-", "a character"),
        ("root ::= \"\\q\"", "known escape"),
        ("root ::= \"x\"{3,2}", "repetition"),
        ("root ::= \"x\"{5000}", "limited"),
        ("root ::= \"a\"\nroot ::= \"b\"", "defined twice"),
        ("root ::= ( \"a\" ", "`)`"),
        ("root ::= !\"x\"", "after `!`"),
        ("root ::= <[x]>", "a token id"),
        ("root ::= <[99999999999]>", "a token id"),
        ("root ::= <think", "closing `>`"),
        ("root ::= <>", "closing `>`"),
    ] {
        let err = Gbnf::new(src).unwrap_err();
        assert!(err.contains(want), "{src:?}: {err}");
    }
}

/// Grammars of regular languages against the `regex` crate over every
/// string of `a`/`b` up to 8 bytes: a string is a sentence exactly when it
/// matches, and a prefix is refused only when nothing that extends it does.
#[test]
fn regular_grammars_agree_with_an_independent_matcher() {
    let cases = [
        ("root ::= (\"ab\" | \"b\")* \"a\"?", "^(ab|b)*a?$"),
        ("root ::= \"a\"{2,3} [b]+ # comment\n", "^a{2,3}b+$"),
        ("root ::= x y\nx ::= \"a\"*\ny ::= (\"b\" x)?", "^a*(ba*)?$"),
        ("root ::= [^b] . \"b\"{1}", "^[^b].b$"),
        ("root ::= ( \"a\" \"b\"\n  | \"ba\" )+", "^(ab|ba)+$"),
        // Repetitions of what can match nothing.
        ("root ::= (\"a\"?)* \"b\"", "^a*b$"),
        ("root ::= (\"a\"* | \"b\")+ \"ab\"?", "^(a*|b)+(ab)?$"),
        ("root ::= (x \"b\"?)*\nx ::= (\"a\" x)?", "^(a*b?)*$"),
    ];
    let mut strings = vec![Vec::new()];
    let mut all: Vec<Vec<u8>> = vec![Vec::new()];
    for _ in 0..8 {
        strings = strings.iter().flat_map(|s: &Vec<u8>| [b'a', b'b'].map(|c| [&s[..], &[c]].concat())).collect();
        all.extend(strings.iter().cloned());
    }
    for (src, re) in cases {
        let g = Gbnf::new(src).unwrap();
        let re = regex::bytes::Regex::new(re).unwrap();
        for s in &all {
            let state = walk(&g, s);
            assert_eq!(
                state.is_some_and(|st| g.may_end(&st)),
                re.is_match(s),
                "{src}: {:?}",
                String::from_utf8_lossy(s)
            );
            if state.is_none() {
                assert!(!all.iter().any(|t| t.starts_with(s) && re.is_match(t)), "{src}: refused a prefix of a match");
            }
        }
    }
}

/// Whether `s` is an arithmetic expression of the grammar below, by
/// recursive descent (written apart from it).
fn is_expression(s: &[u8]) -> bool {
    fn expr(s: &[u8], i: &mut usize) -> bool {
        term(s, i) && {
            while *i < s.len() && (s[*i] == b'+' || s[*i] == b'-') {
                *i += 1;
                if !term(s, i) {
                    return false;
                }
            }
            true
        }
    }
    fn term(s: &[u8], i: &mut usize) -> bool {
        factor(s, i) && {
            while *i < s.len() && s[*i] == b'*' {
                *i += 1;
                if !factor(s, i) {
                    return false;
                }
            }
            true
        }
    }
    fn factor(s: &[u8], i: &mut usize) -> bool {
        if *i < s.len() && s[*i] == b'(' {
            *i += 1;
            return expr(s, i) && *i < s.len() && s[*i] == b')' && {
                *i += 1;
                true
            };
        }
        let start = *i;
        while *i < s.len() && s[*i].is_ascii_digit() {
            *i += 1;
        }
        *i > start
    }
    let mut i = 0;
    expr(s, &mut i) && i == s.len()
}

/// A context-free language (nested parentheses): random outputs never dead-
/// end and are all expressions; the grammar refuses what is none.
#[test]
fn expressions_nest() {
    let g = Gbnf::new(
        "root ::= expr\nexpr ::= term ((\"+\" | \"-\") term)*\nterm ::= factor (\"*\" factor)*\n\
         factor ::= [0-9]+ | \"(\" expr \")\"",
    )
    .unwrap();
    let mut next = super::super::picker(0x0dd_ba11);
    for _ in 0..500 {
        let out = random_output(&g, b"0123456789+-*()x ", &mut next, 60);
        assert!(is_expression(&out), "{:?}", String::from_utf8_lossy(&out));
    }
    assert!(accepts(&g, "((1+2)*3)-4") && !accepts(&g, "((1+2)*3") && walk(&g, b"1+)").is_none());
    assert!(walk(&g, b"(((((((((((((((((((((1").is_some());
}

/// llama.cpp's JSON grammar (its `json.gbnf`, exponents cut to two digits
/// so that every number is a finite double): random outputs over bytes
/// that include a two-byte character parse as JSON.
#[test]
fn json_grammar_outputs_parse() {
    let src = r#"
root   ::= object
value  ::= object | array | string | number | ("true" | "false" | "null") ws

object ::=
  "{" ws (
            string ":" ws value
    ("," ws string ":" ws value)*
  )? "}" ws

array  ::=
  "[" ws (
            value
    ("," ws value)*
  )? "]" ws

string ::=
  "\"" (
    [^"\\\x7F\x00-\x1F] |
    "\\" (["\\bfnrt] | "u" [0-9a-fA-F]{4}) # escapes
  )* "\"" ws

number ::= ("-"? ([0-9] | [1-9] [0-9]{0,15})) ("." [0-9]+)? ([eE] [-+]? [0-9]{1,2})? ws

# Optional space: by convention, applied in this grammar after literal chars when allowed
ws ::= | " " | "\n" [ \t]{0,20}
"#;
    let g = Gbnf::new(src).unwrap();
    let mut next = super::super::picker(0x5eed);
    let alphabet: Vec<u8> = b"{}[]\",: abc\\nu0123456789.-eEtrfls\n".iter().copied().chain([0xc3, 0xa9]).collect();
    for _ in 0..300 {
        let out = random_output(&g, &alphabet, &mut next, 120);
        let v: Result<serde_json::Value, _> = serde_json::from_slice(&out);
        assert!(v.is_ok_and(|v| v.is_object()), "{:?}", String::from_utf8_lossy(&out));
    }
}

/// Characters are code points: a class of two-byte characters admits the
/// lead byte they share and refuses others; a refused prefix never passes.
#[test]
fn characters_are_code_points() {
    let g = Gbnf::new("root ::= [é-ê]+ \"!\"").unwrap();
    assert!(accepts(&g, "éêé!") && !accepts(&g, "ë!"));
    assert!(walk(&g, &[0xc3]).is_some() && walk(&g, &[0xc4]).is_none() && walk(&g, &[0xc3, 0xab]).is_none());
    let any = Gbnf::new("root ::= [^a]").unwrap();
    assert!(accepts(&any, "🦀") && walk(&any, &[0xed, 0xa0]).is_none() && walk(&any, &[0xff]).is_none());
    let dot = Gbnf::new("root ::= . \"x\"").unwrap();
    assert!(accepts(&dot, "日x") && accepts(&dot, "\nx"));
    let esc = Gbnf::new(r#"root ::= "\x41\u00e9\U0001F980\n\"""#).unwrap();
    assert!(accepts(&esc, "Aé🦀\n\""));
}

/// Whole outputs: the end is allowed exactly at a sentence, and a sentence
/// that nothing extends is complete.
#[test]
fn ends_and_completion() {
    let g = Gbnf::new("root ::= \"yes\" | \"no\" | \"no way\"").unwrap();
    let no = walk(&g, b"no").unwrap();
    assert!(g.may_end(&no) && !g.is_complete(&no));
    let yes = walk(&g, b"yes").unwrap();
    assert!(g.may_end(&yes) && g.is_complete(&yes));
    assert!(!g.may_end(&walk(&g, b"ye").unwrap()));
    // Deep right recursion does not grow the stack: a long repetition runs.
    let many = Gbnf::new("root ::= \"a\"*").unwrap();
    assert!(accepts(&many, &"a".repeat(5000)));
}

/// Through a vocabulary: the mask allows exactly the tokens whose bytes
/// step one by one (each tried on a copy of the constraint, which runs
/// states of its own), and sampling from it ends in sentences.
#[test]
fn masks_match_stepping_each_token() {
    use super::super::format::{Constraint, OutputFormat};
    use super::super::json::JsonVocab;
    let mut next = super::super::picker(0xfeed_5eed);
    let soup = b"0123456789+-*() ";
    let mut bytes: Vec<Vec<u8>> =
        (0..600).map(|_| (0..1 + next(4)).map(|_| soup[next(soup.len())]).collect()).collect();
    bytes.extend(soup.iter().map(|&b| vec![b]));
    let eos = bytes.len() as u32;
    bytes.push(Vec::new());
    let vocab = Arc::new(JsonVocab::new(bytes, &[eos]));
    let n = vocab.token_bytes.len();
    let format =
        OutputFormat::grammar("root ::= e\ne ::= t ((\"+\" | \"-\") t)*\nt ::= [0-9]+ | \"(\" e \")\"").unwrap();
    for _ in 0..30 {
        let mut c = Constraint::new(vocab.clone(), &format);
        let mut out = Vec::new();
        loop {
            let allowed = super::super::checked_mask(&c, n, &String::from_utf8_lossy(&out));
            let id = if allowed.contains(&(eos as usize)) && (out.len() > 30 || next(4) == 0) {
                eos as usize
            } else {
                allowed[next(allowed.len())]
            };
            if id == eos as usize {
                break;
            }
            assert!(c.advance(id as u32));
            out.extend_from_slice(&vocab.token_bytes[id]);
        }
        assert!(is_expression(&out), "{:?}", String::from_utf8_lossy(&out));
    }
}

/// Token references: `<[id]>` takes that token whole (a special one too,
/// with no text), `!<[id]>` any one token but it, never the end of
/// generation; through a vocabulary the mask allows exactly the tokens that
/// step, and sampled outputs keep the grammar's token order.
#[test]
fn token_references_through_a_vocabulary() {
    use super::super::format::{Constraint, OutputFormat};
    use super::super::json::JsonVocab;
    let mut next = super::super::picker(0x70c3);
    let soup: [&[u8]; 8] = [b"a", b"b", b" ", b".", "é".as_bytes(), b"\xc3", b"\xa9", b"ab"];
    let mut bytes: Vec<Vec<u8>> =
        (0..300).map(|_| (0..1 + next(3)).flat_map(|_| soup[next(8)].to_vec()).collect()).collect();
    bytes.extend(soup.iter().map(|s| s.to_vec()));
    // Two special tokens (no text), then the end of generation.
    let (think, end) = (bytes.len() as u32, bytes.len() as u32 + 1);
    bytes.extend([Vec::new(), Vec::new(), Vec::new()]);
    let eos = end + 1;
    let vocab = Arc::new(JsonVocab::new(bytes, &[eos]));
    let n = vocab.token_bytes.len();
    let src = format!("root ::= <[{think}]> (!<[{end}]>)* <[{end}]> [ab]+ \".\"");
    let format = OutputFormat::grammar(&src).unwrap();
    assert!(format.clone().in_vocabulary(n, |_| None).is_ok());
    assert!(format.clone().in_vocabulary(end as usize, |_| None).is_err());
    for round in 0..20 {
        let mut c = Constraint::new(vocab.clone(), &format);
        let mut ids = Vec::new();
        loop {
            let allowed = super::super::checked_mask(&c, n, &ids);
            // Past a few tokens, the closing token where allowed.
            let id = match allowed.iter().find(|&&i| i as u32 == end || i as u32 == eos) {
                Some(&i) if ids.len() > 3 + round % 5 => i,
                _ => allowed[next(allowed.len())],
            } as u32;
            if id == eos {
                break;
            }
            assert!(c.advance(id), "{id} after {ids:?}");
            ids.push(id);
            assert!(ids.len() < 200, "{ids:?}");
        }
        assert_eq!(ids[0], think);
        let close = ids.iter().position(|&t| t == end).unwrap();
        let tail: Vec<u8> = ids[close + 1..].iter().flat_map(|&t| vocab.token_bytes[t as usize].clone()).collect();
        let tail = String::from_utf8(tail).unwrap();
        assert!(tail.ends_with('.') && tail[..tail.len() - 1].chars().all(|ch| ch == 'a' || ch == 'b'), "{tail:?}");
    }
    // A reference to the end of generation is the output's end: whole
    // there, whatever the rules around it would take next.
    let ends = OutputFormat::grammar(&format!("root ::= (\"a\" <[{eos}]> | \"b\") \"c\"")).unwrap();
    let mut c = Constraint::new(vocab.clone(), &ends);
    let a = vocab.token_bytes.iter().position(|t| t == b"a").unwrap() as u32;
    assert!(c.advance(a) && c.is_complete());
    let mut logits = vec![1.0f32; n];
    c.mask(&mut logits);
    let allowed: Vec<usize> = (0..n).filter(|&i| logits[i] == 1.0).collect();
    assert_eq!(allowed, vec![eos as usize]);
    assert!(c.clone().advance(eos) && !c.clone().advance(a));
    // Text and whole tokens together: "a" steps both ways, a lone lead
    // byte as a whole token.
    let g = Gbnf::new("root ::= (!<[0]> | \"a\")+ \".\"").unwrap();
    let s = g.feed_token(g.start(), 7, Some(b"a")).unwrap();
    let s = g.feed_token(s, 9, Some(b"\xc3")).unwrap();
    assert!(accepts_from(&g, s, "a.") && g.feed_token(s, 0, Some(b"z")).is_none());
    // A token whose bytes end inside a character: taken whole, or by its
    // bytes, the character then completed by the next byte.
    let g = Gbnf::new("root ::= <[5]> \"!\" | \"aé?\" | <[5]>").unwrap();
    let s = g.feed_token(g.start(), 5, Some(b"a\xc3")).unwrap();
    assert!(g.may_end(&s) && accepts_from(&g, s, "!"));
    let completed = g.step(s, 0xa9).unwrap();
    assert!(!g.may_end(&completed) && accepts_from(&g, completed, "?"));
    assert!(g.step(s, b'?').is_none() && g.step(s, 0xa8).is_none() && g.step(completed, b'!').is_none());
    // There the whole token's stacks offer the tokens they reference.
    let g = Gbnf::new("root ::= <[5]> <[6]> | \"aé\"").unwrap();
    let s = g.feed_token(g.start(), 5, Some(b"a\xc3")).unwrap();
    assert_eq!(g.whole_tokens(&s), vec![(6, false)]);
    assert!(g.feed_token(s, 6, None).is_some_and(|e| g.may_end(&e)));
    assert!(g.step(s, 0xa9).is_some_and(|e| g.may_end(&e)));
    let g = Gbnf::new("root ::= <[5]> \"!\" | \"aé?\" | <[5]>").unwrap();
    // Another token of those bytes takes the byte path alone.
    let s = g.feed_token(g.start(), 6, Some(b"a\xc3")).unwrap();
    assert!(!g.may_end(&s) && g.step(s, b'!').is_none() && g.step(s, 0xa9).is_some());
    // A reference whose stacks are cut at the depth limit is not offered.
    let deep = Gbnf::new("root ::= <[5]> root \"x\" | \"y\"").unwrap();
    let mut s = deep.start();
    for _ in 0..2000 {
        if deep.whole_tokens(&s).is_empty() {
            break;
        }
        s = deep.feed_token(s, 5, None).unwrap();
    }
    assert!(deep.whole_tokens(&s).is_empty() && deep.feed_token(s, 5, None).is_none());
    assert!(deep.step(s, b'y').is_some());
}

#[test]
fn token_reference_syntax() {
    let g = Gbnf::new("root ::= <[12]> !<[3]>? \"x\"").unwrap();
    assert_eq!(g.whole_tokens(&g.start()), vec![(12, false)]);
    // (Malformed references: with the other refusals, `refusals_say_why`.)
    // Tokens by text, named by the vocabulary: until then they take none.
    let rules = Gbnf::compile("root ::= <think> !</think>* </think> \"x\"").unwrap();
    let g = Gbnf::run(rules.clone());
    assert!(g.whole_tokens(&g.start()).is_empty());
    let names = |t: &str| [("<think>", 7), ("</think>", 8)].iter().find(|(n, _)| *n == t).map(|&(_, id)| id);
    let g = Gbnf::run(Arc::new(rules.in_vocabulary(100, names).unwrap()));
    let s = g.feed_token(g.start(), 7, None).unwrap();
    assert_eq!(g.whole_tokens(&s), vec![(8, false), (8, true)]);
    let s = g.feed_token(g.feed_token(s, 3, Some(b"hm")).unwrap(), 8, None).unwrap();
    assert!(accepts_from(&g, s, "x"));
    let err = rules.in_vocabulary(100, |_| None).unwrap_err();
    assert!(err.contains("<think> is not in the model's vocabulary"), "{err}");
    assert!(rules.in_vocabulary(8, names).unwrap_err().contains("outside the vocabulary"));
}
