use super::*;

/// Feeds `text` (decoded bytes) from the start; the state and length, or
/// `None` at the first byte refused.
fn walk(p: &Pattern, text: &str) -> Option<(u32, u32)> {
    let (mut s, mut len) = (p.start(), 0u32);
    for &b in text.as_bytes() {
        s = p.step(s, b, len)?;
        len += starts_char(b) as u32;
    }
    Some((s, len))
}

/// Whether any byte may follow `s` after `len` characters.
fn can_go_on(p: &Pattern, s: u32, len: u32) -> bool {
    (0..=255u8).any(|b| p.step(s, b, len).is_some())
}

fn matches(p: &Pattern, text: &str) -> bool {
    walk(p, text).is_some_and(|(s, len)| p.accepts(s, len))
}

fn json(source: &str, min: u32, max: u32) -> Pattern {
    Pattern::new(source, PatternUse::Json { min, max }).unwrap()
}

/// A JSON Schema `format`'s patterns, together, up to `max` characters.
fn formatted(name: &str, max: u32) -> Pattern {
    let sources = format_pattern(name).unwrap();
    let sources: Vec<&str> = sources.iter().map(String::as_str).collect();
    let mut work = MAX_WORK;
    Pattern::within(&sources, PatternUse::Json { min: 0, max }, &mut work).unwrap()
}

#[test]
fn whole_output_matches() {
    let p = Pattern::new("[a-c]{2,3}", PatternUse::Whole).unwrap();
    assert!(matches(&p, "ab") && matches(&p, "abc"));
    assert!(walk(&p, "a").is_some() && !matches(&p, "a"));
    assert!(walk(&p, "abcd").is_none() && walk(&p, "d").is_none());
    let (s, len) = walk(&p, "abc").unwrap();
    assert!(!can_go_on(&p, s, len) && p.ends(s));
    let (s, len) = walk(&p, "ab").unwrap();
    assert!(can_go_on(&p, s, len) && !p.ends(s));
}

/// Every match counts, not only the leftmost-first one a search reports.
#[test]
fn whole_outputs_may_be_any_match() {
    let whole = |p: &str| Pattern::new(p, PatternUse::Whole).unwrap();
    assert!(matches(&whole("a|ab"), "ab") && matches(&whole("a|ab"), "a"));
    assert!(matches(&whole(r"\d+|\d+\.\d+"), "1.5"));
    assert!(matches(&whole("Answer: .*?"), "Answer: yes"));
    assert!(matches(&whole("(.*?),(.*?)"), "a,b"));
}

#[test]
fn json_patterns_search_like_validators() {
    // Anchored: the whole content; unanchored: a match anywhere in it.
    let digits = json("^[0-9]+$", 0, u32::MAX);
    assert!(matches(&digits, "123") && walk(&digits, "12a").is_none() && !matches(&digits, ""));
    let ab = json("ab", 0, u32::MAX);
    assert!(matches(&ab, "xxabyy") && matches(&ab, "ab"));
    assert!(walk(&ab, "xx").is_some() && !matches(&ab, "xx"));
}

#[test]
fn classes_are_what_every_dialect_accepts() {
    let d = json(r"^\d+$", 0, u32::MAX);
    assert!(matches(&d, "0123456789"));
    assert!(walk(&d, "\u{663}").is_none(), "an Arabic-Indic digit is not ECMA-262's \\d");
    let w = json(r"^\w+$", 0, u32::MAX);
    assert!(matches(&w, "a_Z9") && walk(&w, "é").is_none());
    let dot = json("^a.b$", 0, u32::MAX);
    assert!(matches(&dot, "axb") && walk(&dot, "a\n").is_none() && walk(&dot, "a\r").is_none());
    let esc = json(r"^\d+\.\d+\/\-$", 0, u32::MAX);
    assert!(matches(&esc, "1.5/-"));
    let class = json(r"^[\d.]+[^\s]$", 0, u32::MAX);
    assert!(matches(&class, "1.2x") && walk(&class, "1.2 ").is_none());
    let hex = json(r"^\u0041\x42$", 0, u32::MAX);
    assert!(matches(&hex, "AB"));
    let boundary = json(r"\bcat\b", 0, u32::MAX);
    assert!(matches(&boundary, "a cat!") && !matches(&boundary, "concat"));
    let bracket = json("^[[]+$", 0, u32::MAX);
    assert!(matches(&bracket, "[["));
    let anything = json("^a[^]b$", 0, u32::MAX);
    assert!(matches(&anything, "a\nb"));
    // Excluded classes are the widest: no dialect's member gets through.
    for (p, text) in [(r"^[^\s]$", "\u{feff}"), (r"^\S$", "\u{feff}"), (r"^\S$", "\u{85}"), (r"^[^\D]$", "\u{663}")] {
        assert!(walk(&json(p, 0, u32::MAX), text).is_none(), "{p} on {text:?}");
    }
    assert!(walk(&json(r"^[^\W]$", 0, u32::MAX), "é").is_none() && matches(&json(r"^[^\W]$", 0, u32::MAX), "x"));
    assert!(walk(&json(r"^\W$", 0, u32::MAX), "\u{b2}").is_none(), "² is a word character to Python");
    assert!(
        matches(&json(r"^[^\S\r\n]+$", 0, u32::MAX), " \t")
            && walk(&json(r"^[^\S\r\n]$", 0, u32::MAX), "\u{85}").is_none()
    );
    // Literal braces (ECMA-262 has no `{,m}`); surrogate pairs; escaped
    // punctuation; properties.
    assert!(matches(&json(r"^[\w-]+$", 0, u32::MAX), "a-z_"));
    assert!(matches(&json("^a{b}$", 0, u32::MAX), "a{b}") && matches(&json("^a{2}$", 0, u32::MAX), "aa"));
    assert!(matches(&json("^x{,2}$", 0, u32::MAX), "x{,2}") && !matches(&json("^x{,2}$", 0, u32::MAX), "x"));
    assert!(matches(&json(r"^\p{L}+[\p{Nd}]$", 0, u32::MAX), "éa1"));
    assert!(matches(&json(r"^\uD83D\uDE00$", 0, u32::MAX), "😀"));
    assert!(matches(&json(r"^\<\/\>$", 0, u32::MAX), "</>"));
}

#[test]
fn python_syntax_for_whole_outputs() {
    let whole = |p: &str| Pattern::new(p, PatternUse::Whole);
    let not_bracket = whole("[^]]+").unwrap();
    assert!(matches(&not_bracket, "xy") && walk(&not_bracket, "x]").is_none());
    assert!(matches(&whole("[]a]+").unwrap(), "]a"));
    assert!(matches(&whole("x{,2}").unwrap(), "xx") && walk(&whole("x{,2}").unwrap(), "xxx").is_none());
    assert!(matches(&whole(r"\Aa\Z").unwrap(), "a"));
    assert!(matches(&whole("x{,}").unwrap(), "xxx") && matches(&whole("[ ,]+").unwrap(), " ,"));
    for (p, why) in [
        (r"\bcat\b", "word boundary"),
        ("(?x)a b", "flag `x`"),
        ("(?i)a", "flag `i`"),
        (r"\uD83D\uDE00", "surrogate"),
        ("a*+a", "after a quantifier"),
    ] {
        let e = whole(p).unwrap_err();
        assert!(e.contains(why), "{p}: {e}");
    }
    assert!(matches(&whole("(?s)a.b").unwrap(), "a\nb"));
}

#[test]
fn lengths_bound_the_matches() {
    let p = json("^a*$", 2, 3);
    assert!(!matches(&p, "a") && matches(&p, "aa") && matches(&p, "aaa"));
    assert!(walk(&p, "aaaa").is_none());
    // maxLength leaves room for the match only if it is taken at once.
    let p = json("abc", 0, 4);
    assert!(walk(&p, "xx").is_none(), "no room left for `abc`");
    assert!(matches(&p, "xabc") && matches(&p, "abcx"));
    // Characters, not bytes.
    let p = json("^.{2}$", 0, u32::MAX);
    assert!(matches(&p, "éü") && walk(&p, "éüa").is_none());
    assert!(Pattern::new("^abc$", PatternUse::Json { min: 0, max: 2 }).is_err());
    assert!(Pattern::new("^abc$", PatternUse::Json { min: 4, max: u32::MAX }).is_err());
}

#[test]
fn unsupported_patterns_are_refused() {
    for (source, why) in [
        ("(?=a)a", "look-around"),
        ("a(?!b)", "look-around"),
        (r"(a)\1", "backreference"),
        ("(", "unclosed"),
        ("[]", "empty class"),
        ("(a|b)*a(a|b){16}", "size limit"),
        ("(?:(?:a{1000}){1000}){1000}", "exceeded limit"),
        ("a)|(b", "unopened"),
        (r"\q", "escape"),
        ("[a--b]", "`--`"),
        (r"[\w-z]", "range"),
        (r"[%-\w]", "range"),
        (r"\u+041", "hex"),
        ("(?i)a", "flag `i`"),
        ("a?+", "after a quantifier"),
        ("a{2}*", "after a quantifier"),
    ] {
        let e = Pattern::new(source, PatternUse::Json { min: 0, max: u32::MAX }).unwrap_err();
        assert!(e.contains(why), "{source}: {e}");
    }
}

#[test]
fn formats_fix_their_shapes() {
    let p = |f: &str| formatted(f, u32::MAX);
    let date = p("date");
    for ok in ["2024-02-29", "2000-02-29", "1999-04-30", "0001-01-01"] {
        assert!(matches(&date, ok), "{ok}");
    }
    for bad in ["2023-02-29", "1900-02-29", "2024-04-31", "2024-02-30", "0000-01-01"] {
        assert!(!matches(&date, bad), "{bad}");
    }
    // An anchored pattern needs no rows past its longest match.
    formatted("uuid", 1_000_000);
    let dt = p("date-time");
    assert!(matches(&dt, "2024-02-29T12:30:00Z") && matches(&dt, "2024-02-29T12:30:00.123+05:30"));
    assert!(walk(&dt, "2024-13").is_none() && !matches(&dt, "2024-02-29T12:30:00"));
    assert!(matches(&p("date"), "1999-12-31") && walk(&p("date"), "1999-12-32").is_none());
    assert!(matches(&p("time"), "23:59:59Z"));
    assert!(matches(&p("uuid"), "123e4567-e89b-12d3-a456-426614174000"));
    assert!(matches(&p("ipv4"), "192.168.0.255") && walk(&p("ipv4"), "256").is_none());
    assert!(format_pattern("idn-email").is_none());
    let v6 = p("ipv6");
    for ok in ["::", "::1", "1::", "fe80::1:2", "2001:db8:0:0:0:0:2:1", "a:b:c:d:e:f:0:1", "1:2:3:4:5:6:7::"] {
        assert!(matches(&v6, ok), "{ok}");
    }
    for bad in [":::", "1:2", "12345::", "1::2::3", "1:2:3:4:5:6:7:8:9", "g::"] {
        assert!(!matches(&v6, bad), "{bad}");
    }
    let host = p("hostname");
    assert!(matches(&host, "a-b.example.com") && matches(&host, "x"));
    assert!(!matches(&host, "-a.com") && !matches(&host, "a-.com") && !matches(&host, "a..com"));
    assert!(!matches(&host, &format!("{}.com", "a".repeat(64))));
    assert!(!matches(&host, "1.2.3.4") && matches(&host, "a1.b2.xn--p1ai"));
    let email = p("email");
    assert!(matches(&email, "jane.doe+tag@mail.example.org") && matches(&email, "o'neil@x.io"));
    assert!(matches(&email, "a@b.xn--p1ai"));
    for bad in ["jane@localhost", ".jane@x.io", "jane.@x.io", "ja..ne@x.io", "jane@x.1o", "@x.io"] {
        assert!(!matches(&email, bad), "{bad}");
    }
    // A local part of at most 64 characters.
    assert!(matches(&email, &format!("{}.b@x.io", "a".repeat(62))));
    assert!(walk(&email, &format!("{}.bc@", "a".repeat(62))).is_none());
    let dur = p("duration");
    for ok in ["P1Y2M3DT4H5M6S", "P3W", "PT0S", "P1D", "PT1H30M", "P1M", "P2MT1S", "P10Y"] {
        assert!(matches(&dur, ok), "{ok}");
    }
    for bad in ["P", "PT", "P1Y2D", "P1H", "PT1D", "P1W2D", "1D", "P1DT", "PT1S2M"] {
        assert!(!matches(&dur, bad), "{bad}");
    }
    let ptr = p("json-pointer");
    assert!(["", "/", "/a/b", "/a~1b/~0", "//"].iter().all(|ok| matches(&ptr, ok)));
    assert!(["a", "/~2", "/~", "~0"].iter().all(|bad| !matches(&ptr, bad)));
    let rel = p("relative-json-pointer");
    assert!(["0", "1/a", "2#", "10/x~0", "0/", "0+1/a", "1-2#", "0-10"].iter().all(|ok| matches(&rel, ok)));
    assert!(["01", "#", "-1", "1#/a", "", "0+0", "1+", "1-01/a", "+1"].iter().all(|bad| !matches(&rel, bad)));
    let uri_ref = p("uri-reference");
    for ok in ["https://x/y", "//host/p", "/abs/path?q#f", "rel/path", "", "#frag", "?q", "a:b", "./a:b"] {
        assert!(matches(&uri_ref, ok), "{ok}");
    }
    for bad in ["a b", "%zz", ":nope", "a/%2", "1a:b"] {
        assert!(!matches(&uri_ref, bad), "{bad}");
    }
    let uri = p("uri");
    assert!(matches(&uri, "https://example.com/a?b=c#d") && matches(&uri, "urn:isbn:0451450523"));
    assert!(matches(&uri, "http://user:pw@host:80/%20x/y?q=1&r=/a?#frag/x") && matches(&uri, "file:///etc/hosts"));
    assert!(matches(&uri, "mailto:jane@example.org") && matches(&uri, "a:/b"));
    // An empty path: a scheme alone, or with a query or fragment.
    assert!(["about:", "mailto:?to=x", "a:#f"].iter().all(|ok| matches(&uri, ok)));
    let bad = ["example.com", "1http://x", "http://a b", "http://x/%2", ":", "a:#b#c", "http://x/[", "http://x:abc/"];
    for bad in bad {
        assert!(!matches(&uri, bad), "{bad}");
    }
}

/// Random outputs of the address formats parse with independent parsers
/// (the standard library's for IP addresses; RFC 1123's rules by hand for
/// host names and email domains).
#[test]
fn format_outputs_parse_independently() {
    let mut next = super::super::picker(0x51_7cc1_b727_220a);
    let alphabet: Vec<u8> = (b' '..=b'~').collect();
    let host_ok = |h: &str| {
        h.len() <= 253
            && h.split('.').all(|l| {
                (1..=63).contains(&l.len())
                    && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
                    && !l.starts_with('-')
                    && !l.ends_with('-')
            })
    };
    // RFC 3339's durations: the units of the date part, and of the time
    // part after `T`, a run of "YMD" and of "HMS"; or weeks alone.
    let duration_ok = |d: &str| {
        let units = |part: &str| {
            let (mut letters, mut digits) = (String::new(), 0);
            for c in part.chars() {
                if c.is_ascii_digit() {
                    digits += 1;
                } else if digits == 0 {
                    return None;
                } else {
                    letters.push(c);
                    digits = 0;
                }
            }
            (digits == 0).then_some(letters)
        };
        let Some(rest) = d.strip_prefix('P') else { return false };
        let (date, time) = rest.split_once('T').map_or((rest, None), |(d, t)| (d, Some(t)));
        let (Some(date), time) = (units(date), time.map(units)) else { return false };
        match time {
            None => date == "W" || (!date.is_empty() && "YMD".contains(date.as_str())),
            Some(Some(t)) => !t.is_empty() && "HMS".contains(t.as_str()) && "YMD".contains(date.as_str()),
            Some(None) => false,
        }
    };
    // RFC 6901's pointers, and relative ones (a count, maybe an index
    // moved by a signed count, then `#` or a pointer).
    let pointer_ok = |p: &str| {
        let tildes = p.match_indices('~').all(|(i, _)| matches!(p.as_bytes().get(i + 1), Some(b'0' | b'1')));
        (p.is_empty() || p.starts_with('/')) && tildes
    };
    let relative_ok = |r: &str| {
        let count = |r: &str| {
            let n = &r[..r.bytes().take_while(u8::is_ascii_digit).count()];
            (!n.is_empty() && (n == "0" || !n.starts_with('0'))).then_some(n.len())
        };
        let Some(levels) = count(r) else { return false };
        let mut rest = &r[levels..];
        if let Some(moved) = rest.strip_prefix(['+', '-']) {
            match count(moved) {
                Some(k) if !moved.starts_with('0') => rest = &moved[k..],
                _ => return false,
            }
        }
        rest == "#" || pointer_ok(rest)
    };
    let formats = ["ipv4", "ipv6", "hostname", "email", "duration", "json-pointer", "relative-json-pointer"];
    for format in formats {
        let p = formatted(format, format_max_len(format));
        for _ in 0..300 {
            let (mut s, mut len, mut out) = (p.start(), 0u32, String::new());
            loop {
                let choices: Vec<(u8, u32)> =
                    alphabet.iter().filter_map(|&b| p.step(s, b, len).map(|n| (b, n))).collect();
                if p.accepts(s, len) && (choices.is_empty() || next(6) == 0) {
                    break;
                }
                assert!(!choices.is_empty(), "{format}: dead end after {out:?}");
                let (b, n) = choices[next(choices.len())];
                (s, len) = (n, len + 1);
                out.push(b as char);
            }
            let ok = match format {
                "ipv4" => out.parse::<std::net::Ipv4Addr>().is_ok(),
                "ipv6" => out.parse::<std::net::Ipv6Addr>().is_ok(),
                "hostname" => host_ok(&out),
                "duration" => duration_ok(&out),
                "json-pointer" => pointer_ok(&out),
                "relative-json-pointer" => relative_ok(&out),
                _ => out.split_once('@').is_some_and(|(local, domain)| {
                    (1..=64).contains(&local.len())
                        && local.split('.').all(|a| !a.is_empty())
                        && host_ok(domain)
                        && domain
                            .rsplit('.')
                            .next()
                            .is_some_and(|tld| tld.len() >= 2 && tld.bytes().all(|b| b.is_ascii_alphabetic()))
                        && out.len() <= 254
                }),
            };
            assert!(ok, "{format}: {out:?}");
        }
    }
}

/// Against the `regex` crate over every string of `a`/`b` up to 7
/// characters: the walk accepts exactly the matches of the right length,
/// and refuses a prefix exactly when no extension is such a match.
#[test]
fn walks_agree_with_an_independent_matcher() {
    let patterns = ["ab*a", "^(ab|ba)+$", "a{2}b?", "^b*(a|bb)$", "(aa|b)a", "^[ab]{3}$", "b$"];
    let bounds = [(0, u32::MAX), (2, u32::MAX), (0, 4), (3, 5), (6, 6)];
    let mut strings = vec![String::new()];
    for len in 1..=7 {
        for i in 0..1u32 << len {
            strings.push((0..len).map(|j| if i >> j & 1 == 1 { 'b' } else { 'a' }).collect());
        }
    }
    for source in patterns {
        let reference = regex::Regex::new(source).unwrap();
        for (min, max) in bounds {
            let Ok(p) = Pattern::new(source, PatternUse::Json { min, max }) else {
                let any = strings.iter().any(|s| reference.is_match(s) && (min..=max).contains(&(s.len() as u32)));
                assert!(!any, "{source} {min}..={max} refused but has a match");
                continue;
            };
            let good = |s: &str| reference.is_match(s) && (min..=max).contains(&(s.len() as u32));
            for s in &strings {
                assert_eq!(matches(&p, s), good(s), "{source} {min}..={max} on {s:?}");
                // A prefix is walked iff it extends to a match (these
                // patterns' within three more characters).
                let alive = strings.iter().any(|t| t.starts_with(s.as_str()) && good(t));
                if s.len() <= 4 || alive {
                    assert_eq!(walk(&p, s).is_some(), alive, "{source} {min}..={max} prefix {s:?}");
                }
            }
        }
    }
}

/// One budget for a request's analyses: lengths that each fit alone may
/// not together.
#[test]
fn analyses_share_a_budget() {
    let mut work = MAX_WORK;
    let how = PatternUse::Json { min: 0, max: 100_000 };
    let mut made = 0;
    while Pattern::within(&["a"], how, &mut work).is_ok() {
        made += 1;
        assert!(made < 100, "the budget never ran out");
    }
    assert!(made >= 1);
}

/// Random patterns of regex syntax's characters never panic the
/// translation or the compiler, and whatever compiles has a match.
#[test]
fn random_patterns_compile_or_are_refused() {
    let alphabet: Vec<char> = r"ab.*+?|()[]^$\{},-0123dDwWsSbBuxkpP:<=!".chars().collect();
    let mut next = super::super::picker(0x853c_49e6_748f_ea9b);
    let mut compiled = 0;
    for _ in 0..20000 {
        let len = 1 + next(16);
        let source: String = (0..len).map(|_| alphabet[next(alphabet.len())]).collect();
        for how in [PatternUse::Whole, PatternUse::Json { min: 0, max: 8 }] {
            if let Ok(p) = Pattern::new(&source, how) {
                compiled += 1;
                // Some byte or the end is allowed at the start: no dead end.
                assert!(p.accepts(p.start(), 0) || can_go_on(&p, p.start(), 0), "{source:?} {how:?}");
            }
        }
    }
    assert!(compiled > 2000, "only {compiled} compiled");
}
