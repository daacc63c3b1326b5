//! Incremental detokenization: token bytes in, complete UTF-8 text out.
//!
//! Byte-level tokenizers split characters across tokens (an emoji can take
//! four tokens), so bytes are buffered until they form whole characters.

use ferrite_loader::tokenizer::Tokenizer;

/// Turns a stream of token byte strings into text without ever emitting half
/// a character. Holds at most the 3 bytes of an unfinished character.
#[derive(Clone, Debug, Default)]
pub struct IncrementalDetokenizer {
    pending: Vec<u8>,
}

impl IncrementalDetokenizer {
    pub fn new() -> Self {
        Self::default()
    }

    /// Starting inside a character whose first bytes (`pending`) were the
    /// prompt's (`Tokenizer::unfinished_tail`).
    pub fn resuming(pending: Vec<u8>) -> Self {
        Self { pending }
    }

    /// For the output after `prompt`: it finishes the character the prompt
    /// stops inside of (a prompt of token ids may), unless the output is
    /// `constrained` (a grammar's output starts at a whole character, so
    /// those bytes would never be finished).
    pub fn after(tok: &Tokenizer, prompt: &[u32], constrained: bool) -> Self {
        if constrained {
            return Self::new();
        }
        Self::resuming(tok.unfinished_tail(prompt))
    }

    /// Bytes of the next token; returns the text they complete. Invalid
    /// sequences become U+FFFD as soon as no continuation could fix them,
    /// with the same replacement rule as `String::from_utf8_lossy`.
    pub fn push(&mut self, bytes: &[u8]) -> String {
        self.pending.extend_from_slice(bytes);
        let mut out = String::with_capacity(self.pending.len());
        let mut rest: &[u8] = &self.pending;
        let incomplete = loop {
            match std::str::from_utf8(rest) {
                Ok(text) => {
                    out.push_str(text);
                    break 0;
                }
                Err(e) => {
                    let (valid, after) = rest.split_at(e.valid_up_to());
                    out.push_str(&String::from_utf8_lossy(valid));
                    match e.error_len() {
                        Some(bad) => {
                            out.push(char::REPLACEMENT_CHARACTER);
                            rest = &after[bad..];
                        }
                        // A valid prefix of a character cut off by the end.
                        None => break after.len(),
                    }
                }
            }
        };
        let done = self.pending.len() - incomplete;
        self.pending.drain(..done);
        out
    }

    /// End of stream: an unfinished character becomes U+FFFD.
    pub fn flush(&mut self) -> String {
        let out = String::from_utf8_lossy(&self.pending).into_owned();
        self.pending.clear();
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ascii_passes_straight_through() {
        let mut d = IncrementalDetokenizer::new();
        assert_eq!(d.push(b"Hello"), "Hello");
        assert_eq!(d.push(b", world"), ", world");
        assert_eq!(d.push(b""), "");
        assert_eq!(d.flush(), "");
    }

    #[test]
    fn emoji_split_over_four_pushes() {
        let bytes = "🦀".as_bytes();
        assert_eq!(bytes.len(), 4);
        let mut d = IncrementalDetokenizer::new();
        assert_eq!(d.push(b"a"), "a");
        assert_eq!(d.push(&bytes[..1]), "");
        assert_eq!(d.push(&bytes[1..2]), "");
        assert_eq!(d.push(&bytes[2..3]), "");
        assert_eq!(d.push(&bytes[3..]), "🦀");
        assert_eq!(d.flush(), "");
    }

    #[test]
    fn split_characters_mixed_with_text() {
        // "é" = C3 A9, "日" = E6 97 A5: the tail of one token starts the next.
        let mut d = IncrementalDetokenizer::new();
        assert_eq!(d.push(&[b'c', b'a', b'f', 0xC3]), "caf");
        assert_eq!(d.push(&[0xA9, b' ', 0xE6, 0x97]), "é ");
        assert_eq!(d.push(&[0xA5, b'!']), "日!");
    }

    #[test]
    fn invalid_bytes_become_replacement_once_certain() {
        let mut d = IncrementalDetokenizer::new();
        // 0xFF can never start a character: replaced at once.
        assert_eq!(d.push(&[b'a', 0xFF, b'b']), "a\u{FFFD}b");
        // A lone continuation byte.
        assert_eq!(d.push(&[0x80]), "\u{FFFD}");
        // A 4-byte lead followed by ASCII: certain only when the ASCII arrives.
        assert_eq!(d.push(&[0xF0, 0x9F]), "");
        assert_eq!(d.push(b"x"), "\u{FFFD}x");
        // E0 80 can never be valid (overlong), so it is replaced without waiting.
        assert_eq!(d.push(&[0xE0, 0x80]), "\u{FFFD}\u{FFFD}");
    }

    #[test]
    fn flush_replaces_unfinished_character() {
        let mut d = IncrementalDetokenizer::new();
        assert_eq!(d.push(&"🦀".as_bytes()[..3]), "");
        assert_eq!(d.flush(), "\u{FFFD}");
        assert_eq!(d.flush(), "");
        assert_eq!(d.push(b"ok"), "ok");
    }

    #[test]
    fn resuming_finishes_the_prompts_character() {
        let crab = "🦀".as_bytes();
        let mut d = IncrementalDetokenizer::resuming(crab[..2].to_vec());
        assert_eq!(d.push(&crab[2..3]), "");
        assert_eq!(d.push(&[crab[3], b'!']), "🦀!");
    }

    #[test]
    fn any_split_matches_lossy_decoding_of_the_whole() {
        let mut bytes = "naïve 日本語 🦀 ok".as_bytes().to_vec();
        bytes.extend_from_slice(&[0xC3, b'x', 0xF0, 0x9F, 0x98, 0xED, 0xA0, 0x80, b'z', 0xE2, 0x82]);
        let want = String::from_utf8_lossy(&bytes).into_owned();
        for step in 1..=5 {
            let mut d = IncrementalDetokenizer::new();
            let mut got = String::new();
            for chunk in bytes.chunks(step) {
                got.push_str(&d.push(chunk));
            }
            got.push_str(&d.flush());
            assert_eq!(got, want, "chunk size {step}");
        }
    }
}
