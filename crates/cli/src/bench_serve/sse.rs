//! Incremental server-sent-events parser (the WHATWG event-stream format):
//! bytes arrive in arbitrary pieces, lines end in LF, CRLF or CR, `data:`
//! lines accumulate (joined by LF) until a blank line dispatches the event,
//! lines starting with `:` are comments (keep-alive pings).

/// One dispatched event.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Event {
    /// The `event:` field; `None` for the default `message` type.
    pub event: Option<String>,
    pub data: String,
}

#[derive(Default)]
pub struct Parser {
    /// Bytes of a line not yet terminated.
    buf: Vec<u8>,
    /// The previous piece ended in CR: an LF at the start of the next one
    /// belongs to the same line ending.
    after_cr: bool,
    data: String,
    has_data: bool,
    event: Option<String>,
}

impl Parser {
    pub fn new() -> Self {
        Self::default()
    }

    /// Feeds one piece of the stream; returns the events it completes.
    pub fn push(&mut self, mut bytes: &[u8]) -> Vec<Event> {
        let mut out = Vec::new();
        if self.after_cr {
            self.after_cr = false;
            if let Some(rest) = bytes.strip_prefix(b"\n") {
                bytes = rest;
            }
        }
        while let Some(i) = bytes.iter().position(|&b| b == b'\n' || b == b'\r') {
            let (line, rest) = bytes.split_at(i);
            self.buf.extend_from_slice(line);
            let line = std::mem::take(&mut self.buf);
            self.line(&line, &mut out);
            bytes = &rest[1..];
            if rest[0] == b'\r' {
                match bytes.first() {
                    Some(b'\n') => bytes = &bytes[1..],
                    Some(_) => {}
                    None => self.after_cr = true,
                }
            }
        }
        self.buf.extend_from_slice(bytes);
        out
    }

    /// The stream ended: a last line without its terminator and an event
    /// without its blank line are dispatched anyway (lenient: some servers
    /// close right after `data: [DONE]\n`).
    pub fn finish(&mut self) -> Vec<Event> {
        let mut out = Vec::new();
        if !self.buf.is_empty() {
            let line = std::mem::take(&mut self.buf);
            self.line(&line, &mut out);
        }
        self.dispatch(&mut out);
        out
    }

    fn line(&mut self, line: &[u8], out: &mut Vec<Event>) {
        if line.is_empty() {
            self.dispatch(out);
            return;
        }
        if line[0] == b':' {
            return;
        }
        // Line breaks are ASCII, so a line never splits a UTF-8 sequence.
        let line = String::from_utf8_lossy(line);
        let (field, value) = match line.find(':') {
            Some(i) => {
                let v = &line[i + 1..];
                (&line[..i], v.strip_prefix(' ').unwrap_or(v))
            }
            None => (&line[..], ""),
        };
        match field {
            "data" => {
                if self.has_data {
                    self.data.push('\n');
                }
                self.data.push_str(value);
                self.has_data = true;
            }
            "event" => self.event = Some(value.to_string()),
            _ => {} // id, retry and unknown fields don't matter here
        }
    }

    fn dispatch(&mut self, out: &mut Vec<Event>) {
        let event = self.event.take();
        if self.has_data {
            self.has_data = false;
            out.push(Event { event, data: std::mem::take(&mut self.data) });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn data(events: &[Event]) -> Vec<&str> {
        events.iter().map(|e| e.data.as_str()).collect()
    }

    /// Feeds `s` split at every possible pair of points, and checks the same
    /// events come out.
    fn all_splits(s: &str) -> Vec<Event> {
        let b = s.as_bytes();
        let whole = {
            let mut p = Parser::new();
            let mut ev = p.push(b);
            ev.extend(p.finish());
            ev
        };
        for i in 0..=b.len() {
            for j in i..=b.len() {
                let mut p = Parser::new();
                let mut ev = p.push(&b[..i]);
                ev.extend(p.push(&b[i..j]));
                ev.extend(p.push(&b[j..]));
                ev.extend(p.finish());
                assert_eq!(ev, whole, "split at {i}, {j}");
            }
        }
        whole
    }

    #[test]
    fn basic_events_and_done() {
        let ev = all_splits("data: {\"a\":1}\n\ndata: {\"b\":2}\n\ndata: [DONE]\n\n");
        assert_eq!(data(&ev), ["{\"a\":1}", "{\"b\":2}", "[DONE]"]);
        assert!(ev.iter().all(|e| e.event.is_none()));
    }

    #[test]
    fn crlf_and_cr_line_endings() {
        let ev = all_splits("data: x\r\n\r\ndata: y\r\rdata:z\n\n");
        assert_eq!(data(&ev), ["x", "y", "z"]);
    }

    #[test]
    fn cr_at_end_of_piece_then_lf() {
        // CR ends one piece, LF starts the next: one line break, not two (two
        // would dispatch an empty line and split the event).
        let mut p = Parser::new();
        assert!(p.push(b"data: a\r").is_empty());
        assert!(p.push(b"\ndata: b\r").is_empty());
        let ev = p.push(b"\n\r\n");
        assert_eq!(data(&ev), ["a\nb"]);
    }

    #[test]
    fn multi_line_data_comments_and_event_names() {
        let ev =
            all_splits(": ping - 2024\n\ndata: line1\ndata: line2\nid: 7\nretry: 10\n\nevent: error\ndata: {}\n\n");
        assert_eq!(data(&ev), ["line1\nline2", "{}"]);
        assert_eq!(ev[0].event, None);
        assert_eq!(ev[1].event.as_deref(), Some("error"));
    }

    #[test]
    fn value_space_handling_and_no_data() {
        // Only one leading space is stripped; an event with no data lines is
        // not dispatched; a field without a colon is a field with empty value.
        let ev = all_splits("data:  two\n\nevent: x\n\ndata\n\n");
        assert_eq!(data(&ev), [" two", ""]);
        assert_eq!(ev[1].event, None);
    }

    #[test]
    fn unterminated_tail_is_dispatched_on_finish() {
        let mut p = Parser::new();
        assert_eq!(data(&p.push(b"data: a\n\ndata: [DO")), ["a"]);
        assert!(p.push(b"NE]").is_empty());
        assert_eq!(data(&p.finish()), ["[DONE]"]);
        assert!(p.finish().is_empty());
    }

    #[test]
    fn utf8_split_across_pieces() {
        let s = "data: {\"text\":\"héllo 世界\"}\n\n";
        let ev = all_splits(s);
        assert_eq!(data(&ev), ["{\"text\":\"héllo 世界\"}"]);
    }
}
