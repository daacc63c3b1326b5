//! Chat input: lines from a terminal, with line editing and history, or from
//! any other standard input as bytes; lines ending in `\\` joined into one
//! message; and what a message asks for (a command or text for the model).

use std::io::{BufRead, IsTerminal, Write};

use ferrite_core::{Error, Result};
use rustyline::error::ReadlineError;
use rustyline::DefaultEditor;

/// One line of input.
pub enum Line {
    /// Its bytes, without the line ending.
    Text(Vec<u8>),
    /// Ctrl-C at a terminal's prompt.
    Interrupted,
    End,
}

pub trait LineSource {
    fn line(&mut self, prompt: &str) -> Result<Line>;
}

/// Standard input that is no terminal (a pipe, a file): bytes up to each
/// newline, the prompt on stderr.
pub struct Plain<R>(pub R);

impl<R: BufRead> LineSource for Plain<R> {
    fn line(&mut self, prompt: &str) -> Result<Line> {
        eprint!("{prompt}");
        let _ = std::io::stderr().flush();
        let mut raw = Vec::new();
        if self.0.read_until(b'\n', &mut raw).map_err(|e| Error::io("standard input", e))? == 0 {
            return Ok(Line::End);
        }
        while raw.last().is_some_and(|&b| b == b'\n' || b == b'\r') {
            raw.pop();
        }
        Ok(Line::Text(raw))
    }
}

impl LineSource for DefaultEditor {
    fn line(&mut self, prompt: &str) -> Result<Line> {
        match self.readline(prompt) {
            Ok(line) => {
                if !line.trim().is_empty() {
                    let _ = self.add_history_entry(line.as_str());
                }
                Ok(Line::Text(line.into_bytes()))
            }
            Err(ReadlineError::Interrupted) => Ok(Line::Interrupted),
            Err(ReadlineError::Eof) => Ok(Line::End),
            // Bytes that are not UTF-8 (as plain input replaces them, but the
            // editor cannot): the line is dropped, the chat goes on.
            Err(ReadlineError::Io(e)) if e.kind() == std::io::ErrorKind::InvalidData => {
                eprintln!("note: the input was not valid UTF-8; the line was dropped");
                Ok(Line::Interrupted)
            }
            Err(e) => Err(Error::InvalidInput(format!("reading the terminal: {e}"))),
        }
    }
}

/// The chat's input: line editing (arrows, history) where standard input
/// and output are a terminal, else plain lines.
pub fn open() -> Box<dyn LineSource> {
    if std::io::stdin().is_terminal() && std::io::stdout().is_terminal() {
        if let Ok(editor) = DefaultEditor::new() {
            return Box::new(editor);
        }
    }
    Box::new(Plain(std::io::stdin().lock()))
}

/// What a line of chat input asks for.
#[derive(Debug, PartialEq)]
pub enum Input {
    Empty,
    Exit,
    Reset,
    Help,
    /// A `/word` that is no command.
    Unknown(String),
    Message(String),
}

impl Input {
    pub fn parse(text: &str) -> Input {
        if let Some(rest) = text.trim_start().strip_prefix("//") {
            return Input::Message(format!("/{rest}"));
        }
        // Several lines are always a message.
        if text.trim().contains('\n') {
            return Input::Message(text.to_string());
        }
        let trimmed = text.trim();
        let word = trimmed.split_whitespace().next().unwrap_or("");
        match word {
            "" => Input::Empty,
            "/exit" | "/quit" => Input::Exit,
            "/reset" => Input::Reset,
            "/help" => Input::Help,
            w if w.len() > 1 && w.starts_with('/') && w[1..].chars().all(|c| c.is_ascii_alphabetic()) => {
                Input::Unknown(w.to_string())
            }
            _ => Input::Message(text.to_string()),
        }
    }
}

/// One message: a line, or lines joined while they end with a backslash.
/// None at the end of input. Bytes that are not UTF-8 are replaced, with a note.
pub fn read_message(input: &mut dyn LineSource) -> Result<Option<String>> {
    let mut message = String::new();
    let mut prompt = "> ";
    loop {
        let raw = match input.line(prompt)? {
            Line::Text(raw) => raw,
            // Ctrl-C while typing: the message so far is dropped.
            Line::Interrupted => {
                (message, prompt) = (String::new(), "> ");
                continue;
            }
            Line::End => {
                // A pending continued message is still sent.
                let message = message.trim_end_matches('\n');
                return Ok((!message.is_empty()).then(|| message.to_string()));
            }
        };
        let line = String::from_utf8_lossy(&raw);
        if matches!(line, std::borrow::Cow::Owned(_)) {
            eprintln!("note: the input was not valid UTF-8; the invalid bytes were replaced");
        }
        match line.strip_suffix('\\') {
            Some(part) => {
                message.push_str(part);
                message.push('\n');
                prompt = ". ";
            }
            None => {
                message.push_str(&line);
                return Ok(Some(message));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{read_message, Input, Plain};

    #[test]
    fn commands_and_messages() {
        assert_eq!(Input::parse("  "), Input::Empty);
        assert_eq!(Input::parse("/quit"), Input::Exit);
        assert_eq!(Input::parse(" /reset "), Input::Reset);
        assert_eq!(Input::parse("/help"), Input::Help);
        assert_eq!(Input::parse("/exti"), Input::Unknown("/exti".into()));
        assert_eq!(Input::parse("/foo bar"), Input::Unknown("/foo".into()));
        assert_eq!(Input::parse("//reset is a command"), Input::Message("/reset is a command".into()));
        assert_eq!(Input::parse("/usr/bin holds programs"), Input::Message("/usr/bin holds programs".into()));
        assert_eq!(Input::parse("hello /reset"), Input::Message("hello /reset".into()));
    }

    #[test]
    fn continued_lines_and_bad_bytes() {
        let mut input = Plain(&b"def f():\\\n  return 1\nnext\r\n\xff\xfe bad\nlast\\"[..]);
        assert_eq!(read_message(&mut input).unwrap().as_deref(), Some("def f():\n  return 1"));
        assert_eq!(read_message(&mut input).unwrap().as_deref(), Some("next"));
        assert_eq!(read_message(&mut input).unwrap().as_deref(), Some("\u{fffd}\u{fffd} bad"));
        // A continued line at the end of input is still a message.
        assert_eq!(read_message(&mut input).unwrap().as_deref(), Some("last"));
        assert_eq!(read_message(&mut input).unwrap(), None);
    }
}
