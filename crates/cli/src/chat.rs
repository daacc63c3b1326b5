//! Interactive chat: history, streaming, Ctrl-C stops the current reply only.

use std::io::{BufRead, Write};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use ferrite_core::{Error, Result};
use ferrite_engine::FinishReason;
use ferrite_loader::chat_template::Message;

use crate::load::Loaded;
use crate::run::{prompt_ids, request, stream, RunArgs};

pub fn chat(l: &mut Loaded, a: &RunArgs) -> Result<()> {
    let interrupted = Arc::new(AtomicBool::new(false));
    let flag = interrupted.clone();
    ctrlc::set_handler(move || flag.store(true, Ordering::SeqCst))
        .map_err(|e| Error::InvalidInput(format!("cannot install the Ctrl-C handler: {e}")))?;
    if l.template.is_none() && !a.raw {
        eprintln!("note: the model has no chat template; each message is completed as raw text");
    }
    eprintln!("chatting with {} — Ctrl-C stops a reply, Ctrl-D or /exit quits, /reset clears history", l.name);
    let mut history: Vec<Message> = Vec::new();
    if let Some(s) = &a.system {
        history.push(Message { role: "system".into(), content: s.clone() });
    }
    let stdin = std::io::stdin();
    let mut lines = stdin.lock().lines();
    loop {
        eprint!("> ");
        let _ = std::io::stderr().flush();
        interrupted.store(false, Ordering::SeqCst);
        let Some(line) = lines.next() else { break };
        let line = line.map_err(|e| Error::InvalidInput(format!("reading stdin: {e}")))?;
        match line.trim() {
            "" => continue,
            "/exit" | "/quit" => break,
            "/reset" => {
                history.retain(|m| m.role == "system");
                continue;
            }
            _ => {}
        }
        history.push(Message { role: "user".into(), content: line });
        let ids = prompt_ids(l, &history, a.raw)?;
        let req = request(l, ids, &a.sampling);
        let flag = interrupted.clone();
        match stream(l, &req, &move || flag.load(Ordering::SeqCst)) {
            Ok(g) => {
                println!();
                if g.finish == FinishReason::Cancelled {
                    eprintln!("[stopped]");
                }
                history.push(Message { role: "assistant".into(), content: g.text });
            }
            Err(e) => {
                // A too-long conversation is not fatal: say so and let the user go on.
                eprintln!("\nerror: {e}");
                history.pop();
            }
        }
    }
    Ok(())
}
