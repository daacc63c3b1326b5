//! Stop strings over streamed text: emit as early as is safe, hold back only
//! what could still turn into a stop string, and cut before a match.

/// Watches decoded text for stop strings, OpenAI-style: the stop string
/// itself is never emitted.
#[derive(Clone, Debug)]
pub struct StopChecker {
    stops: Vec<String>,
    /// Longest stop string in bytes; bounds how much text is ever held back.
    max_len: usize,
    /// Text seen but not yet emitted: a suffix that is a proper prefix of a stop string.
    pending: String,
    /// The stop string that matched, once one has.
    matched: Option<usize>,
}

impl StopChecker {
    /// Empty stop strings are ignored (they would match before any text).
    pub fn new(stop_strings: Vec<String>) -> Self {
        let stops: Vec<String> = stop_strings.into_iter().filter(|s| !s.is_empty()).collect();
        let max_len = stops.iter().map(String::len).max().unwrap_or(0);
        StopChecker { stops, max_len, pending: String::new(), matched: None }
    }

    /// Whether a stop string has matched; later pushes emit nothing.
    pub fn is_stopped(&self) -> bool {
        self.matched.is_some()
    }

    /// The stop string that matched, if one has.
    pub fn matched(&self) -> Option<&str> {
        self.matched.map(|i| self.stops[i].as_str())
    }

    /// Feed newly decoded text; returns (text safe to emit now, stopped).
    /// On a match the text before the earliest stop string is returned with
    /// `stopped = true`, and everything after it is dropped.
    pub fn push(&mut self, text: &str) -> (String, bool) {
        if self.is_stopped() {
            return (String::new(), true);
        }
        self.pending.push_str(text);
        if let Some((at, which)) = self.earliest_match() {
            self.pending.truncate(at);
            self.matched = Some(which);
            return (std::mem::take(&mut self.pending), true);
        }
        let keep = self.held_back_len();
        let rest = self.pending.split_off(self.pending.len() - keep);
        (std::mem::replace(&mut self.pending, rest), false)
    }

    /// At end of generation: whatever was held back (nothing after a stop).
    pub fn flush(&mut self) -> String {
        std::mem::take(&mut self.pending)
    }

    /// At end of generation, with the detokenizer's last bytes: the text
    /// still to emit (up to a stop string they complete, if any).
    pub fn finish(&mut self, tail: &str) -> String {
        self.push(tail).0 + &self.flush()
    }

    /// Byte offset of the earliest stop string in `pending`, and which one
    /// (the first listed, at a tie). Held-back text never contains a whole
    /// match, so only the new text can complete one.
    fn earliest_match(&self) -> Option<(usize, usize)> {
        self.stops.iter().enumerate().filter_map(|(i, s)| Some((self.pending.find(s.as_str())?, i))).min()
    }

    /// Length of the longest suffix of `pending` that begins some stop
    /// string. With no full match present, such a suffix is a proper prefix.
    fn held_back_len(&self) -> usize {
        let longest = self.max_len.saturating_sub(1).min(self.pending.len());
        (1..=longest)
            .rev()
            .find(|&len| {
                let start = self.pending.len() - len;
                self.pending.is_char_boundary(start) && self.stops.iter().any(|s| s.starts_with(&self.pending[start..]))
            })
            .unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn checker(stops: &[&str]) -> StopChecker {
        StopChecker::new(stops.iter().map(|s| s.to_string()).collect())
    }

    /// Pushes every piece, collecting the emitted text until a stop.
    fn run(stops: &[&str], pieces: &[&str]) -> (String, bool) {
        let mut c = checker(stops);
        let mut out = String::new();
        for p in pieces {
            let (text, stopped) = c.push(p);
            out.push_str(&text);
            if stopped {
                assert_eq!(c.flush(), "");
                return (out, true);
            }
        }
        out.push_str(&c.flush());
        (out, false)
    }

    #[test]
    fn no_stops_passes_everything_through() {
        let mut c = checker(&[]);
        assert_eq!(c.push("hello"), ("hello".to_string(), false));
        assert_eq!(c.flush(), "");
        let mut c = checker(&[""]);
        assert_eq!(c.push("x"), ("x".to_string(), false));
    }

    #[test]
    fn the_matched_stop_string_is_known() {
        let mut c = checker(&["xyz", "b", "ab"]);
        assert_eq!(c.matched(), None);
        // The earliest match wins; at the same place, the first listed.
        assert_eq!(c.push("1 ab xyz"), ("1 ".to_string(), true));
        assert_eq!(c.matched(), Some("ab"));
        let mut c = checker(&["b", "ab"]);
        c.push("zab");
        assert_eq!(c.matched(), Some("ab"));
        let mut c = checker(&["ab", "a"]);
        c.push("ab");
        assert_eq!(c.matched(), Some("ab"));
    }

    #[test]
    fn match_within_one_push() {
        assert_eq!(run(&["END"], &["abc END def"]), ("abc ".to_string(), true));
        assert_eq!(run(&["END"], &["END"]), (String::new(), true));
    }

    #[test]
    fn stop_split_across_pushes_is_held_back_then_cut() {
        let mut c = checker(&["</s>"]);
        assert_eq!(c.push("Hello <"), ("Hello ".to_string(), false));
        assert_eq!(c.push("/"), (String::new(), false));
        assert_eq!(c.push("s> tail"), (String::new(), true));
        assert!(c.is_stopped());
        assert_eq!(c.push("more"), (String::new(), true));
        assert_eq!(c.flush(), "");
        assert_eq!(run(&["</s>"], &["a", "<", "/", "s", ">", "b"]), ("a".to_string(), true));
    }

    #[test]
    fn false_start_is_released() {
        let mut c = checker(&["</s>"]);
        assert_eq!(c.push("x </"), ("x ".to_string(), false));
        assert_eq!(c.push("b> y"), ("</b> y".to_string(), false));
        assert_eq!(c.push("<"), (String::new(), false));
        assert_eq!(c.flush(), "<");
    }

    #[test]
    fn overlapping_prefixes() {
        // "aab" inside "aaab": the first 'a' is safe, the match starts at 1.
        let mut c = checker(&["aab"]);
        assert_eq!(c.push("xaa"), ("x".to_string(), false));
        assert_eq!(c.push("a"), ("a".to_string(), false));
        assert_eq!(c.push("b!"), (String::new(), true));
        assert_eq!(run(&["abab"], &["ab", "ab", "ab"]), (String::new(), true));
        assert_eq!(run(&["abab"], &["xab", "aab", "ab"]), ("xaba".to_string(), true));
        assert_eq!(run(&["abc", "bcd"], &["ab", "cd"]), (String::new(), true));
        assert_eq!(run(&["abc", "bcd"], &["xb", "cd"]), ("x".to_string(), true));
    }

    #[test]
    fn multiple_stops_earliest_wins() {
        assert_eq!(run(&["world", "lo"], &["hello world"]), ("hel".to_string(), true));
        assert_eq!(run(&["\n\n", "User:"], &["Sure.\n", "User", ":"]), ("Sure.\n".to_string(), true));
        // Held back for the longer stop, then released when neither matches.
        let mut c = checker(&["ab", "abcd"]);
        assert_eq!(c.push("a"), (String::new(), false));
        assert_eq!(c.push("x"), ("ax".to_string(), false));
        // The shorter stop matches first, even though "abcd" was still possible.
        assert_eq!(c.push("abc"), (String::new(), true));
    }

    #[test]
    fn multibyte_text_and_stops() {
        assert_eq!(run(&["é!"], &["caf", "é", "!", "x"]), ("caf".to_string(), true));
        assert_eq!(run(&["日本"], &["今日は日", "本語"]), ("今日は".to_string(), true));
        // A held suffix must start on a char boundary.
        assert_eq!(run(&["🙂x"], &["a🙂", "y"]), ("a🙂y".to_string(), false));
    }

    #[test]
    fn emitted_text_plus_flush_is_the_input_when_nothing_matches() {
        let pieces = ["The ", "st", "op", " sign", " is st", "o"];
        let (out, stopped) = run(&["stop!", "STOP"], &pieces);
        assert!(!stopped);
        assert_eq!(out, pieces.concat());
    }
}
