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
const SPACE_ALL: &str = r"\t\n\x0B\x0C\r \xA0\x{1680}\x{2000}-\x{200A}\x{2028}\x{2029}\x{202F}\x{205F}\x{3000}";
/// Whitespace in any of them (Python's separators, Rust's NEL, ECMA-262's BOM too).
const SPACE_ANY: &str =
    r"\t\n\x0B\x0C\r \xA0\x{1680}\x{2000}-\x{200A}\x{2028}\x{2029}\x{202F}\x{205F}\x{3000}\x1C-\x1F\x{85}\x{FEFF}";

/// `p` in Rust's syntax, or why it cannot be followed.
pub fn translate(p: &str, dialect: Dialect) -> Result<String, String> {
    let refuse = |what: &str| Err(format!("pattern {p:?}: {what} is not supported"));
    let chars: Vec<char> = p.chars().collect();
    let mut out = String::with_capacity(p.len() + 16);
    // Inside [...]: whether it is negated.
    let mut class: Option<bool> = None;
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        i += 1;
        match (c, class) {
            ('\\', _) => {
                let Some(&e) = chars.get(i) else { return refuse("a trailing backslash") };
                i += 1;
                let set = match (e, class) {
                    // Classes: narrow where they match, wide where negated.
                    ('d', None) => Some("[0-9]".to_string()),
                    ('d', Some(false)) => Some("0-9".into()),
                    ('d', Some(true)) | ('D', Some(false)) => Some(if e == 'd' { r"\d" } else { r"\D" }.into()),
                    ('D', None) => Some(r"\D".into()),
                    ('D', Some(true)) => Some("[:^digit:]".into()),
                    ('w', None) => Some("[0-9A-Za-z_]".into()),
                    ('w', Some(false)) => Some("0-9A-Za-z_".into()),
                    ('w', Some(true)) => Some(r"\w\p{N}".into()),
                    ('W', None | Some(false)) => Some(r"[^\w\p{N}]".into()),
                    ('W', Some(true)) => Some("[:^word:]".into()),
                    ('s', None) => Some(format!("[{SPACE_ALL}]")),
                    ('s', Some(false)) => Some(SPACE_ALL.into()),
                    ('s', Some(true)) => Some(SPACE_ANY.into()),
                    ('S', None | Some(false)) => Some(format!("[^{SPACE_ANY}]")),
                    ('S', Some(true)) => Some(format!("[^{SPACE_ALL}]")),
                    _ => None,
                };
                if let Some(set) = set {
                    out.push_str(&set);
                    // A class escape ends no range: a `-` after it is itself.
                    if class.is_some() && chars.get(i) == Some(&'-') && chars.get(i + 1) != Some(&']') {
                        out.push_str(r"\x2D");
                        i += 1;
                    }
                    continue;
                }
                match escape(&chars, &mut i, e, class.is_some(), dialect) {
                    Ok(s) => out.push_str(&s),
                    Err(what) => return refuse(&what),
                }
            }
            ('[', Some(_)) => out.push_str(r"\["),
            ('[', None) => {
                let negated = chars.get(i) == Some(&'^');
                i += negated as usize;
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
                            out.push_str(if negated { r"[^\]" } else { r"[\]" });
                            i += 1;
                            class = Some(negated);
                            continue;
                        }
                    }
                }
                out.push_str(if negated { "[^" } else { "[" });
                class = Some(negated);
            }
            (']', Some(_)) => {
                out.push(']');
                class = None;
            }
            ('-', Some(_)) if chars.get(i) == Some(&'-') => return refuse("`--` in a class"),
            // Rust's class set operators are members elsewhere.
            ('&', Some(_)) => out.push_str(r"\x26"),
            ('~', Some(_)) => out.push_str(r"\x7E"),
            ('.', None) if dialect == Dialect::Ecma => out.push_str(r"[^\n\r\x{2028}\x{2029}]"),
            ('(', None) if chars.get(i) == Some(&'?') => {
                let rest: String = chars[i..].iter().take(4).collect();
                if ["?=", "?!", "?<=", "?<!"].iter().any(|l| rest.starts_with(l)) {
                    return refuse("look-around");
                }
                if rest.starts_with("?P=") {
                    return refuse("a backreference");
                }
                out.push('(');
            }
            ('{', None) => match quantifier(&chars[i..]) {
                Some((text, len)) => {
                    out.push_str(&text);
                    i += len;
                }
                None => out.push_str(r"\{"),
            },
            ('}', None) => out.push_str(r"\}"),
            _ => out.push(c),
        }
    }
    if class.is_some() {
        return refuse("an unclosed class");
    }
    Ok(out)
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
                let hex: String = chars.get(at..at + 4)?.iter().collect();
                u32::from_str_radix(&hex, 16).ok().filter(|_| hex.len() == 4)
            };
            let hi = unit(*i).ok_or(r"`\u` without four hex digits")?;
            *i += 4;
            // ECMA-262 writes characters past U+FFFF as surrogate pairs.
            let code = if (0xd800..0xdc00).contains(&hi) {
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
        'p' | 'P' if !python => format!(r"\{e}"),
        _ => return Err(format!("the escape `\\{e}`")),
    })
}

/// A repetition `{n}`, `{n,}` or `{n,m}` (Python's `{,m}` too) at the start
/// of `rest` (past the `{`): its text and how many characters it takes;
/// `None` where the `{` is a literal.
fn quantifier(rest: &[char]) -> Option<(String, usize)> {
    let end = rest.iter().position(|&c| c == '}')?;
    let body: String = rest[..end].iter().collect();
    let (lo, hi) = match body.split_once(',') {
        Some((lo, hi)) => (lo, Some(hi)),
        None => (body.as_str(), None),
    };
    let digits = |s: &str| !s.is_empty() && s.chars().all(|c| c.is_ascii_digit());
    let ok = match hi {
        None => digits(lo),
        Some(hi) => (lo.is_empty() || digits(lo)) && (hi.is_empty() || digits(hi)) && !(lo.is_empty() && hi.is_empty()),
    };
    if !ok {
        return None;
    }
    let lo = if lo.is_empty() { "0" } else { lo };
    Some((format!("{{{lo}{}}}", hi.map(|h| format!(",{h}")).unwrap_or_default()), end + 1))
}

/// The pattern a JSON Schema `format` stands for, for the formats whose
/// values a pattern fixes exactly: RFC 3339 dates (each month's days, leap
/// years, no year 0000) and times (no leap second), UUIDs and IPv4.
pub fn format_pattern(format: &str) -> Option<String> {
    const YEAR: &str = "([0-9]{3}[1-9]|[0-9]{2}[1-9][0-9]|[0-9][1-9][0-9]{2}|[1-9][0-9]{3})";
    const LEAP: &str = "([0-9]{2}(0[48]|[2468][048]|[13579][26])|(0[48]|[2468][048]|[13579][26])00)";
    const MONTH_DAY: &str =
        "((0[13578]|1[02])-(0[1-9]|[12][0-9]|3[01])|(0[469]|11)-(0[1-9]|[12][0-9]|30)|02-(0[1-9]|1[0-9]|2[0-8]))";
    const TIME: &str = r"([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](\.[0-9]{1,9})?(Z|[+-]([01][0-9]|2[0-3]):[0-5][0-9])";
    const OCTET: &str = "(25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])";
    let date = format!("({YEAR}-{MONTH_DAY}|{LEAP}-02-29)");
    Some(match format {
        "date-time" => format!("^{date}T{TIME}$"),
        "date" => format!("^{date}$"),
        "time" => format!("^{TIME}$"),
        "uuid" => "^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$".into(),
        "ipv4" => format!(r"^{OCTET}(\.{OCTET}){{3}}$"),
        _ => return None,
    })
}
