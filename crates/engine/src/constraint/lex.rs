//! The lexical pieces shared by the JSON grammars: strings (escapes,
//! surrogate pairs, well-formed UTF-8), numbers, and whitespace runs.

/// Longest run of consecutive whitespace bytes allowed between JSON tokens
/// (and before the opening `{`). Small enough that whitespace cannot loop
/// forever, large enough for pretty-printed output: a newline plus 15 bytes
/// of indentation covers 2-space indentation seven levels deep, or 4-space
/// indentation three levels deep.
pub const MAX_WS_RUN: u8 = 16;

pub fn is_ws(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\n' | b'\r')
}

/// Position inside a string.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StrMode {
    /// Between characters.
    Plain,
    /// After `\`.
    Escape,
    /// In `\uXXXX`: `pos` hex digits read, worth `val`; `low` when this escape
    /// must be the low surrogate completing a pair.
    Hex { low: bool, pos: u8, val: u16 },
    /// After a high-surrogate escape: the `\` of its low half.
    LowBackslash,
    /// After a high-surrogate escape and `\`: the `u`.
    LowU,
    /// Inside a multi-byte UTF-8 character: `need` continuation bytes remain and
    /// the next must lie in `lo..=hi` (narrower than `0x80..=0xBF` right after
    /// some lead bytes, which is how overlong forms and surrogates are excluded).
    Utf8 { need: u8, lo: u8, hi: u8 },
}

/// Position inside a number, per `-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Num {
    /// After `-`.
    Minus,
    /// After a leading `0` (no more integer digits may follow).
    Zero,
    /// In the integer part after `[1-9]`.
    Int,
    /// After `.`.
    Dot,
    /// In the fraction digits.
    Frac,
    /// After `e`/`E`.
    Exp,
    /// After the exponent's sign.
    ExpSign,
    /// In the exponent digits.
    ExpInt,
}

/// Where a string's byte leaves it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StrStep {
    /// Still inside, here.
    In(StrMode),
    /// The closing quote.
    End,
}

impl Num {
    /// Whether the number may end here.
    pub fn terminal(self) -> bool {
        matches!(self, Num::Zero | Num::Int | Num::Frac | Num::ExpInt)
    }

    pub fn step(self, b: u8) -> Option<Num> {
        use Num::*;
        Some(match (self, b) {
            (Minus, b'0') => Zero,
            (Minus, b'1'..=b'9') | (Int, b'0'..=b'9') => Int,
            (Zero | Int, b'.') => Dot,
            (Dot | Frac, b'0'..=b'9') => Frac,
            (Zero | Int | Frac, b'e' | b'E') => Exp,
            (Exp, b'+' | b'-') => ExpSign,
            (Exp | ExpSign | ExpInt, b'0'..=b'9') => ExpInt,
            _ => return None,
        })
    }
}

/// A string's one-letter escapes (the letter after `\`) and the bytes
/// they stand for: with `u`, what the `Escape` arm of [`str_step`] takes.
pub const ESCAPES: [(u8, u8); 8] = [
    (b'"', b'"'),
    (b'\\', b'\\'),
    (b'/', b'/'),
    (b'b', 0x08),
    (b'f', 0x0c),
    (b'n', b'\n'),
    (b'r', b'\r'),
    (b't', b'\t'),
];

/// One step of a string: where byte `b` leaves it, or `None` if `b` is invalid here.
pub fn str_step(sub: StrMode, b: u8) -> Option<StrStep> {
    use StrMode::*;
    let sub = match sub {
        Plain => match b {
            b'"' => return Some(StrStep::End),
            b'\\' => Escape,
            0x20..=0x7f => Plain,
            // Lead bytes, with the range of the first continuation byte (RFC 3629 table).
            0xc2..=0xdf => Utf8 { need: 1, lo: 0x80, hi: 0xbf },
            0xe0 => Utf8 { need: 2, lo: 0xa0, hi: 0xbf },
            0xed => Utf8 { need: 2, lo: 0x80, hi: 0x9f },
            0xe1..=0xef => Utf8 { need: 2, lo: 0x80, hi: 0xbf },
            0xf0 => Utf8 { need: 3, lo: 0x90, hi: 0xbf },
            0xf1..=0xf3 => Utf8 { need: 3, lo: 0x80, hi: 0xbf },
            0xf4 => Utf8 { need: 3, lo: 0x80, hi: 0x8f },
            // Control characters, stray continuation bytes, overlong leads, > U+10FFFF.
            _ => return None,
        },
        Utf8 { need, lo, hi } => {
            if !(lo..=hi).contains(&b) {
                return None;
            }
            if need == 1 {
                Plain
            } else {
                Utf8 { need: need - 1, lo: 0x80, hi: 0xbf }
            }
        }
        Escape => match b {
            b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't' => Plain,
            b'u' => Hex { low: false, pos: 0, val: 0 },
            _ => return None,
        },
        LowBackslash if b == b'\\' => LowU,
        LowU if b == b'u' => Hex { low: true, pos: 0, val: 0 },
        LowBackslash | LowU => return None,
        Hex { low, pos, val } => {
            let val = val << 4 | (b as char).to_digit(16)? as u16;
            let pos = pos + 1;
            // Reject at the first digit that rules out valid UTF-16, so that no
            // accepted prefix is a dead end.
            let ok = match (low, pos) {
                (false, 2) => !(0xdc..=0xdf).contains(&val), // a lone low surrogate
                (true, 1) => val == 0xd,
                (true, 2) => (0xdc..=0xdf).contains(&val),
                _ => true,
            };
            if !ok {
                return None;
            }
            if pos < 4 {
                Hex { low, pos, val }
            } else if !low && (0xd800..=0xdbff).contains(&val) {
                LowBackslash
            } else {
                Plain
            }
        }
    };
    Some(StrStep::In(sub))
}

/// The string positions that the content of a string cycles through between
/// escapes: [`StrMode::Plain`] and every [`StrMode::Utf8`] reachable from it.
pub const UTF8_CLASSES: [StrMode; 8] = [
    StrMode::Plain,
    StrMode::Utf8 { need: 1, lo: 0x80, hi: 0xbf },
    StrMode::Utf8 { need: 2, lo: 0xa0, hi: 0xbf },
    StrMode::Utf8 { need: 2, lo: 0x80, hi: 0x9f },
    StrMode::Utf8 { need: 2, lo: 0x80, hi: 0xbf },
    StrMode::Utf8 { need: 3, lo: 0x90, hi: 0xbf },
    StrMode::Utf8 { need: 3, lo: 0x80, hi: 0xbf },
    StrMode::Utf8 { need: 3, lo: 0x80, hi: 0x8f },
];

/// The index of `sub` in [`UTF8_CLASSES`], if it is there.
pub fn utf8_class(sub: StrMode) -> Option<usize> {
    match sub {
        StrMode::Plain | StrMode::Utf8 { .. } => UTF8_CLASSES.iter().position(|&c| c == sub),
        _ => None,
    }
}
