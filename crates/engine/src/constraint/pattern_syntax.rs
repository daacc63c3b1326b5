//! Patterns as users write them (ECMA-262 for JSON Schema's `pattern`,
//! Python's `re` for vLLM's `guided_regex`) in the syntax the automaton
//! builder reads (Rust's `regex`), and the patterns JSON Schema's
//! `format`s stand for.
//!
//! Where the dialects give a class different members (`\d`, `\w`, `\s`,
//! `.`), the translation keeps only what all of them agree on: an output
//! that matches the translation matches the original under ECMA-262,
//! Python and Rust alike. So a class is narrowed where it matches and
//! widened where it is excluded (under `[^...]` and the negated escapes).
//! What the automaton cannot follow (look-around, backreferences, Python's
//! Unicode word boundaries) is refused by name.

/// The syntax a pattern is written in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dialect {
    /// ECMA-262 (JSON Schema), as validators compile it (with the `u` flag).
    Ecma,
    /// Python's `re` (vLLM's `guided_regex`).
    Python,
}

/// Whitespace in all three dialects.
const SPACE_ALL: &str = r"\t\n\x0B\x0C\r\x20\xA0\x{1680}\x{2000}-\x{200A}\x{2028}\x{2029}\x{202F}\x{205F}\x{3000}";
/// Whitespace in any of them (Python's separators, Rust's NEL, ECMA-262's BOM too).
const SPACE_ANY: &str =
    r"\t\n\x0B\x0C\r\x20\xA0\x{1680}\x{2000}-\x{200A}\x{2028}\x{2029}\x{202F}\x{205F}\x{3000}\x1C-\x1F\x{85}\x{FEFF}";

/// `p` in Rust's syntax, or why it cannot be followed.
pub fn translate(p: &str, dialect: Dialect) -> Result<String, String> {
    let refuse = |what: &str| Err(format!("pattern {p:?}: {what} is not supported"));
    let chars: Vec<char> = p.chars().collect();
    let mut out = String::with_capacity(p.len() + 16);
    // Inside [...]: whether it is negated, its members so far, and whether
    // the last was a `-` between two of them (a range).
    let mut class: Option<bool> = None;
    let (mut members, mut range_dash) = (0usize, false);
    // Right after a quantifier (1), or after its lazy `?` (2).
    let mut quantified = 0u8;
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        i += 1;
        if let Some(negated) = class {
            let was_range = std::mem::replace(&mut range_dash, false);
            members += 1;
            match c {
                '\\' => {
                    let Some(&e) = chars.get(i) else { return refuse("a trailing backslash") };
                    i += 1;
                    if let Some(set) = class_set(e, negated) {
                        // (Neither dialect takes a class as a range's end.)
                        if was_range || (chars.get(i) == Some(&'-') && chars.get(i + 1) != Some(&']')) {
                            return refuse("a range to or from a class escape");
                        }
                        out.push_str(&set);
                        continue;
                    }
                    match escape(&chars, &mut i, e, true, dialect) {
                        Ok(s) => out.push_str(&s),
                        Err(what) => return refuse(&what),
                    }
                }
                ']' => {
                    out.push(']');
                    class = None;
                }
                '-' if chars.get(i) == Some(&'-') => return refuse("`--` in a class"),
                '-' => {
                    range_dash = members > 1 && chars.get(i) != Some(&']');
                    out.push('-');
                }
                // Rust's nested classes and set operators are members here.
                '[' => out.push_str(r"\x5B"),
                '&' => out.push_str(r"\x26"),
                '~' => out.push_str(r"\x7E"),
                _ if c.is_whitespace() || c == '#' => out.push_str(&format!(r"\x{{{:X}}}", c as u32)),
                _ => out.push(c),
            }
            continue;
        }
        let quantifier_here = match c {
            '*' | '+' | '?' => Some((c.to_string(), 0)),
            '{' => quantifier(&chars[i..], dialect),
            _ => None,
        };
        if let Some((text, len)) = quantifier_here {
            match (quantified, c) {
                (1, '?') => quantified = 2,
                (0, _) => quantified = 1,
                _ => return refuse("a quantifier after a quantifier (possessive or nested)"),
            }
            out.push_str(&text);
            i += len;
            continue;
        }
        quantified = 0;
        match c {
            '\\' => {
                let Some(&e) = chars.get(i) else { return refuse("a trailing backslash") };
                i += 1;
                // (Outside a class, a class escape is a class of those members.)
                if let Some(set) = class_set(e, false) {
                    out.push_str(&format!("[{set}]"));
                    continue;
                }
                match escape(&chars, &mut i, e, false, dialect) {
                    Ok(s) => out.push_str(&s),
                    Err(what) => return refuse(&what),
                }
            }
            '[' => {
                let negated = chars.get(i) == Some(&'^');
                i += negated as usize;
                (members, range_dash) = (0, false);
                if chars.get(i) == Some(&']') {
                    match (dialect, negated) {
                        // ECMA-262: `[]` matches nothing, `[^]` anything.
                        (Dialect::Ecma, true) => {
                            out.push_str("(?s:.)");
                            i += 1;
                            continue;
                        }
                        (Dialect::Ecma, false) => return refuse("the empty class `[]`"),
                        // Python: a `]` first is a member.
                        (Dialect::Python, _) => {
                            out.push_str(if negated { r"[^\x5D" } else { r"[\x5D" });
                            i += 1;
                            members = 1;
                            class = Some(negated);
                            continue;
                        }
                    }
                }
                out.push_str(if negated { "[^" } else { "[" });
                class = Some(negated);
            }
            '.' if dialect == Dialect::Ecma => out.push_str(r"[^\n\r\x{2028}\x{2029}]"),
            '(' if chars.get(i) == Some(&'?') => {
                if let Err(what) = group(&chars[i..], dialect) {
                    return refuse(&what);
                }
                out.push('(');
            }
            // (A brace that starts no repetition is itself.)
            '{' => out.push_str(r"\{"),
            '}' => out.push_str(r"\}"),
            // (Rust's verbose mode is never on; still, nothing it would skip.)
            _ if c.is_whitespace() || c == '#' => out.push_str(&format!(r"\x{{{:X}}}", c as u32)),
            _ => out.push(c),
        }
    }
    if class.is_some() {
        return refuse("an unclosed class");
    }
    Ok(out)
}

/// A class escape (`\d`, `\D`, `\w`, `\W`, `\s`, `\S`) as members of a
/// class: the narrowest dialect's set where the class matches them, the
/// widest's where it is `negated`.
fn class_set(e: char, negated: bool) -> Option<String> {
    Some(match (e, negated) {
        ('d', false) => "0-9".into(),
        ('d', true) => r"\d".into(),
        ('D', false) => r"\D".into(),
        ('D', true) => "[:^digit:]".into(),
        ('w', false) => "0-9A-Za-z_".into(),
        ('w', true) => r"\w\p{N}".into(),
        ('W', false) => r"[^\w\p{N}]".into(),
        ('W', true) => "[:^word:]".into(),
        ('s', false) => SPACE_ALL.into(),
        ('s', true) => SPACE_ANY.into(),
        ('S', false) => format!("[^{SPACE_ANY}]"),
        ('S', true) => format!("[^{SPACE_ALL}]"),
        _ => return None,
    })
}

/// A `(?` group's head (`rest` starts at the `?`): a plain or named group,
/// or (Python) the flags `s` and `m`; look-around, backreferences and
/// other flags (`i` folds case apart from Rust, `x` reads spaces apart) are
/// refused.
fn group(rest: &[char], dialect: Dialect) -> Result<(), String> {
    let head: String = rest.iter().take(4).collect();
    if ["?=", "?!", "?<=", "?<!"].iter().any(|l| head.starts_with(l)) {
        return Err("look-around".into());
    }
    if head.starts_with("?P=") {
        return Err("a backreference".into());
    }
    if head.starts_with("?:") || head.starts_with("?<") || (dialect == Dialect::Python && head.starts_with("?P<")) {
        return Ok(());
    }
    let flags: String = rest[1..].iter().take_while(|&&c| c != ')' && c != ':').collect();
    match flags.chars().find(|&f| dialect == Dialect::Ecma || !matches!(f, 's' | 'm' | '-')) {
        Some(f) => Err(format!("the inline flag `{f}`")),
        None => Ok(()),
    }
}

/// An escape other than a class (`\` and `e` read; `i` past `e`).
fn escape(chars: &[char], i: &mut usize, e: char, in_class: bool, dialect: Dialect) -> Result<String, String> {
    let python = dialect == Dialect::Python;
    Ok(match e {
        // Punctuation (and space) stands for itself: written so that Rust
        // reads no operator into it (`\<`, `\>` are its word boundaries).
        _ if e.is_ascii_punctuation() || e == ' ' => format!(r"\x{:02X}", e as u32),
        'b' if in_class => r"\x08".into(),
        'b' | 'B' if python => return Err("a word boundary in a Python pattern (Unicode words)".into()),
        'b' | 'B' => format!(r"(?-u:\{e})"),
        'n' | 'r' | 't' | 'f' | 'v' => format!(r"\{e}"),
        'a' if python => r"\x07".into(),
        'A' if python && !in_class => r"\A".into(),
        'Z' if python && !in_class => r"\z".into(),
        '0' if !chars.get(*i).is_some_and(char::is_ascii_digit) => r"\x00".into(),
        '0'..='9' => return Err("a backreference (or octal escape)".into()),
        'k' if chars.get(*i) == Some(&'<') => return Err("a backreference".into()),
        'x' => {
            let hex: String = chars.get(*i..*i + 2).unwrap_or(&[]).iter().collect();
            if hex.len() != 2 || !hex.chars().all(|h| h.is_ascii_hexdigit()) {
                return Err(r"`\x` without two hex digits".into());
            }
            *i += 2;
            format!(r"\x{hex}")
        }
        'u' if chars.get(*i) == Some(&'{') && !python => {
            let end = chars[*i..].iter().position(|&c| c == '}').ok_or("an unclosed `\\u{`")?;
            let hex: String = chars[*i + 1..*i + end].iter().collect();
            *i += end + 1;
            format!(r"\x{{{hex}}}")
        }
        'u' => {
            let unit = |at: usize| -> Option<u32> {
                let hex = chars.get(at..at + 4)?;
                let value = hex.iter().fold(0, |v, h| v << 4 | h.to_digit(16).unwrap_or(0));
                hex.iter().all(char::is_ascii_hexdigit).then_some(value)
            };
            let hi = unit(*i).ok_or(r"`\u` without four hex digits")?;
            *i += 4;
            // ECMA-262 writes characters past U+FFFF as surrogate pairs.
            let code = if (0xd800..0xe000).contains(&hi) && python {
                return Err("a surrogate".into());
            } else if (0xd800..0xdc00).contains(&hi) {
                let lo = (chars.get(*i..*i + 2) == Some(&['\\', 'u'])).then(|| unit(*i + 2)).flatten();
                let lo = lo.filter(|lo| (0xdc00..0xe000).contains(lo)).ok_or("a lone surrogate")?;
                *i += 6;
                0x10000 + ((hi - 0xd800) << 10) + (lo - 0xdc00)
            } else if (0xdc00..0xe000).contains(&hi) {
                return Err("a lone surrogate".into());
            } else {
                hi
            };
            format!(r"\x{{{code:X}}}")
        }
        'c' if !python && chars.get(*i).is_some_and(char::is_ascii_alphabetic) => {
            let letter = chars[*i];
            *i += 1;
            format!(r"\x{:02X}", letter as u32 % 32)
        }
        'p' | 'P' if !python && chars.get(*i) == Some(&'{') => {
            let end = chars[*i..].iter().position(|&c| c == '}').ok_or("an unclosed `\\p{`")?;
            let name: String = chars[*i + 1..*i + end].iter().collect();
            if name.is_empty() || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '=') {
                return Err(format!("the property `{name}`"));
            }
            *i += end + 1;
            format!(r"\{e}{{{name}}}")
        }
        _ => return Err(format!("the escape `\\{e}`")),
    })
}

/// A repetition `{n}`, `{n,}` or `{n,m}` (Python's `{,m}`, `{,}` too) at the start
/// of `rest` (past the `{`): its text and how many characters it takes;
/// `None` where the `{` is a literal.
fn quantifier(rest: &[char], dialect: Dialect) -> Option<(String, usize)> {
    let end = rest.iter().position(|&c| c == '}')?;
    let body: String = rest[..end].iter().collect();
    let (lo, hi) = match body.split_once(',') {
        Some((lo, hi)) => (lo, Some(hi)),
        None => (body.as_str(), None),
    };
    let digits = |s: &str| !s.is_empty() && s.chars().all(|c| c.is_ascii_digit());
    // (`{,m}` and `{,}` are Python's; to ECMA-262 they are literals.)
    let python = dialect == Dialect::Python;
    let ok = match hi {
        None => digits(lo),
        Some(hi) => (digits(lo) || (python && lo.is_empty())) && (hi.is_empty() || digits(hi)),
    };
    if !ok {
        return None;
    }
    let lo = if lo.is_empty() { "0" } else { lo };
    Some((format!("{{{lo}{}}}", hi.map(|h| format!(",{h}")).unwrap_or_default()), end + 1))
}

/// The longest a string of JSON Schema `format` may be, where its pattern
/// does not bound it.
pub fn format_max_len(format: &str) -> u32 {
    match format {
        "hostname" => 253,
        "email" => 254,
        _ => u32::MAX,
    }
}

/// The patterns a JSON Schema `format` stands for (a string of it matches
/// each): RFC 3339 dates (each month's days, leap years, no year 0000),
/// times (no leap second) and durations, UUIDs, IPv4 and IPv6 addresses,
/// host names, email addresses, URIs and URI references, JSON pointers
/// (RFC 6901) and relative ones.
pub fn format_pattern(format: &str) -> Option<Vec<String>> {
    if format == "email" {
        // (Its local part's 64 characters: a second pattern, since one
        // cannot count a dot-atom's characters.)
        // (ASCII, as the first has it: fewer automaton states.)
        return Some(vec![email_pattern(), r"^[\x21-\x3f\x41-\x7e]{1,64}@".into()]);
    }
    one_format_pattern(format).map(|p| vec![p])
}

/// An address as email validators take it: a dot-atom local part at a
/// domain name whose last label is letters or punycode (the whole's 254
/// characters by `format_max_len`).
fn email_pattern() -> String {
    const ATOM: &str = "[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]";
    format!("^{ATOM}+(\\.{ATOM}+)*@({LABEL}\\.)+([A-Za-z]{{2,63}}|xn--[A-Za-z0-9-]{{0,58}}[A-Za-z0-9])$")
}

/// A host name's label: 1-63 letters, digits and inner hyphens.
const LABEL: &str = "[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?";

/// The one pattern of each format but `email`.
fn one_format_pattern(format: &str) -> Option<String> {
    const YEAR: &str = "([0-9]{3}[1-9]|[0-9]{2}[1-9][0-9]|[0-9][1-9][0-9]{2}|[1-9][0-9]{3})";
    const LEAP: &str = "([0-9]{2}(0[48]|[2468][048]|[13579][26])|(0[48]|[2468][048]|[13579][26])00)";
    const MONTH_DAY: &str =
        "((0[13578]|1[02])-(0[1-9]|[12][0-9]|3[01])|(0[469]|11)-(0[1-9]|[12][0-9]|30)|02-(0[1-9]|1[0-9]|2[0-8]))";
    const TIME: &str = r"([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](\.[0-9]{1,9})?(Z|[+-]([01][0-9]|2[0-3]):[0-5][0-9])";
    const OCTET: &str = "(25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])";
    // (A top-level label starts with a letter: never all digits.)
    const TOP: &str = "[A-Za-z]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?";
    // RFC 3986's unreserved characters and sub-delimiters, in a class.
    const URI_CHARS: &str = r"A-Za-z0-9\-._~!$&'()*+,;=";
    let date = format!("({YEAR}-{MONTH_DAY}|{LEAP}-02-29)");
    Some(match format {
        "date-time" => format!("^{date}T{TIME}$"),
        "date" => format!("^{date}$"),
        "time" => format!("^{TIME}$"),
        "uuid" => "^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$".into(),
        "ipv4" => format!(r"^{OCTET}(\.{OCTET}){{3}}$"),
        // (The eight groups written out or one run of them shortened to
        // `::`; no IPv4 tail, no zone.)
        "ipv6" => {
            let h = "[0-9a-fA-F]{1,4}";
            // (l groups before the `::`, at most 7 - l after it.)
            let shortened = (0..=7)
                .map(|l: usize| match l {
                    0 => format!("::({h}(:{h}){{0,6}})?"),
                    7 => format!("({h}:){{7}}:"),
                    l => format!("({h}:){{{l}}}:({h}(:{h}){{0,{}}})?", 6 - l),
                })
                .collect::<Vec<_>>()
                .join("|");
            format!("^(({h}:){{7}}{h}|{shortened})$")
        }
        // RFC 1123 host names: labels of 1-63 letters, digits and inner
        // hyphens, the last starting with a letter (the whole's 253
        // characters by `format_max_len`).
        "hostname" => format!("^({LABEL}\\.)*{TOP}$"),
        // RFC 3986's URI: a scheme, a hierarchical part (an authority of
        // user, registered name and port, or a path, maybe empty), a query,
        // a fragment; no IP literals. A reference is a URI or a relative one
        // (the same parts without the scheme, a first segment with no colon).
        "uri" | "uri-reference" => {
            let pct = "%[0-9A-Fa-f]{2}";
            let pchar = format!("([{URI_CHARS}:@]|{pct})");
            let user = format!("([{URI_CHARS}:]|{pct})*@");
            let authority = format!("({user})?([{URI_CHARS}]|{pct})*(:[0-9]*)?");
            let segments = format!("(/{pchar}*)*");
            let hier = format!("(//{authority}{segments}|/({pchar}+{segments})?|{pchar}+{segments}|)");
            let tail = format!("([{URI_CHARS}:@/?]|{pct})*");
            let ends = format!("(\\?{tail})?(#{tail})?");
            let uri = format!("[A-Za-z][A-Za-z0-9+.\\-]*:{hier}{ends}");
            if format == "uri" {
                return Some(format!("^{uri}$"));
            }
            let no_colon = format!("([{URI_CHARS}@]|{pct})");
            let relative = format!("(//{authority}{segments}|/({pchar}+{segments})?|{no_colon}+{segments}|){ends}");
            format!("^({uri}|{relative})$")
        }
        // RFC 3339's durations (its appendix A): years, months and days in
        // that order, each with the rest after it optional, then a time;
        // or weeks alone.
        "duration" => {
            let n = "[0-9]+";
            let date = format!("({n}Y({n}M({n}D)?)?|{n}M({n}D)?|{n}D)");
            let time = format!("T({n}H({n}M({n}S)?)?|{n}M({n}S)?|{n}S)");
            format!("^P({n}W|{date}({time})?|{time})$")
        }
        "json-pointer" => "^(/([^/~]|~[01])*)*$".into(),
        // (Levels up, then an index moved by `+n` or `-n`, then `#` or a
        // pointer: draft-bhutton-relative-json-pointer-00, JSON Schema
        // 2020-12's.)
        "relative-json-pointer" => "^(0|[1-9][0-9]*)([+-][1-9][0-9]*)?(#|(/([^/~]|~[01])*)*)$".into(),
        _ => return None,
    })
}
