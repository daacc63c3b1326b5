//! Interactive chat: history, streaming, Ctrl-C stops the current reply only.

use std::io::{BufRead, Write};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use ferrite_core::{Error, Result};
use ferrite_engine::FinishReason;
use ferrite_loader::chat_template::Message;

use crate::load::Loaded;
use crate::run::{prompt_ids, request, stream, RunArgs};

const HELP: &str = "/reset clears the history, /exit or /quit (or Ctrl-D) quits, /help shows this; \
end a line with \\ to go on to the next one; start a message with // to send one that begins with /";

pub fn chat(l: &mut Loaded, a: &RunArgs) -> Result<()> {
    let interrupted = Arc::new(AtomicBool::new(false));
    let flag = interrupted.clone();
    ctrlc::set_handler(move || flag.store(true, Ordering::SeqCst))
        .map_err(|e| Error::InvalidInput(format!("cannot install the Ctrl-C handler: {e}")))?;
    if l.template.is_none() && !a.raw {
        eprintln!("note: the model has no chat template; each message is completed as raw text");
    }
    eprintln!("chatting with {} — Ctrl-C stops a reply, Ctrl-D or /exit quits, /help lists commands", l.name);
    let mut history: Vec<Message> = Vec::new();
    if let Some(s) = &a.system {
        history.push(Message { role: "system".into(), content: s.clone() });
    }
    let mut input = std::io::stdin().lock();
    while let Some(text) = read_message(&mut input)? {
        // A Ctrl-C while the user was typing is not meant for the reply.
        interrupted.store(false, Ordering::SeqCst);
        let content = match Input::parse(&text) {
            Input::Empty => continue,
            Input::Exit => break,
            Input::Reset => {
                history.retain(|m| m.role == "system");
                eprintln!("[history cleared]");
                continue;
            }
            Input::Help => {
                eprintln!("{HELP}");
                continue;
            }
            Input::Unknown(cmd) => {
                eprintln!("unknown command {cmd} (/help lists them; start with // to send it as text)");
                continue;
            }
            Input::Message(m) => m,
        };
        history.push(Message { role: "user".into(), content });
        let ids = match fit_history(l, &mut history, a) {
            Ok(ids) => ids,
            Err(e) => {
                eprintln!("error: {e}");
                history.pop();
                continue;
            }
        };
        let req = request(l, ids, &a.sampling);
        let flag = interrupted.clone();
        match stream(l, &req, &move || flag.load(Ordering::SeqCst)) {
            Ok(g) => {
                outln!()?;
                if g.finish == FinishReason::Cancelled {
                    eprintln!("[stopped]");
                }
                history.push(Message { role: "assistant".into(), content: g.text });
            }
            // Standard output is gone: nowhere to chat to.
            Err(e @ Error::Io { .. }) => return Err(e),
            Err(e) => {
                eprintln!("\nerror: {e}");
                history.pop();
            }
        }
    }
    Ok(())
}

/// What a line of chat input asks for.
#[derive(Debug, PartialEq)]
enum Input {
    Empty,
    Exit,
    Reset,
    Help,
    /// A `/word` that is no command.
    Unknown(String),
    Message(String),
}

impl Input {
    fn parse(text: &str) -> Input {
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
fn read_message(input: &mut impl BufRead) -> Result<Option<String>> {
    let mut message = String::new();
    let mut prompt = "> ";
    loop {
        eprint!("{prompt}");
        let _ = std::io::stderr().flush();
        let mut raw = Vec::new();
        let n = input.read_until(b'\n', &mut raw).map_err(|e| Error::io("standard input", e))?;
        if n == 0 {
            // End of input: a pending continued message is still sent.
            let message = message.trim_end_matches('\n');
            return Ok((!message.is_empty()).then(|| message.to_string()));
        }
        let line = String::from_utf8_lossy(&raw);
        if matches!(line, std::borrow::Cow::Owned(_)) {
            eprintln!("note: the input was not valid UTF-8; the invalid bytes were replaced");
        }
        let line = line.trim_end_matches(['\n', '\r']);
        match line.strip_suffix('\\') {
            Some(part) => {
                message.push_str(part);
                message.push('\n');
                prompt = ". ";
            }
            None => {
                message.push_str(line);
                return Ok(Some(message));
            }
        }
    }
}

/// The conversation's prompt ids. When they leave too little room for a
/// reply (a quarter of the context, or --max-tokens if less), the oldest
/// whole turns (a user message and the replies after it) are dropped, never
/// the system message or the newest turn; the history changes only when the
/// shorter one fits. Without a template only the last message is the prompt.
fn fit_history(l: &Loaded, history: &mut Vec<Message>, a: &RunArgs) -> Result<Vec<u32>> {
    let ctx = l.runner.max_context();
    if a.raw || l.template.is_none() {
        return prompt_ids(l, history, a.raw);
    }
    let budget = ctx - a.sampling.max_tokens.min(ctx / 4).max(1);
    let mut ids = Vec::new();
    let (kept, dropped) = recent_turns(history, |messages| {
        ids = prompt_ids(l, messages, a.raw)?;
        Ok(ids.len() <= budget)
    })?;
    if ids.len() >= ctx {
        return Err(Error::InvalidInput(format!("prompt is {} tokens, the context holds {ctx}", ids.len())));
    }
    if dropped > 0 {
        eprintln!("[the {dropped} oldest messages were dropped to fit the context of {ctx} tokens]");
    }
    *history = kept;
    Ok(ids)
}

/// The longest tail of whole turns of `history` (after its system messages)
/// that `fits`, or else its newest turn alone; and how many messages that
/// leaves out.
fn recent_turns(
    history: &[Message],
    mut fits: impl FnMut(&[Message]) -> Result<bool>,
) -> Result<(Vec<Message>, usize)> {
    let (system, rest): (Vec<&Message>, Vec<&Message>) = history.iter().partition(|m| m.role == "system");
    // Where each turn starts: the first message, then every user message.
    let starts: Vec<usize> = (0..rest.len()).filter(|&i| i == 0 || rest[i].role == "user").collect();
    for (k, &start) in starts.iter().enumerate() {
        let candidate: Vec<Message> = system.iter().chain(&rest[start..]).map(|&m| m.clone()).collect();
        if fits(&candidate)? || k + 1 == starts.len() {
            return Ok((candidate, start));
        }
    }
    Ok((history.to_vec(), 0))
}

#[cfg(test)]
mod tests {
    use super::{read_message, recent_turns, Input, Message};

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
        let mut input: &[u8] = b"def f():\\\n  return 1\nnext\r\n\xff\xfe bad\nlast\\";
        assert_eq!(read_message(&mut input).unwrap().as_deref(), Some("def f():\n  return 1"));
        assert_eq!(read_message(&mut input).unwrap().as_deref(), Some("next"));
        assert_eq!(read_message(&mut input).unwrap().as_deref(), Some("\u{fffd}\u{fffd} bad"));
        // A continued line at the end of input is still a message.
        assert_eq!(read_message(&mut input).unwrap().as_deref(), Some("last"));
        assert_eq!(read_message(&mut input).unwrap(), None);
    }

    #[test]
    fn whole_turns_are_dropped_oldest_first() {
        let m = |role: &str, content: &str| Message { role: role.into(), content: content.into() };
        let history = vec![
            m("system", "s"),
            m("user", "u1"),
            m("assistant", "a1"),
            m("user", "u2"),
            m("assistant", "a2"),
            m("user", "u3"),
        ];
        let roles = |v: &[Message]| v.iter().map(|m| m.content.clone()).collect::<Vec<_>>().join(" ");
        // A template that insists on user/assistant turns alternating from a user.
        let alternating = |v: &[Message]| v.iter().filter(|m| m.role != "system").step_by(2).all(|m| m.role == "user");
        for (room, want, dropped) in [(9, "s u1 a1 u2 a2 u3", 0), (5, "s u2 a2 u3", 2), (3, "s u3", 4), (1, "s u3", 4)]
        {
            let (kept, n) = recent_turns(&history, |v| {
                assert!(alternating(v), "{}", roles(v));
                Ok(v.len() <= room)
            })
            .unwrap();
            assert_eq!((roles(&kept).as_str(), n), (want, dropped), "room {room}");
        }
    }
}
