//! Interactive chat: history, streaming, Ctrl-C stops the current reply only.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use ferrite_core::{Error, Result};
use ferrite_engine::constraint::format::OutputFormat;
use ferrite_engine::FinishReason;
use ferrite_loader::chat_template::Message;

use crate::chat_input::{self, read_message, Input};
use crate::load::Loaded;
use crate::run::{prompt_ids, request, stream, RunArgs};

const HELP: &str = "/reset clears the history, /exit or /quit (or Ctrl-D) quits, /help shows this; \
end a line with \\ to go on to the next one; start a message with // to send one that begins with /";

pub fn chat(l: &mut Loaded, a: &RunArgs, format: Option<OutputFormat>) -> Result<()> {
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
        history.push(Message::new("system", s.clone()));
    }
    let mut input = chat_input::open();
    while let Some(text) = read_message(input.as_mut())? {
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
        history.push(Message::new("user", content));
        let ids = match fit_history(l, &mut history, a) {
            Ok(ids) => ids,
            Err(e) => {
                eprintln!("error: {e}");
                history.pop();
                continue;
            }
        };
        let req = request(ids, &a.sampling, format.clone());
        let flag = interrupted.clone();
        match stream(l, &req, &move || flag.load(Ordering::SeqCst)) {
            Ok(g) => {
                outln!()?;
                if g.finish == FinishReason::Cancelled {
                    eprintln!("[stopped]");
                }
                history.push(Message::new("assistant", g.text));
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

/// The conversation's prompt ids. When they leave too little room for a
/// reply (a quarter of the context, or --max-tokens if less), the oldest
/// whole turns (a user message and the replies after it) are dropped, never
/// the system message or the newest turn; the history changes only when the
/// shorter one fits. Without a template only the last message is the prompt.
fn fit_history(l: &Loaded, history: &mut Vec<Message>, a: &RunArgs) -> Result<Vec<u32>> {
    let ctx = l.runner.max_context();
    if a.raw || l.template.is_none() {
        return prompt_ids(l, history, a);
    }
    let budget = ctx - a.sampling.max_tokens.min(ctx / 4).max(1);
    let mut ids = Vec::new();
    let (kept, dropped) = recent_turns(history, |messages| {
        ids = prompt_ids(l, messages, a)?;
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
    use super::{recent_turns, Message};

    #[test]
    fn whole_turns_are_dropped_oldest_first() {
        let m = |role: &str, content: &str| Message::new(role, content);
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
