//! Runs of free text: where a grammar's state is one that every character
//! of a set leaves as it is (a JSON string's content, a GBNF `[^"]*`), any
//! token made of those characters is allowed whatever else the state holds,
//! so the vocabulary walk accepts whole subtrees of the trie at once
//! (`Trie::walk`) instead of stepping each of their bytes.

use super::lex::{str_step, StrMode, StrStep};

/// A set of characters: the ASCII ones whose bits `ascii` sets and, if
/// `non_ascii`, every other code point (well-formed UTF-8).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct CharSet {
    pub ascii: u128,
    pub non_ascii: bool,
}

impl CharSet {
    /// A JSON string's plain content: no quote, backslash or control character.
    pub const JSON_STRING: CharSet =
        CharSet { ascii: (u128::MAX << 0x20) & !(1 << b'"') & !(1 << b'\\'), non_ascii: true };

    /// Whether the set holds anything at all.
    pub fn is_empty(self) -> bool {
        self.ascii == 0 && !self.non_ascii
    }
}

/// Where an output stands in a run of free text: the run's characters, and
/// where it is among them (between characters, [`StrMode::Plain`], or partway
/// through a multi-byte one, [`StrMode::Utf8`]).
#[derive(Clone, Copy, Debug)]
pub(crate) struct FreeRun {
    pub chars: CharSet,
    pub sub: StrMode,
}

/// Byte `b` of a run of `chars` at `sub`: where it leaves the run's
/// position, or `None` where it leaves the run (a character outside the set,
/// or ill-formed UTF-8).
pub(crate) fn run_step(chars: CharSet, sub: StrMode, b: u8) -> Option<StrMode> {
    match sub {
        StrMode::Plain if b < 0x80 => (chars.ascii >> b & 1 == 1).then_some(StrMode::Plain),
        StrMode::Plain if !chars.non_ascii => None,
        StrMode::Plain | StrMode::Utf8 { .. } => match str_step(sub, b)? {
            StrStep::In(next) => Some(next),
            StrStep::End => None,
        },
        _ => None,
    }
}

#[cfg(test)]
#[path = "free_run_tests.rs"]
mod walk_tests;

#[cfg(test)]
mod tests {
    use super::super::lex::UTF8_CLASSES;
    use super::*;

    /// JSON strings' set steps as a string's content does.
    #[test]
    fn json_string_set_is_string_content() {
        for &sub in &UTF8_CLASSES {
            for b in 0..=255u8 {
                let content = match str_step(sub, b) {
                    Some(StrStep::In(next)) if next == StrMode::Plain || matches!(next, StrMode::Utf8 { .. }) => {
                        Some(next)
                    }
                    _ => None,
                };
                assert_eq!(run_step(CharSet::JSON_STRING, sub, b), content, "{sub:?} {b:#x}");
            }
        }
    }

    /// A set without non-ASCII characters refuses every lead byte; one with
    /// them takes exactly the well-formed ones.
    #[test]
    fn non_ascii_characters_all_or_none() {
        let digits = CharSet { ascii: 0x3ff << b'0', non_ascii: false };
        assert!(run_step(digits, StrMode::Plain, b'7').is_some() && run_step(digits, StrMode::Plain, b'a').is_none());
        assert!((0x80..=0xff).all(|b| run_step(digits, StrMode::Plain, b).is_none()));
        let any = CharSet { ascii: 0, non_ascii: true };
        let e = run_step(any, StrMode::Plain, 0xc3).unwrap();
        assert_eq!(run_step(any, e, 0xa9), Some(StrMode::Plain));
        assert!(run_step(any, StrMode::Plain, 0xc0).is_none() && run_step(any, StrMode::Plain, b'a').is_none());
        assert!(CharSet { ascii: 0, non_ascii: false }.is_empty() && !digits.is_empty());
    }
}
