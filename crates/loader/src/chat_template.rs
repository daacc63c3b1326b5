//! Chat templates: Jinja templates that turn a message list into a prompt string.
//!
//! Rendering mirrors transformers' `apply_chat_template`, the reference every
//! template is written against: trim_blocks + lstrip_blocks, lenient undefined
//! values like jinja2's default `Undefined`, Python string methods, a `tojson`
//! that is `json.dumps(x, ensure_ascii=False)`, `raise_exception`, `strftime_now`,
//! and the `{% generation %}` tag. `tests/chat_template_golden.rs` checks the
//! output against Python jinja2 byte for byte.

use std::borrow::Cow;
use std::fmt::Write as _;
use std::path::Path;
use std::time::{SystemTime, UNIX_EPOCH};

use ferrite_core::{Error, Result};
use minijinja::value::{Kwargs, Value, ValueKind};
use minijinja::{AutoEscape, Environment, ErrorKind, UndefinedBehavior};

type JinjaError = minijinja::Error;

const TEMPLATE_NAME: &str = "chat_template";
/// Template instructions one render may run: a long chat takes thousands,
/// while nested loops over huge ranges would run for hours.
const TEMPLATE_FUEL: u64 = 50_000_000;

/// One message as templates see it. The other fields are there only when
/// given, as in the message dicts transformers passes: an assistant's
/// `tool_calls` (`{type, function: {name, arguments}}`, the arguments an
/// object) and `reasoning_content`, a tool result's `tool_call_id` and `name`.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Message {
    pub role: String,
    pub content: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<serde_json::Value>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<String>,
}

impl Message {
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Message {
        Message { role: role.into(), content: content.into(), ..Default::default() }
    }
}

/// A compiled chat template together with the special tokens it may print.
pub struct ChatTemplate {
    env: Environment<'static>,
    source: String,
    bos_token: String,
    eos_token: String,
}

impl ChatTemplate {
    /// Compiles `source` once; a syntax error is an `Error::Template`.
    pub fn new(source: &str, bos_token: &str, eos_token: &str) -> Result<ChatTemplate> {
        let mut env = Environment::new();
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.set_keep_trailing_newline(false);
        env.set_undefined_behavior(UndefinedBehavior::Lenient);
        // A template is code from the model file: bound its work, so that a
        // runaway loop is an error instead of a hang.
        env.set_fuel(Some(TEMPLATE_FUEL));
        env.set_auto_escape_callback(|_| AutoEscape::None);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.set_formatter(python_formatter);
        env.add_filter("tojson", tojson);
        env.add_function("raise_exception", raise_exception);
        env.add_function("strftime_now", strftime_now);
        env.add_template_owned(TEMPLATE_NAME, rewrite_generation_tags(source).into_owned())
            .map_err(|e| Error::Template(format!("chat template does not compile: {e}")))?;
        let (source, bos_token, eos_token) = (source.to_string(), bos_token.to_string(), eos_token.to_string());
        Ok(ChatTemplate { env, source, bos_token, eos_token })
    }

    /// The template's text.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// Renders the prompt. `raise_exception(msg)` in the template becomes
    /// `Error::Template(msg)`; any other failure is an `Error::Template` too.
    pub fn render(&self, messages: &[Message], add_generation_prompt: bool) -> Result<String> {
        self.render_with(messages, Extras::default(), add_generation_prompt)
    }

    /// As `render`, with what `extras` adds.
    pub fn render_with(&self, messages: &[Message], extras: Extras, add_generation_prompt: bool) -> Result<String> {
        let template = self.env.get_template(TEMPLATE_NAME).map_err(|e| Error::Template(e.to_string()))?;
        // transformers passes `tools` and `documents` as None when absent, and
        // templates test them with `is not none`, so they must be defined.
        let ctx = minijinja::context! {
            messages => messages,
            add_generation_prompt => add_generation_prompt,
            bos_token => &self.bos_token,
            eos_token => &self.eos_token,
            tools => extras.tools,
            documents => (),
            ..Value::from_serialize(extras.vars)
        };
        template.render(ctx).map_err(render_error)
    }
}

/// What a render gets besides the messages, as transformers'
/// `apply_chat_template` takes it.
#[derive(Clone, Copy, Debug, Default)]
pub struct Extras<'a> {
    /// The functions the model may call (OpenAI's `tools` list).
    pub tools: Option<&'a [serde_json::Value]>,
    /// More variables (its keyword arguments: vLLM's `chat_template_kwargs`,
    /// such as `enable_thinking`); never those the render sets itself
    /// (`RESERVED`), which win.
    pub vars: Option<&'a serde_json::Map<String, serde_json::Value>>,
}

impl Extras<'_> {
    /// The variables a render sets itself.
    pub const RESERVED: [&'static str; 6] =
        ["messages", "add_generation_prompt", "bos_token", "eos_token", "tools", "documents"];
}

/// Reads the chat template shipped with a Hugging Face model directory:
/// `chat_template.jinja` (what current transformers writes, and prefers), else
/// `"chat_template"` of `tokenizer_config.json` (a string, or a list of
/// `{name, template}` from which the "default" one is taken), else
/// `chat_template.json`. `Ok(None)` when the model has none.
pub fn template_from_hf_dir(dir: &Path) -> Result<Option<String>> {
    let jinja = dir.join("chat_template.jinja");
    if jinja.is_file() {
        return std::fs::read_to_string(&jinja).map(Some).map_err(|e| Error::io(&jinja, e));
    }
    for file in ["tokenizer_config.json", "chat_template.json"] {
        let path = dir.join(file);
        if !path.is_file() {
            continue;
        }
        let text = std::fs::read_to_string(&path).map_err(|e| Error::io(&path, e))?;
        let json: serde_json::Value =
            serde_json::from_str(&text).map_err(|e| Error::format(format!("{}: invalid JSON: {e}", path.display())))?;
        if let Some(found) = template_from_json(&json, &path)? {
            return Ok(Some(found));
        }
    }
    Ok(None)
}

fn template_from_json(json: &serde_json::Value, path: &Path) -> Result<Option<String>> {
    use serde_json::Value as J;
    match json.get("chat_template") {
        None | Some(J::Null) => Ok(None),
        Some(J::String(s)) => Ok(Some(s.clone())),
        Some(J::Array(list)) => {
            let named = |entry: &J| -> Option<(String, String)> {
                let name = entry.get("name")?.as_str()?;
                let template = entry.get("template")?.as_str()?;
                Some((name.to_string(), template.to_string()))
            };
            let mut names = Vec::new();
            for entry in list {
                let Some((name, template)) = named(entry) else {
                    return Err(Error::format(format!(
                        "{}: chat_template list entries need string \"name\" and \"template\"",
                        path.display()
                    )));
                };
                if name == "default" {
                    return Ok(Some(template));
                }
                names.push(name);
            }
            Err(Error::Template(format!(
                "{}: several chat templates ({}) and none named \"default\"",
                path.display(),
                names.join(", ")
            )))
        }
        Some(_) => Err(Error::format(format!("{}: \"chat_template\" is neither a string nor a list", path.display()))),
    }
}

// --- environment pieces --------------------------------------------------------

/// Carries a `raise_exception` message through minijinja's error so `render`
/// can hand back exactly the template author's text.
#[derive(Debug)]
struct Raised(String);

impl std::fmt::Display for Raised {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Raised {}

fn raise_exception(message: String) -> std::result::Result<Value, JinjaError> {
    Err(JinjaError::new(ErrorKind::InvalidOperation, message.clone()).with_source(Raised(message)))
}

fn render_error(err: JinjaError) -> Error {
    if err.kind() == ErrorKind::OutOfFuel {
        return Error::Template(format!(
            "chat template failed: it ran more than {TEMPLATE_FUEL} steps (a runaway loop in the model's template?)"
        ));
    }
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(&err);
    while let Some(e) = source {
        if let Some(raised) = e.downcast_ref::<Raised>() {
            return Error::Template(raised.0.clone());
        }
        source = e.source();
    }
    Error::Template(format!("chat template failed: {err}"))
}

/// Prints values the way Python's `str()` does where jinja2 and minijinja
/// differ for scalars: `None`, `True`, `False`.
fn python_formatter(
    out: &mut minijinja::Output,
    state: &minijinja::State,
    value: &Value,
) -> std::result::Result<(), JinjaError> {
    let text = match value.kind() {
        ValueKind::None => "None",
        ValueKind::Bool if value.is_true() => "True",
        ValueKind::Bool => "False",
        _ => return minijinja::escape_formatter(out, state, value),
    };
    out.write_str(text).map_err(JinjaError::from)
}

/// `{% generation %}` marks assistant spans for transformers' training masks and
/// renders its body unchanged; rewriting it to `{% if true %}` keeps the
/// whitespace-control markers, so the output is identical.
fn rewrite_generation_tags(src: &str) -> Cow<'_, str> {
    if !src.contains("generation") {
        return Cow::Borrowed(src);
    }
    let mut out = String::with_capacity(src.len());
    let mut rest = src;
    while let Some(i) = rest.find("{%") {
        out.push_str(&rest[..i]);
        let tag = &rest[i..];
        match generation_tag(tag) {
            Some((len, replacement)) => {
                out.push_str(&replacement);
                rest = &tag[len..];
            }
            None => {
                out.push_str("{%");
                rest = &tag[2..];
            }
        }
    }
    out.push_str(rest);
    Cow::Owned(out)
}

/// If `tag` (starting with `{%`) is a generation tag, its length and replacement.
fn generation_tag(tag: &str) -> Option<(usize, String)> {
    let mut s = &tag[2..];
    let open = match s.chars().next() {
        Some(c @ ('-' | '+')) => {
            s = &s[1..];
            c.to_string()
        }
        _ => String::new(),
    };
    let s = s.trim_start();
    let (word, after) = if let Some(a) = s.strip_prefix("endgeneration") {
        ("endif", a)
    } else if let Some(a) = s.strip_prefix("generation") {
        ("if true", a)
    } else {
        return None;
    };
    let after = after.trim_start();
    let (close, remaining) = if let Some(r) = after.strip_prefix("%}") {
        ("", r)
    } else if let Some(r) = after.strip_prefix("-%}") {
        ("-", r)
    } else if let Some(r) = after.strip_prefix("+%}") {
        ("+", r)
    } else {
        return None;
    };
    Some((tag.len() - remaining.len(), format!("{{%{open} {word} {close}%}}")))
}

// --- tojson ---------------------------------------------------------------------

/// Python's `json.dumps(x, ensure_ascii=False, indent=None, separators=None,
/// sort_keys=False)`, which transformers installs in place of jinja2's
/// HTML-escaping `tojson`.
fn tojson(value: &Value, kwargs: Kwargs) -> std::result::Result<String, JinjaError> {
    let ensure_ascii: Option<bool> = kwargs.get("ensure_ascii")?;
    let indent: Option<Value> = kwargs.get("indent")?;
    let separators: Option<Value> = kwargs.get("separators")?;
    let sort_keys: Option<bool> = kwargs.get("sort_keys")?;
    kwargs.assert_all_used()?;

    let indent = match indent {
        None => None,
        Some(v) if v.is_none() || v.is_undefined() => None,
        Some(v) => match (v.as_i64(), v.as_str()) {
            (Some(n), _) => Some(" ".repeat(n.clamp(0, 64) as usize)),
            (None, Some(s)) => Some(s.to_string()),
            _ => return Err(invalid("tojson: indent must be an integer or a string")),
        },
    };
    let (item_sep, key_sep) = match separators.filter(|v| !v.is_none() && !v.is_undefined()) {
        Some(v) => {
            let pair: Vec<String> = v
                .try_iter()
                .map_err(|_| invalid("tojson: separators must be a pair of strings"))?
                .map(|s| s.as_str().map(str::to_string))
                .collect::<Option<_>>()
                .ok_or_else(|| invalid("tojson: separators must be a pair of strings"))?;
            match <[String; 2]>::try_from(pair) {
                Ok([item, key]) => (item, key),
                Err(_) => return Err(invalid("tojson: separators must be a pair of strings")),
            }
        }
        None if indent.is_some() => (",".to_string(), ": ".to_string()),
        None => (", ".to_string(), ": ".to_string()),
    };
    let mut w = JsonWriter {
        out: String::new(),
        ensure_ascii: ensure_ascii.unwrap_or(false),
        indent,
        item_sep,
        key_sep,
        sort_keys: sort_keys.unwrap_or(false),
    };
    w.value(value, 0)?;
    Ok(w.out)
}

fn invalid(msg: &str) -> JinjaError {
    JinjaError::new(ErrorKind::InvalidOperation, msg.to_string())
}

/// Nesting beyond this is refused rather than risking the stack.
const MAX_JSON_DEPTH: usize = 256;

struct JsonWriter {
    out: String,
    ensure_ascii: bool,
    indent: Option<String>,
    item_sep: String,
    key_sep: String,
    sort_keys: bool,
}

impl JsonWriter {
    fn value(&mut self, v: &Value, depth: usize) -> std::result::Result<(), JinjaError> {
        if depth > MAX_JSON_DEPTH {
            return Err(invalid("tojson: value nested too deeply"));
        }
        match v.kind() {
            ValueKind::None => self.out.push_str("null"),
            ValueKind::Bool => self.out.push_str(if v.is_true() { "true" } else { "false" }),
            ValueKind::Number if v.is_integer() => self.out.push_str(&v.to_string()),
            ValueKind::Number => {
                let f = f64::try_from(v.clone())?;
                self.out.push_str(&python_float_repr(f));
            }
            ValueKind::String => self.string(v.as_str().unwrap_or_default()),
            ValueKind::Seq | ValueKind::Iterable => {
                let items: Vec<Value> = v.try_iter()?.collect();
                self.container('[', ']', items.len(), depth, |w, i, d| w.value(&items[i], d))?;
            }
            ValueKind::Map => {
                let mut entries = Vec::new();
                for key in v.try_iter()? {
                    let item = v.get_item(&key)?;
                    entries.push((json_key(&key)?, item));
                }
                if self.sort_keys {
                    entries.sort_by(|a, b| a.0.cmp(&b.0));
                }
                self.container('{', '}', entries.len(), depth, |w, i, d| {
                    w.string(&entries[i].0);
                    w.out.push_str(&w.key_sep.clone());
                    w.value(&entries[i].1, d)
                })?;
            }
            kind => return Err(invalid(&format!("tojson: object of type {kind} is not JSON serializable"))),
        }
        Ok(())
    }

    /// Python's layout: items joined by the item separator, each on its own
    /// indented line when `indent` is set; empty containers stay `[]` / `{}`.
    fn container(
        &mut self,
        open: char,
        close: char,
        len: usize,
        depth: usize,
        mut item: impl FnMut(&mut Self, usize, usize) -> std::result::Result<(), JinjaError>,
    ) -> std::result::Result<(), JinjaError> {
        self.out.push(open);
        if len == 0 {
            self.out.push(close);
            return Ok(());
        }
        for i in 0..len {
            if i > 0 {
                let sep = self.item_sep.clone();
                self.out.push_str(&sep);
            }
            self.newline(depth + 1);
            item(self, i, depth + 1)?;
        }
        self.newline(depth);
        self.out.push(close);
        Ok(())
    }

    fn newline(&mut self, level: usize) {
        if let Some(indent) = &self.indent {
            self.out.push('\n');
            for _ in 0..level {
                self.out.push_str(indent);
            }
        }
    }

    fn string(&mut self, s: &str) {
        self.out.push('"');
        for c in s.chars() {
            match c {
                '"' => self.out.push_str("\\\""),
                '\\' => self.out.push_str("\\\\"),
                '\n' => self.out.push_str("\\n"),
                '\r' => self.out.push_str("\\r"),
                '\t' => self.out.push_str("\\t"),
                '\u{08}' => self.out.push_str("\\b"),
                '\u{0c}' => self.out.push_str("\\f"),
                c if (c as u32) < 0x20 || (self.ensure_ascii && !(' '..='~').contains(&c)) => {
                    let mut units = [0u16; 2];
                    for unit in c.encode_utf16(&mut units) {
                        let _ = write!(self.out, "\\u{unit:04x}");
                    }
                }
                c => self.out.push(c),
            }
        }
        self.out.push('"');
    }
}

/// Map keys as `json.dumps` converts them: strings as-is, scalars to their JSON text.
fn json_key(key: &Value) -> std::result::Result<String, JinjaError> {
    Ok(match key.kind() {
        ValueKind::String => key.as_str().unwrap_or_default().to_string(),
        ValueKind::Number if key.is_integer() => key.to_string(),
        ValueKind::Number => python_float_repr(f64::try_from(key.clone())?),
        ValueKind::Bool => (if key.is_true() { "true" } else { "false" }).to_string(),
        ValueKind::None => "null".to_string(),
        kind => return Err(invalid(&format!("tojson: keys must be str, int, float, bool or None, not {kind}"))),
    })
}

/// Python's `repr(float)`: shortest round-trip digits, fixed notation for
/// decimal exponents in [-4, 16), otherwise `d.ddde+XX`; JSON's `NaN`/`Infinity`.
fn python_float_repr(f: f64) -> String {
    if f.is_nan() {
        return "NaN".into();
    }
    if f.is_infinite() {
        return if f > 0.0 { "Infinity" } else { "-Infinity" }.into();
    }
    // Rust's `{:e}` gives the same shortest round-trip digits as Python's repr.
    let sci = format!("{:e}", f.abs());
    let (mantissa, exp) = sci.split_once('e').unwrap_or((&sci, "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    let digits: String = mantissa.chars().filter(|c| *c != '.').collect();
    let decpt = exp + 1; // value = 0.DIGITS * 10^decpt
    let sign = if f.is_sign_negative() { "-" } else { "" };
    if decpt > -4 && decpt <= 16 {
        let n = digits.len() as i32;
        let body = if decpt <= 0 {
            format!("0.{}{digits}", "0".repeat((-decpt) as usize))
        } else if decpt >= n {
            format!("{digits}{}.0", "0".repeat((decpt - n) as usize))
        } else {
            let (int, frac) = digits.split_at(decpt as usize);
            format!("{int}.{frac}")
        };
        format!("{sign}{body}")
    } else {
        let (first, rest) = digits.split_at(1);
        let frac = if rest.is_empty() { String::new() } else { format!(".{rest}") };
        let e = decpt - 1;
        let esign = if e < 0 { '-' } else { '+' };
        format!("{sign}{first}{frac}e{esign}{:02}", e.abs())
    }
}

// --- strftime_now -----------------------------------------------------------------

/// `strftime_now(fmt)`: the current time formatted like Python's `strftime`.
/// transformers uses local time; we use UTC, which is what servers run in and
/// needs no time-zone database.
fn strftime_now(fmt: &str) -> String {
    let secs = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs() as i64).unwrap_or(0);
    strftime_utc(fmt, secs)
}

const WEEKDAYS: [&str; 7] = ["Sunday", "Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday"];
const MONTHS: [&str; 12] = [
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
];

/// The glibc `strftime` conversions templates use (plus the `%-d` no-padding
/// flag) for a UTC time; unknown conversions are copied through as glibc does.
fn strftime_utc(fmt: &str, unix_secs: i64) -> String {
    let days = unix_secs.div_euclid(86_400);
    let secs_of_day = unix_secs.rem_euclid(86_400);
    let (year, month, day) = civil_from_days(days);
    let (hour, minute, second) = (secs_of_day / 3600, secs_of_day / 60 % 60, secs_of_day % 60);
    let weekday = (days + 4).rem_euclid(7) as usize; // 1970-01-01 was a Thursday
    let yday = days - days_from_civil(year, 1, 1) + 1;
    let hour12 = if hour % 12 == 0 { 12 } else { hour % 12 };

    let mut out = String::new();
    let mut chars = fmt.chars().peekable();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        let no_pad = chars.peek() == Some(&'-');
        if no_pad {
            chars.next();
        }
        let num = |out: &mut String, v: i64, width: usize| {
            if no_pad {
                let _ = write!(out, "{v}");
            } else {
                let _ = write!(out, "{v:0width$}");
            }
        };
        match chars.next() {
            Some('Y') => num(&mut out, year, 4),
            Some('y') => num(&mut out, year.rem_euclid(100), 2),
            Some('m') => num(&mut out, month, 2),
            Some('d') => num(&mut out, day, 2),
            Some('e') => {
                let _ = write!(out, "{day:2}");
            }
            Some('H') => num(&mut out, hour, 2),
            Some('I') => num(&mut out, hour12, 2),
            Some('M') => num(&mut out, minute, 2),
            Some('S') => num(&mut out, second, 2),
            Some('j') => num(&mut out, yday, 3),
            Some('p') => out.push_str(if hour < 12 { "AM" } else { "PM" }),
            Some('B') => out.push_str(MONTHS[(month - 1) as usize]),
            Some('b') | Some('h') => out.push_str(&MONTHS[(month - 1) as usize][..3]),
            Some('A') => out.push_str(WEEKDAYS[weekday]),
            Some('a') => out.push_str(&WEEKDAYS[weekday][..3]),
            Some('u') => num(&mut out, if weekday == 0 { 7 } else { weekday as i64 }, 1),
            Some('w') => num(&mut out, weekday as i64, 1),
            Some('F') => {
                let _ = write!(out, "{year:04}-{month:02}-{day:02}");
            }
            Some('D') => {
                let _ = write!(out, "{month:02}/{day:02}/{:02}", year.rem_euclid(100));
            }
            Some('T') => {
                let _ = write!(out, "{hour:02}:{minute:02}:{second:02}");
            }
            Some('R') => {
                let _ = write!(out, "{hour:02}:{minute:02}");
            }
            Some('s') => {
                let _ = write!(out, "{unix_secs}");
            }
            Some('Z') => out.push_str("UTC"),
            Some('z') => out.push_str("+0000"),
            Some('n') => out.push('\n'),
            Some('t') => out.push('\t'),
            Some('%') => out.push('%'),
            Some(other) => {
                out.push('%');
                if no_pad {
                    out.push('-');
                }
                out.push(other);
            }
            None => out.push('%'),
        }
    }
    out
}

/// (year, month 1-12, day 1-31) of a day count since 1970-01-01 (H. Hinnant's algorithm).
fn civil_from_days(days: i64) -> (i64, i64, i64) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

fn days_from_civil(year: i64, month: i64, day: i64) -> i64 {
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y.rem_euclid(400);
    let mp = (month + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

#[cfg(test)]
mod tests {
    use super::*;

    fn msg(role: &str, content: &str) -> Message {
        Message::new(role, content)
    }

    fn render(src: &str, messages: &[Message], agp: bool) -> Result<String> {
        ChatTemplate::new(src, "<s>", "</s>")?.render(messages, agp)
    }

    #[test]
    fn a_runaway_loop_is_an_error_not_a_hang() {
        let src = "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}";
        let err = render(src, &[msg("user", "hi")], true).unwrap_err().to_string();
        assert!(err.contains("runaway loop"), "{err}");
    }

    #[test]
    fn syntax_error_is_template_error() {
        let err = ChatTemplate::new("{% for m in messages %}", "", "").err().unwrap();
        assert!(matches!(err, Error::Template(_)), "{err:?}");
        let err = ChatTemplate::new("{{ 1 + }}", "", "").err().unwrap();
        assert!(matches!(err, Error::Template(_)), "{err:?}");
    }

    #[test]
    fn raise_exception_message_comes_back_verbatim() {
        let err = render("{{ raise_exception('roles must alternate') }}", &[], false).unwrap_err();
        match err {
            Error::Template(m) => assert_eq!(m, "roles must alternate"),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn runtime_errors_are_template_errors() {
        // Attribute of an undefined value fails, as with jinja2's Undefined.
        let err = render("{{ nothing.here }}", &[], false).unwrap_err();
        assert!(matches!(err, Error::Template(_)), "{err:?}");
    }

    #[test]
    fn special_tokens_and_flags_are_in_context() {
        let out = render(
            "{{ bos_token }}{{ messages[0].content }}{{ eos_token }}{{ add_generation_prompt }}",
            &[msg("user", "hi")],
            true,
        )
        .unwrap();
        assert_eq!(out, "<s>hi</s>True");
    }

    #[test]
    fn template_is_send_and_sync() {
        fn check<T: Send + Sync>() {}
        check::<ChatTemplate>();
    }

    #[test]
    fn generation_tags_render_their_body() {
        let src = "a{%- generation -%} b {%- endgeneration %}c{% generation_x %}";
        assert_eq!(rewrite_generation_tags(src), "a{%- if true -%} b {%- endif %}c{% generation_x %}");
        let out = render("{% generation %}x{% endgeneration %}", &[], false).unwrap();
        assert_eq!(out, "x");
    }

    #[test]
    fn python_float_repr_matches_python() {
        let cases = [
            (1.0, "1.0"),
            (0.1, "0.1"),
            (-0.0, "-0.0"),
            (1e16, "1e+16"),
            (1e15, "1000000000000000.0"),
            (123456.789, "123456.789"),
            (0.0001, "0.0001"),
            (0.00001, "1e-05"),
            (1.5e-300, "1.5e-300"),
            (2.5e100, "2.5e+100"),
            (f64::NAN, "NaN"),
            (f64::NEG_INFINITY, "-Infinity"),
        ];
        for (f, want) in cases {
            assert_eq!(python_float_repr(f), want, "{f}");
        }
    }

    #[test]
    fn tojson_rejects_undefined_and_bad_options() {
        assert!(render("{{ nope | tojson }}", &[], false).is_err());
        assert!(render("{{ 1 | tojson(separators=1) }}", &[], false).is_err());
        assert!(render("{{ 1 | tojson(bogus=1) }}", &[], false).is_err());
        assert_eq!(render("{{ 'x' | tojson(indent='\t') }}", &[], false).unwrap(), "\"x\"");
    }

    #[test]
    fn strftime_matches_glibc() {
        // 2024-07-26 13:25:09 UTC, a Friday; values checked with Python's strftime.
        let t = 1_722_000_309;
        assert_eq!(strftime_utc("%d %b %Y", t), "26 Jul 2024");
        assert_eq!(strftime_utc("%A %B %-d, %y %H:%M:%S %I%p %j", t), "Friday July 26, 24 13:25:09 01PM 208");
        assert_eq!(strftime_utc("%F %T %% %Q", t), "2024-07-26 13:25:09 % %Q");
        // Leap day and a date before the epoch.
        assert_eq!(strftime_utc("%Y-%m-%d %a %j", 951_782_400), "2000-02-29 Tue 060");
        assert_eq!(strftime_utc("%Y-%m-%d %H:%M", -1), "1969-12-31 23:59");
        // strftime_now is reachable from templates.
        let year = render("{{ strftime_now('%Y') }}", &[], false).unwrap();
        assert_eq!(year.len(), 4);
    }

    #[test]
    fn hf_dir_template_sources() {
        let dir = std::env::temp_dir().join(format!("ferrite-ct-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        assert_eq!(template_from_hf_dir(&dir).unwrap(), None);

        let cfg = dir.join("tokenizer_config.json");
        std::fs::write(&cfg, r#"{"bos_token": "<s>"}"#).unwrap();
        assert_eq!(template_from_hf_dir(&dir).unwrap(), None);

        std::fs::write(&cfg, r#"{"chat_template": "A"}"#).unwrap();
        assert_eq!(template_from_hf_dir(&dir).unwrap().as_deref(), Some("A"));

        let list = r#"{"chat_template": [{"name": "tool_use", "template": "T"},
                                          {"name": "default", "template": "D"}]}"#;
        std::fs::write(&cfg, list).unwrap();
        assert_eq!(template_from_hf_dir(&dir).unwrap().as_deref(), Some("D"));

        std::fs::write(&cfg, r#"{"chat_template": [{"name": "rag", "template": "R"}]}"#).unwrap();
        assert!(matches!(template_from_hf_dir(&dir), Err(Error::Template(_))));
        std::fs::write(&cfg, r#"{"chat_template": 3}"#).unwrap();
        assert!(matches!(template_from_hf_dir(&dir), Err(Error::Format(_))));
        std::fs::write(&cfg, "{not json").unwrap();
        assert!(matches!(template_from_hf_dir(&dir), Err(Error::Format(_))));

        std::fs::write(dir.join("chat_template.jinja"), "J").unwrap();
        assert_eq!(template_from_hf_dir(&dir).unwrap().as_deref(), Some("J"));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
