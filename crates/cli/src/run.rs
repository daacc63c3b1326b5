//! `ferrite run`: one-shot completion with --prompt, else interactive chat.

use std::io::Write;
use std::path::PathBuf;

use clap::Args;
use ferrite_core::{Error, Result};
use ferrite_engine::constraint::format::OutputFormat;
use ferrite_engine::sampling::SamplingParams;
use ferrite_engine::{generate, GenerateRequest, Generation};
use ferrite_loader::chat_template::{Extras, Message};

use crate::load::{load, Loaded};
use crate::{ModelArgs, SamplingArgs};

#[derive(Args, Debug)]
pub struct RunArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    #[command(flatten)]
    pub sampling: SamplingArgs,
    /// Complete this prompt, print only the completion and exit.
    #[arg(short = 'p', long, conflicts_with = "file")]
    pub prompt: Option<String>,
    /// As --prompt, the prompt read from this file (- for standard input).
    #[arg(short = 'f', long, value_name = "FILE")]
    pub file: Option<PathBuf>,
    /// System message for the chat template.
    #[arg(long)]
    pub system: Option<String>,
    /// No chat template: tokenize the prompt as is (BOS as the model says).
    #[arg(long)]
    pub raw: bool,
    /// More chat-template variables, a JSON object (as `serve` takes
    /// `chat_template_kwargs`), e.g. '{"enable_thinking": false}' for Qwen3.
    #[arg(long, value_name = "JSON", value_parser = template_vars)]
    pub chat_template_kwargs: Option<TemplateVars>,
    /// Constrain each reply to one JSON object.
    #[arg(long, group = "format")]
    pub json: bool,
    /// Constrain each reply to a value of the JSON Schema in this file (the
    /// subset `serve` takes for `json_schema`; see the README).
    #[arg(long, value_name = "FILE", group = "format")]
    pub json_schema: Option<PathBuf>,
    /// Constrain each reply to a whole match of this regular expression
    /// (as `serve` takes `guided_regex`; see the README).
    #[arg(long, value_name = "PATTERN", group = "format")]
    pub regex: Option<String>,
    /// Constrain each reply to a sentence of this GBNF grammar (llama.cpp's
    /// notation, from `root`).
    #[arg(long, value_name = "GBNF", group = "format")]
    pub grammar: Option<String>,
    /// As --grammar, the grammar read from this file.
    #[arg(long, value_name = "FILE", group = "format")]
    pub grammar_file: Option<PathBuf>,
}

/// A JSON object of template variables (`--chat-template-kwargs`).
pub type TemplateVars = serde_json::Map<String, serde_json::Value>;

fn template_vars(text: &str) -> std::result::Result<TemplateVars, String> {
    let vars: TemplateVars = serde_json::from_str(text).map_err(|e| format!("not a JSON object: {e}"))?;
    match vars.keys().find(|k| Extras::RESERVED.contains(&k.as_str())) {
        Some(k) => Err(format!("`{k}` is set by the chat itself")),
        None => Ok(vars),
    }
}

impl RunArgs {
    /// The one prompt to complete, from --prompt or --file; None: chat.
    pub fn prompt_text(&self) -> Result<Option<String>> {
        let Some(path) = &self.file else { return Ok(self.prompt.clone()) };
        let bytes = if path.as_os_str() == "-" {
            let mut b = Vec::new();
            std::io::Read::read_to_end(&mut std::io::stdin().lock(), &mut b).map_err(|e| Error::io("stdin", e))?;
            b
        } else {
            std::fs::read(path).map_err(|e| Error::io(path.display().to_string(), e))?
        };
        let text = String::from_utf8(bytes)
            .map_err(|_| Error::InvalidInput(format!("{}: the prompt is not valid UTF-8", path.display())))?;
        Ok(Some(text))
    }

    /// The replies' format, from --json, --json-schema, --regex or a grammar.
    pub fn output_format(&self) -> Result<Option<OutputFormat>> {
        if self.json {
            return Ok(Some(OutputFormat::Object));
        }
        if let Some(source) = &self.regex {
            return OutputFormat::regex(source).map(Some).map_err(Error::InvalidInput);
        }
        if let Some(source) = &self.grammar {
            return OutputFormat::grammar(source).map(Some).map_err(Error::InvalidInput);
        }
        if let Some(path) = &self.grammar_file {
            let text = std::fs::read_to_string(path).map_err(|e| Error::io(path.display().to_string(), e))?;
            return OutputFormat::grammar(&text)
                .map(Some)
                .map_err(|e| Error::InvalidInput(format!("{}: {e}", path.display())));
        }
        let Some(path) = &self.json_schema else { return Ok(None) };
        let text = std::fs::read_to_string(path).map_err(|e| Error::io(path.display().to_string(), e))?;
        let doc: serde_json::Value = serde_json::from_str(&text)
            .map_err(|e| Error::InvalidInput(format!("{}: not JSON: {e}", path.display())))?;
        let format = OutputFormat::schema(&doc)
            .map_err(|e| Error::InvalidInput(format!("{}: unsupported schema: {e}", path.display())))?;
        Ok(Some(format))
    }
}

impl SamplingArgs {
    pub fn params(&self) -> SamplingParams {
        self.penalties.apply(SamplingParams {
            temperature: self.temperature,
            top_k: self.top_k,
            top_p: self.top_p,
            min_p: self.min_p,
            seed: self.seed,
            ..SamplingParams::default()
        })
    }
}

/// Token ids for a conversation: through the chat template when there is one
/// (and --raw is off), with --chat-template-kwargs, else the last message's
/// text as is.
pub fn prompt_ids(l: &Loaded, messages: &[Message], a: &RunArgs) -> Result<Vec<u32>> {
    let tok = l.tokenizer()?;
    match (&l.template, a.raw) {
        (Some(t), false) => {
            let extras = Extras { tools: None, vars: a.chat_template_kwargs.as_ref() };
            let text = t.render_with(messages, extras, true)?;
            let mut ids = tok.encode(&text, true)?;
            // Templates usually write the BOS text themselves; keep one BOS.
            if let Some(bos) = tok.bos_id() {
                if ids.len() >= 2 && ids[0] == bos && ids[1] == bos {
                    ids.remove(0);
                }
            }
            Ok(ids)
        }
        _ => {
            let last = messages.last().map(|m| m.content.as_str()).unwrap_or("");
            tok.encode(last, true)
        }
    }
}

pub fn request(prompt: Vec<u32>, s: &SamplingArgs, format: Option<OutputFormat>) -> GenerateRequest {
    GenerateRequest {
        prompt,
        sampling: s.params(),
        max_tokens: s.max_tokens,
        stop: s.stop.clone(),
        stop_ids: Vec::new(),
        ignore_eos: false,
        format,
    }
}

/// Generates and streams text to stdout; `cancel` is polled between tokens.
/// A failed write (a closed pipe) stops the generation and is the error.
pub fn stream(l: &mut Loaded, req: &GenerateRequest, cancel: &dyn Fn() -> bool) -> Result<Generation> {
    let Loaded { runner, tokenizer, .. } = l;
    let tok = tokenizer.as_ref().ok_or_else(|| Error::InvalidInput("no tokenizer".into()))?;
    let mut out = std::io::stdout().lock();
    let mut failed = None;
    let g = generate(runner, tok, req, &mut |ev| {
        if let Err(e) = out.write_all(ev.text.as_bytes()).and_then(|()| out.flush()) {
            failed = Some(e);
            return false;
        }
        !cancel()
    })?;
    match failed {
        Some(e) => Err(Error::io(crate::STDOUT, e)),
        None => Ok(g),
    }
}

pub fn main(a: RunArgs) -> Result<()> {
    a.sampling.params().validate().map_err(crate::flag_error)?;
    let format = a.output_format()?;
    let prompt = a.prompt_text()?;
    let mut l = load(&a.model, true)?;
    // (A grammar's tokens by text named by the model's vocabulary.)
    let size = l.runner.config().vocab_size;
    let id_of = |text: &str| l.tokenizer.as_ref().and_then(|t| t.token_to_id(text));
    let format = format.map(|f| f.in_vocabulary(size, id_of)).transpose().map_err(Error::InvalidInput)?;
    let why = if a.raw { "--raw" } else { "a model without a chat template" };
    if a.raw || l.template.is_none() {
        for (given, flag) in
            [(a.system.is_some(), "--system"), (a.chat_template_kwargs.is_some(), "--chat-template-kwargs")]
        {
            if given {
                eprintln!("note: {flag} is not used with {why}");
            }
        }
    }
    let Some(prompt) = prompt else {
        return crate::chat::chat(&mut l, &a, format);
    };
    if l.template.is_none() && !a.raw {
        eprintln!("note: the model has no chat template; the prompt is used as raw text");
    }
    let mut messages = Vec::new();
    if let Some(s) = &a.system {
        messages.push(Message::new("system", s.clone()));
    }
    messages.push(Message::new("user", prompt));
    let ids = prompt_ids(&l, &messages, &a)?;
    let req = request(ids, &a.sampling, format);
    let g = stream(&mut l, &req, &|| false)?;
    outln!()?;
    eprintln!(
        "[{} prompt tokens, {} generated, {:.1} tokens/s, finish: {}]",
        g.prompt_tokens,
        g.tokens.len(),
        g.tokens.len() as f64 / g.decode_time.as_secs_f64().max(1e-9),
        g.finish.as_str()
    );
    Ok(())
}
