//! End to end: the `ferrite` binary driven as a user drives it. Good input gives
//! the documented output; bad input (missing, truncated, corrupt or crafted model
//! files, bad flags) exits non-zero with one `error:` line naming the problem and
//! never a panic or a backtrace.

mod common;
use common::cli::*;
use common::*;

use std::path::PathBuf;
use std::process::Stdio;

// ---------------------------------------------------------------------------
// Helpers

/// The generation summary on stderr: "[P prompt tokens, G generated, ...]".
fn counts(stderr: &str) -> (usize, usize) {
    let line = stderr.lines().find(|l| l.starts_with('[') && l.contains("prompt tokens")).expect("no summary line");
    let nums: Vec<usize> = line
        .trim_matches(|c| c == '[' || c == ']')
        .split(", ")
        .filter_map(|p| p.split(' ').next()?.parse().ok())
        .collect();
    (nums[0], nums[1])
}

const Q: &str = "What is 2+2?";

// ---------------------------------------------------------------------------
// run

#[test]
fn run_prints_only_the_completion() {
    let (out, err) = ok(&["run", "smollm2", "--prompt", Q, "--max-tokens", "16", "--temperature", "0"]);
    assert!(!out.trim().is_empty(), "empty completion");
    assert!(out.ends_with('\n'));
    // Status goes to stderr only.
    assert!(!out.contains("loaded") && !out.contains("prompt tokens"), "status on stdout: {out:?}");
    assert!(err.contains("loaded smollm2"), "{err}");
    let (_, generated) = counts(&err);
    assert!((1..=16).contains(&generated), "{err}");
    // Greedy is deterministic; llama.cpp's short flags say the same.
    let (again, _) = ok(&["run", "smollm2", "-p", Q, "-n", "16", "--temp", "0"]);
    assert_eq!(out, again);
    // Template variables SmolLM2's template does not read change nothing.
    let vars = ["--chat-template-kwargs", r#"{"enable_thinking": false}"#];
    let (with_vars, _) = ok(&[&["run", "smollm2", "-p", Q, "-n", "16", "--temp", "0"][..], &vars].concat());
    assert_eq!(out, with_vars);
    for bad in ["[1]", "{nope", r#"{"messages": []}"#] {
        let o = ferrite(&["run", "smollm2", "--chat-template-kwargs", bad, "-p", "hi"]);
        let err = text(&o.stderr);
        assert!(o.status.code() == Some(2) && err.contains("--chat-template-kwargs"), "{bad}: {err}");
    }
}

#[test]
fn run_prompt_from_a_file_or_stdin() {
    let (inline, _) = ok(&["run", "smollm2", "--prompt", Q, "--max-tokens", "8", "--temperature", "0"]);
    let dir = scratch("prompt-file");
    let file = dir.join("q.txt");
    std::fs::write(&file, Q).unwrap();
    let (from_file, _) = ok(&["run", "smollm2", "--file", s(&file), "--max-tokens", "8", "--temperature", "0"]);
    assert_eq!(from_file, inline);
    let args = ["run", "smollm2", "-f", "-", "-n", "8", "--temperature", "0"];
    let mut cmd = ferrite_cmd(&args);
    let mut child = cmd.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    std::io::Write::write_all(&mut child.stdin.take().unwrap(), Q.as_bytes()).unwrap();
    let o = child.wait_with_output().unwrap();
    assert!(o.status.success(), "{}", text(&o.stderr));
    assert_eq!(text(&o.stdout), inline);
    // Bad files fail before the model loads.
    fails(&["run", "smollm2", "-f", "/nonexistent/q.txt"], &["/nonexistent/q.txt"]);
    std::fs::write(&file, b"caf\xe9").unwrap();
    fails(&["run", "smollm2", "-f", s(&file)], &["q.txt", "UTF-8"]);
    let both = ferrite(&["run", "smollm2", "-p", "x", "-f", s(&file)]);
    assert_eq!(both.status.code(), Some(2), "{}", text(&both.stderr));
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn run_same_seed_same_output() {
    let args =
        ["run", "smollm2", "--prompt", "Tell me a story.", "--max-tokens", "16", "--seed", "7", "--temperature", "0.9"];
    let (a, _) = ok(&args);
    let (b, _) = ok(&args);
    assert!(!a.trim().is_empty());
    assert_eq!(a, b, "same seed, different output");
}

#[test]
fn run_raw_skips_the_template() {
    // A text to continue (a raw question may well be answered by end-of-text).
    const P: &str = "The capital of France is";
    let (templ_out, templ_err) = ok(&["run", "smollm2", "--prompt", P, "--max-tokens", "4", "--temperature", "0"]);
    let (raw_out, raw_err) = ok(&["run", "smollm2", "--prompt", P, "--max-tokens", "4", "--temperature", "0", "--raw"]);
    assert!(raw_out.contains("Paris"), "{raw_out:?} {raw_err}");
    assert!(!templ_out.trim().is_empty(), "{templ_err}");
    // The ChatML template wraps the prompt in a system and a user turn.
    let (raw_prompt, _) = counts(&raw_err);
    let (templ_prompt, _) = counts(&templ_err);
    assert!(raw_prompt < 10 && templ_prompt > raw_prompt + 10, "raw {raw_prompt} vs template {templ_prompt} tokens");
}

#[test]
fn run_stop_string_cuts_before_it() {
    let base = ["run", "smollm2", "--prompt", Q, "--max-tokens", "16", "--temperature", "0"];
    let (full, _) = ok(&base);
    let full = full.trim_end_matches('\n');
    // A word from the middle of the greedy completion.
    let words: Vec<&str> = full.split_whitespace().filter(|w| w.chars().all(char::is_alphabetic)).collect();
    assert!(words.len() >= 3, "greedy completion too short to pick a stop word: {full:?}");
    let stop = words[words.len() / 2];
    let cut = full.find(stop).unwrap();
    let mut args = base.to_vec();
    args.extend(["--stop", stop]);
    let (out, err) = ok(&args);
    assert_eq!(out, format!("{}\n", &full[..cut]), "stop {stop:?} in {full:?}");
    assert!(err.contains("finish: stop"), "{err}");
}

/// `--json-schema`: the greedy reply is a value of the schema, and ends with
/// it; `--json` an object; a schema the grammar cannot enforce is refused
/// before the model loads.
#[test]
fn run_json_schema_constrains_the_reply() {
    let dir = scratch("json-schema");
    let schema = dir.join("cat.json");
    let doc = r#"{"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"},
        "color": {"enum": ["black", "white", "orange", null]}, "tag": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{2}$"}},
        "required": ["name", "age", "color", "tag"]}"#;
    std::fs::write(&schema, doc).unwrap();
    let p = schema.to_str().unwrap();
    let (out, err) =
        ok(&["run", "smollm2", "--prompt", "Describe a cat as JSON.", "--json-schema", p, "--temperature", "0"]);
    let v: serde_json::Value = serde_json::from_str(out.trim()).unwrap_or_else(|e| panic!("{e}: {out:?}"));
    let keys: Vec<&String> = v.as_object().unwrap().keys().collect();
    assert_eq!(keys, ["name", "age", "color", "tag"], "{out}");
    assert!(v["name"].is_string() && v["age"].is_i64(), "{out}");
    let tag = v["tag"].as_str().unwrap().as_bytes();
    let shape = |i: usize, b: &u8| {
        if i < 3 {
            b.is_ascii_uppercase()
        } else if i == 3 {
            *b == b'-'
        } else {
            b.is_ascii_digit()
        }
    };
    assert!(tag.len() == 6 && tag.iter().enumerate().all(|(i, b)| shape(i, b)), "{out}");
    assert!(err.contains("finish: stop"), "{err}");
    let (out, _) =
        ok(&["run", "smollm2", "--prompt", "A cat as JSON.", "--json", "--temperature", "0", "--max-tokens", "12"]);
    assert!(out.trim_start().starts_with('{'), "{out:?}");
    std::fs::write(&schema, r#"{"type": "string", "pattern": "(?=a)"}"#).unwrap();
    fails(&["run", "smollm2", "--prompt", "x", "--json-schema", p], &["look-around", "cat.json"]);
    fails(&["run", "smollm2", "--prompt", "x", "--json-schema", "/nonexistent/s.json"], &["/nonexistent/s.json"]);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `--regex`: the reply is a whole match, and generation stops where the
/// pattern allows nothing more.
#[test]
fn run_regex_constrains_the_reply() {
    let prompt = "Is the sky blue? Answer yes or no and a number from 1 to 10.";
    let (out, err) =
        ok(&["run", "smollm2", "--prompt", prompt, "--regex", "(Yes|No), [0-9]{1,2}\\.", "--temperature", "0"]);
    let reply = out.trim_end_matches('\n');
    let rest = reply.strip_prefix("Yes, ").or_else(|| reply.strip_prefix("No, ")).unwrap_or_else(|| panic!("{out:?}"));
    let digits = rest.strip_suffix('.').unwrap_or_else(|| panic!("{out:?}"));
    assert!((1..=2).contains(&digits.len()) && digits.bytes().all(|b| b.is_ascii_digit()), "{out:?}");
    assert!(err.contains("finish: stop"), "{err}");
    fails(&["run", "smollm2", "--prompt", "x", "--regex", "(a"], &["(a", "unclosed"]);
}

/// A GBNF grammar (a context-free one: nested lists) constrains the reply,
/// given inline or from a file; a bad grammar is one clear error.
#[test]
fn run_grammar_constrains_the_reply() {
    let gbnf = "root ::= list
list ::= \"[\" (item (\", \" item)*)? \"]\"
item ::= [a-z]+ | list";
    let prompt = "Write a list of three fruits.";
    let (out, err) =
        ok(&["run", "smollm2", "--prompt", prompt, "--grammar", gbnf, "--temperature", "0", "--max-tokens", "60"]);
    let reply = out.trim_end_matches('\n');
    assert!(err.contains("finish: stop"), "{err}");
    // Brackets balance and the words are lowercase letters.
    let mut depth = 0i32;
    for c in reply.chars() {
        depth += match c {
            '[' => 1,
            ']' => -1,
            _ => 0,
        };
        assert!(depth >= 0 && (c.is_ascii_lowercase() || "[], ".contains(c)), "{reply:?}");
    }
    assert!(depth == 0 && reply.starts_with('['), "{reply:?}");
    let file = scratch("grammar").join("list.gbnf");
    std::fs::write(&file, gbnf).unwrap();
    let (from_file, _) = ok(&[
        "run",
        "smollm2",
        "--prompt",
        prompt,
        "--grammar-file",
        s(&file),
        "--temperature",
        "0",
        "--max-tokens",
        "60",
    ]);
    assert_eq!(from_file, out);
    fails(&["run", "smollm2", "--prompt", "x", "--grammar", "root ::= root \"x\" | \"y\""], &["left-recursive"]);
    fails(&["run", "smollm2", "--prompt", "x", "--grammar", "root ::= root"], &["no finite text"]);
    fails_after_load(
        &["run", "smollm2", "--prompt", "x", "--grammar", "root ::= <think>"],
        &["not in the model's vocabulary"],
    );
    let both = ferrite(&["run", "smollm2", "--prompt", "x", "--grammar", "x", "--regex", "y"]);
    assert_eq!(both.status.code(), Some(2));
    assert!(text(&both.stderr).contains("cannot be used with"), "{}", text(&both.stderr));
}

#[test]
fn run_max_tokens_one() {
    let (out, err) = ok(&["run", "smollm2", "--prompt", Q, "--max-tokens", "1", "--temperature", "0"]);
    let (_, generated) = counts(&err);
    assert_eq!(generated, 1, "{err}");
    assert!(err.contains("finish: length"), "{err}");
    assert!(!out.trim().is_empty());
    // The one token is the start of the longer greedy completion.
    let (long, _) = ok(&["run", "smollm2", "--prompt", Q, "--max-tokens", "8", "--temperature", "0"]);
    assert!(long.starts_with(out.trim_end_matches('\n')), "{out:?} vs {long:?}");
}

#[test]
fn run_base_model_without_template_is_raw() {
    let (out, err) =
        ok(&["run", "gemma3-270m", "--prompt", "The capital of France is", "--max-tokens", "8", "--temperature", "0"]);
    assert!(!out.trim().is_empty(), "{err}");
    assert!(err.contains("no chat template"), "{err}");
    let (prompt, generated) = counts(&err);
    assert!(prompt < 10, "raw prompt should be a handful of tokens: {err}");
    assert!((1..=8).contains(&generated));
}

#[test]
fn interactive_chat_two_turns() {
    let o = with_stdin(&["run", "smollm2", "--max-tokens", "8", "--temperature", "0"], b"Hi\nWhat is 2+2?\n");
    let (out, err) = (text(&o.stdout), text(&o.stderr));
    assert!(o.status.success(), "chat failed: {err}");
    assert!(!err.contains("error"), "{err}");
    let replies: Vec<&str> = out.lines().collect();
    assert_eq!(replies.len(), 2, "expected two replies: {out:?}");
    assert!(replies.iter().all(|r| !r.trim().is_empty()), "{out:?}");
    // The first turn has the same prompt as a one-shot run.
    let (one_shot, _) = ok(&["run", "smollm2", "--prompt", "Hi", "--max-tokens", "8", "--temperature", "0"]);
    assert_eq!(format!("{}\n", replies[0]), one_shot);
}

#[test]
fn chat_drops_the_oldest_turns_to_fit_the_context() {
    let line = "Tell me one short fact about the sea, the sky, the hills and the rivers of the north.\n";
    let args = ["run", "smollm2", "--max-tokens", "8", "--temperature", "0", "--ctx-size", "160"];
    let o = with_stdin(&args, line.repeat(6).as_bytes());
    let (out, err) = (text(&o.stdout), text(&o.stderr));
    assert!(o.status.success(), "chat failed: {err}");
    assert!(!err.contains("error"), "{err}");
    assert!(err.contains("oldest messages were dropped"), "{err}");
    assert_eq!(out.lines().count(), 6, "a reply to every turn: {out:?}");
}

/// Output to a closed pipe (`| head`) ends the command quietly; to a full
/// disk, with one error line. Never a panic.
#[test]
fn stdout_closed_or_full() {
    let mut child = ferrite_cmd(&["run", "smollm2", "--prompt", "Write a long essay", "--max-tokens", "64"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stdout.take());
    let o = child.wait_with_output().unwrap();
    let err = text(&o.stderr);
    assert!(o.status.success() && !err.contains("panicked") && !err.contains("error"), "{}: {err}", o.status);
    for args in [&["inspect", "smollm2"][..], &["list"], &["run", "smollm2", "--prompt", "Hi", "--max-tokens", "4"]] {
        let full = std::fs::OpenOptions::new().write(true).open("/dev/full").unwrap();
        let o = ferrite_cmd(args).stdout(full).output().unwrap();
        check_failure(args, &o, &["standard output"]);
    }
}

// ---------------------------------------------------------------------------
// score, perplexity, bench, inspect, list

#[test]
fn score_json_lines() {
    let (out, _) = ok(&["score", "smollm2", "--tokens", "1,2,3", "--top", "3", "--json"]);
    let lines: Vec<serde_json::Value> = out.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(lines.len(), 3, "{out}");
    let toks = [1u64, 2, 3];
    for (i, o) in lines.iter().enumerate() {
        assert_eq!(o["pos"].as_u64(), Some(i as u64));
        let top = o["top"].as_array().unwrap();
        assert_eq!(top.len(), 3);
        let logits: Vec<f64> = top.iter().map(|p| p[1].as_f64().unwrap()).collect();
        assert!(logits.windows(2).all(|w| w[0] >= w[1]), "top not sorted: {o}");
        assert!(logits.iter().all(|x| x.is_finite()));
        if i + 1 < toks.len() {
            assert_eq!(o["next"].as_u64(), Some(toks[i + 1]), "{o}");
            let nl = o["next_logit"].as_f64().unwrap();
            assert!(nl.is_finite() && nl <= logits[0], "{o}");
        } else {
            assert!(o.get("next").is_none() && o.get("next_logit").is_none(), "{o}");
        }
    }
}

#[test]
fn perplexity_of_a_small_file() {
    let dir = scratch("ppl");
    let file = dir.join("text.txt");
    let sentence = "The quick brown fox jumps over the lazy dog while the cat sleeps in the sun. ";
    std::fs::write(&file, sentence.repeat(12)).unwrap();
    let (out, _) = ok(&["perplexity", "smollm2", "--file", s(&file), "--ctx", "32"]);
    let last = out.lines().last().unwrap();
    let value: f64 = last.strip_prefix("perplexity: ").expect(last).parse().unwrap();
    assert!((1.0..1000.0).contains(&value), "{last}");
    // llama.cpp's short flags.
    let (short, _) = ok(&["perplexity", "smollm2", "-f", s(&file), "-c", "32", "-t", "1"]);
    assert_eq!(short.lines().last().unwrap(), last);
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn bench_json() {
    let (out, _) =
        ok(&["bench", "smollm2", "--prompt-tokens", "16", "--gen-tokens", "4", "--repetitions", "1", "--json"]);
    assert_eq!(out.lines().count(), 1, "{out}");
    let o: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    for k in ["prefill_tokens_per_s", "decode_tokens_per_s"] {
        let v = o[k].as_f64().unwrap_or_else(|| panic!("no {k}: {o}"));
        assert!(v > 0.0 && v.is_finite(), "{k} = {v}");
    }
    assert_eq!(o["prompt_tokens"], 16);
    assert_eq!(o["gen_tokens"], 4);
    // The greedy picks' digest: what `gpu-ab.sh` compares between two
    // settings, so the same settings must give the same digest.
    let digest = o["decode_picks_digest"].as_str().unwrap_or_else(|| panic!("no digest: {o}")).to_string();
    assert!(digest.len() == 16 && digest.chars().all(|c| c.is_ascii_hexdigit()), "{digest}");
    let (again, _) = ok(&["bench", "smollm2", "-p", "0", "-n", "4", "-r", "1"]);
    assert!(again.contains(&format!("decode picks digest (last repetition): {digest}")), "{again}");
}

/// `--repeat-penalty` and the rest: the decode test's greedy draws read
/// each stream's history, so the picks change; a bad value is one error.
#[test]
fn bench_with_penalties() {
    // Long enough for the greedy picks to repeat a token.
    let args = ["bench", "smollm2", "-p", "0", "-n", "64", "-r", "1", "--json"];
    let digest = |extra: &[&str]| {
        let (out, _) = ok(&[&args[..], extra].concat());
        let o: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
        (o["decode_picks_digest"].as_str().unwrap().to_string(), o["repeat_penalty"].as_f64().unwrap())
    };
    let (plain, rep) = digest(&[]);
    assert_eq!(rep, 1.0);
    let penalized = ["--repeat-penalty", "1.5", "--presence-penalty", "1", "--frequency-penalty", "1"];
    let (with, rep) = digest(&penalized);
    assert_eq!(rep, 1.5);
    assert_ne!(plain, with, "the penalties changed no pick");
    assert_eq!(digest(&penalized).0, with, "the same penalties, other picks");
    fails(&["bench", "smollm2", "--repeat-penalty", "0"], &["--repeat-penalty must be"]);
}

#[test]
fn bench_with_nothing_to_time() {
    fails(&["bench", "smollm2", "--prompt-tokens", "0", "--gen-tokens", "0"], &["nothing to measure"]);
    fails(&["bench", "smollm2", "--repetitions", "0"], &["--repetitions"]);
    // Only decode: no prefill rate, rather than a rate of 0.
    let (out, _) =
        ok(&["bench", "smollm2", "--prompt-tokens", "0", "--gen-tokens", "2", "--repetitions", "1", "--json"]);
    let o: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    assert!(o["prefill_tokens_per_s"].is_null() && o["decode_tokens_per_s"].as_f64().unwrap() > 0.0, "{o}");
}

#[test]
fn inspect_describes_models() {
    let (out, _) = ok(&["inspect", "smollm2"]);
    for want in ["architecture:  llama", "tensor types:", "Q4_1", "tokenizer:", "BPE", "chat template: yes"] {
        assert!(out.contains(want), "inspect smollm2 lacks {want:?}:\n{out}");
    }
    let (out, _) = ok(&["inspect", "gemma3-270m"]);
    for want in ["architecture:  gemma3", "tensor types:", "Q4_K", "tokenizer:", "SPM", "chat template: none", "global"]
    {
        assert!(out.contains(want), "inspect gemma3-270m lacks {want:?}:\n{out}");
    }
    let (out, _) = ok(&["inspect", s(&fixture("hf/qwen3_tied"))]);
    assert!(out.contains("architecture:  qwen3") && out.contains("F32"), "{out}");
    assert!(out.contains("tokenizer:     unusable"), "the fixture has no tokenizer:\n{out}");
}

#[test]
fn list_shows_the_model_directory() {
    let home = scratch("list");
    let models = home.join("models");
    std::fs::create_dir_all(&models).unwrap();
    std::os::unix::fs::symlink(model_path("smollm2.gguf"), models.join("my-smollm.gguf")).unwrap();
    let empty_hub = home.join("hub");
    std::fs::create_dir_all(&empty_hub).unwrap();
    let o = ferrite_cmd(&["list"]).env("FERRITE_HOME", &home).env("HF_HUB_CACHE", &empty_hub).output().unwrap();
    let out = text(&o.stdout);
    assert!(o.status.success(), "{}", text(&o.stderr));
    assert_eq!(out.lines().count(), 1, "{out}");
    assert!(out.contains("my-smollm") && out.contains("gguf"), "{out}");

    // An empty model directory is not an error.
    std::fs::remove_file(models.join("my-smollm.gguf")).unwrap();
    let o = ferrite_cmd(&["list"]).env("FERRITE_HOME", &home).env("HF_HUB_CACHE", &empty_hub).output().unwrap();
    assert!(o.status.success());
    assert!(o.stdout.is_empty());
    assert!(text(&o.stderr).contains("no models"), "{}", text(&o.stderr));
    std::fs::remove_dir_all(&home).ok();

    // The real model directory lists the demo models.
    let (out, _) = ok(&["list"]);
    for name in ["smollm2", "gemma3-270m", "all-minilm-l6-v2"] {
        assert!(out.lines().any(|l| l.split_whitespace().next() == Some(name)), "{name} missing:\n{out}");
    }
}

// ---------------------------------------------------------------------------
// Bad user input

#[test]
fn missing_model_path() {
    fails(&["run", "/nonexistent/dir/model.gguf", "--prompt", "hi"], &["not found", "/nonexistent/dir/model.gguf"]);
    fails(&["score", "no-such-model-anywhere", "--tokens", "1"], &["no-such-model-anywhere"]);
}

#[test]
fn empty_directory() {
    let dir = scratch("empty");
    fails(&["run", s(&dir), "--prompt", "hi"], &["config.json", ".gguf"]);
    fails(&["inspect", s(&dir)], &["config.json"]);
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn truncated_gguf() {
    let dir = scratch("truncated");
    let real = std::fs::read(model_path("smollm2.gguf")).unwrap();
    for (name, n, needle) in [
        ("empty.gguf", 0, "too short"),
        ("head.gguf", 1000, "truncated"),
        ("tenmb.gguf", 10_000_000, "past the end"),
        ("minus1.gguf", real.len() - 1, "past the end"),
    ] {
        let p = dir.join(name);
        std::fs::write(&p, &real[..n]).unwrap();
        fails(&["run", s(&p), "--prompt", "hi"], &[needle, name]);
        fails(&["inspect", s(&p)], &[needle]);
    }
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn bad_magic() {
    let dir = scratch("magic");
    let p = dir.join("bad.gguf");
    let mut bytes = std::fs::read(model_path("smollm2.gguf")).unwrap()[..4096].to_vec();
    bytes[..4].copy_from_slice(b"GGUX");
    std::fs::write(&p, &bytes).unwrap();
    fails(&["run", s(&p), "--prompt", "hi"], &["bad magic"]);
    std::fs::write(&p, b"hello, I am a text file\n").unwrap();
    fails(&["score", s(&p), "--tokens", "1"], &["not a gguf"]);
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn unsupported_architecture_dir() {
    // BERT is an embedding model: `run` cannot generate with it.
    let bert = model_path("all-minilm-l6-v2");
    fails(&["run", s(&bert), "--prompt", "hi"], &["unsupported", "bert"]);
    fails(&["run", "all-minilm-l6-v2", "--prompt", "hi"], &["unsupported", "bert"]);
    fails(&["score", "all-minilm-l6-v2", "--tokens", "1,2"], &["bert"]);
}

#[test]
fn prompt_longer_than_context() {
    let long = "one two three four five six seven eight nine ten ".repeat(10);
    let e =
        fails_after_load(&["run", "smollm2", "--ctx-size", "32", "--prompt", &long, "--max-tokens", "4"], &["prompt"]);
    assert!(e.contains("32"), "{e}");
    // The chat keeps going after a too-long message, and says why.
    let args = ["run", "smollm2", "--ctx-size", "32", "--max-tokens", "4", "--temperature", "0"];
    let o = with_stdin(&args, format!("{long}\n").as_bytes());
    assert!(o.status.success());
    assert!(text(&o.stderr).contains("error: prompt is"), "{}", text(&o.stderr));
}

#[test]
fn absurd_context_size() {
    fails_after_load(
        &["score", "smollm2", "--tokens", "1,2", "--ctx-size", "1000000000000"],
        &["ctx-size", "KV cache"],
    );
    // Rounding up to whole blocks must not wrap around to a small size.
    fails_after_load(&["score", "smollm2", "--tokens", "1,2", "--ctx-size", &u64::MAX.to_string()], &["ctx-size"]);
    fails_after_load(&["run", "smollm2", "--ctx-size", "0", "--prompt", "hi"], &["context"]);
}

#[test]
fn bad_flags() {
    fails(&["score", "smollm2", "--tokens", "1,x"], &["--tokens", "\"x\""]);
    fails(&["score", "smollm2", "--tokens", "1,-2"], &["--tokens"]);
    fails(&["score", "smollm2", "--tokens", ","], &["--tokens", "empty"]);
    fails_after_load(&["score", "smollm2", "--tokens", "1,99999999"], &["99999999", "vocabulary"]);
    fails_after_load(&["score", "smollm2", "--tokens", "49152"], &["49152", "vocabulary"]);
    fails(&["run", "smollm2", "--temperature", "-1", "--prompt", "hi"], &["--temperature must", "-1"]);
    fails(&["run", "smollm2", "--temperature=-1", "--prompt", "hi"], &["temperature"]);
    fails(&["run", "smollm2", "--top-p", "2", "--prompt", "hi"], &["--top-p must"]);
    fails(&["run", "smollm2", "--presence-penalty", "inf", "--prompt", "hi"], &["--presence-penalty must"]);
    fails(&["run", "smollm2", "--threads", "0", "--prompt", "hi"], &["--threads"]);
}

#[test]
fn perplexity_bad_files() {
    fails(&["perplexity", "smollm2", "--file", "/nonexistent/text.txt", "--ctx", "32"], &["/nonexistent/text.txt"]);
    let dir = scratch("ppl-short");
    let p = dir.join("short.txt");
    std::fs::write(&p, "Too short.").unwrap();
    fails_after_load(&["perplexity", "smollm2", "--file", s(&p), "--ctx", "32"], &["fewer than one window"]);
    fails(&["perplexity", "smollm2", "--file", s(&p), "--ctx", "2"], &["--ctx"]);
    std::fs::write(&p, b"fine\nfine\nnot \xff fine\n").unwrap();
    fails(&["perplexity", "smollm2", "--file", s(&p), "--ctx", "32"], &["line 3", "UTF-8"]);
    std::fs::remove_dir_all(&dir).ok();
}

// ---------------------------------------------------------------------------
// Corrupt Hugging Face directories

/// A copy of an HF fixture with `edit` applied to its config and safetensors bytes.
fn hf_copy(name: &str, edit_config: impl Fn(&mut serde_json::Value), edit_st: impl Fn(&mut Vec<u8>)) -> PathBuf {
    let src = fixture("hf/qwen3_tied");
    let dir = scratch(name);
    let mut cfg: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(src.join("config.json")).unwrap()).unwrap();
    edit_config(&mut cfg);
    std::fs::write(dir.join("config.json"), serde_json::to_string_pretty(&cfg).unwrap()).unwrap();
    let mut st = std::fs::read(src.join("model.safetensors")).unwrap();
    edit_st(&mut st);
    std::fs::write(dir.join("model.safetensors"), st).unwrap();
    dir
}

fn header_len(st: &[u8]) -> usize {
    u64::from_le_bytes(st[..8].try_into().unwrap()) as usize
}

#[test]
fn hf_fixture_control() {
    // The unedited copy works, so the failures below come from the edits.
    let dir = hf_copy("hf-control", |_| {}, |_| {});
    let (out, _) = ok(&["score", s(&dir), "--tokens", "1,2,3", "--top", "2"]);
    assert_eq!(out.lines().count(), 3);
    // No tokenizer in the fixture: `run` says so.
    fails(&["run", s(&dir), "--prompt", "hi"], &["tokenizer"]);
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn corrupt_safetensors() {
    type Edit = Box<dyn Fn(&mut Vec<u8>)>;
    let cases: Vec<(&str, Edit, &[&str])> = vec![
        ("st-header-huge", Box::new(|st| st[..8].copy_from_slice(&(1u64 << 60).to_le_bytes())), &["header length"]),
        (
            "st-header-past-end",
            Box::new(|st| {
                let n = st.len() as u64 + 10;
                st[..8].copy_from_slice(&n.to_le_bytes())
            }),
            &["model.safetensors"],
        ),
        (
            "st-data-short",
            Box::new(|st| {
                let n = header_len(st);
                st.truncate(8 + n + 100)
            }),
            &["outside", "data section"],
        ),
        ("st-tiny", Box::new(|st| st.truncate(5)), &["too short"]),
        (
            "st-header-garbage",
            Box::new(|st| {
                let n = header_len(st);
                st[8..8 + n].fill(b'x')
            }),
            &["model.safetensors"],
        ),
    ];
    for (name, edit, needles) in cases {
        let dir = hf_copy(name, |_| {}, edit);
        fails(&["score", s(&dir), "--tokens", "1,2"], needles);
        fails(&["run", s(&dir), "--prompt", "hi"], needles);
        std::fs::remove_dir_all(&dir).ok();
    }
}

#[test]
fn corrupt_hf_config() {
    type Edit = Box<dyn Fn(&mut serde_json::Value)>;
    let cases: Vec<(&str, Edit, &[&str])> = vec![
        ("cfg-mamba", Box::new(|c| c["model_type"] = "mamba9".into()), &["unsupported", "mamba9"]),
        (
            "cfg-no-type",
            Box::new(|c| c.as_object_mut().unwrap().remove("model_type").map(drop).unwrap()),
            &["architecture"],
        ),
        ("cfg-layers", Box::new(|c| c["num_hidden_layers"] = 1_000_000_000_000_000u64.into()), &["layer count"]),
        ("cfg-hidden", Box::new(|c| c["hidden_size"] = (-5).into()), &["hidden_size"]),
        ("cfg-act", Box::new(|c| c["hidden_act"] = "relu7".into()), &["activation", "relu7"]),
        ("cfg-rope", Box::new(|c| c["rope_parameters"]["rope_type"] = "yarn9".into()), &["RoPE", "yarn9"]),
        // A setting of the wrong type is an error, not the default.
        ("cfg-eps-str", Box::new(|c| c["rms_norm_eps"] = "x".into()), &["rms_norm_eps", "not a number"]),
        ("cfg-theta-str", Box::new(|c| c["rope_parameters"]["rope_theta"] = "big".into()), &["rope_theta", "number"]),
        ("cfg-tied-str", Box::new(|c| c["tie_word_embeddings"] = "yes".into()), &["tie_word_embeddings"]),
        ("cfg-empty", Box::new(|c| *c = serde_json::json!({})), &["model_type is missing"]),
    ];
    // Caught when the weights load, after `run` has looked for the tokenizer.
    let weight_cases: Vec<(&str, Edit, &[&str])> = vec![
        ("cfg-vocab", Box::new(|c| c["vocab_size"] = 1_000_000_000_000u64.into()), &["shape", "embed_tokens"]),
        ("cfg-heads0", Box::new(|c| c["num_attention_heads"] = 0.into()), &["zero"]),
        ("cfg-kvheads", Box::new(|c| c["num_key_value_heads"] = 3.into()), &["KV heads"]),
        ("cfg-headdim", Box::new(|c| c["head_dim"] = 1_000_000_000_000u64.into()), &["head dim", "512"]),
        ("cfg-layers0", Box::new(|c| c["num_hidden_layers"] = 0.into()), &["zero"]),
        ("cfg-eps-neg", Box::new(|c| c["rms_norm_eps"] = (-1.0).into()), &["epsilon", "-1"]),
        ("cfg-theta-neg", Box::new(|c| c["rope_parameters"]["rope_theta"] = (-1.0).into()), &["RoPE base", "-1"]),
        ("cfg-layers-fewer", Box::new(|c| c["num_hidden_layers"] = 1.into()), &["layer count is 1", "blk.1."]),
    ];
    for (name, edit, needles) in weight_cases {
        let dir = hf_copy(name, edit, |_| {});
        fails(&["score", s(&dir), "--tokens", "1,2"], needles);
        // `inspect` shows what the config says, odd or not, without panicking.
        let err = text(&ferrite(&["inspect", s(&dir)]).stderr);
        assert!(!err.contains("panicked"), "inspect {name}: {err}");
        std::fs::remove_dir_all(&dir).ok();
    }
    for (name, edit, needles) in cases {
        let dir = hf_copy(name, edit, |_| {});
        fails(&["score", s(&dir), "--tokens", "1,2"], needles);
        fails(&["run", s(&dir), "--prompt", "hi"], needles);
        std::fs::remove_dir_all(&dir).ok();
    }
    // Not JSON at all.
    let dir = hf_copy("cfg-garbage", |_| {}, |_| {});
    std::fs::write(dir.join("config.json"), "{not json").unwrap();
    fails(&["run", s(&dir), "--prompt", "hi"], &["config.json"]);
    std::fs::remove_dir_all(&dir).ok();
}

/// `--device`: a bad name is a usage error; an explicit GPU that cannot be used
/// is one clear error (this suite runs without a GPU driver or with one).
#[test]
fn device_choice_errors() {
    let o = ferrite(&["bench", "smollm2", "--device", "tpu"]);
    assert!(!o.status.success());
    assert!(text(&o.stderr).contains("unknown device \"tpu\" (cpu, cuda or cuda:N)"), "{}", text(&o.stderr));
    fails(&["bench", "smollm2", "--device", "cuda:99"], &["cuda"]);
    fails(&["bench", "smollm2", "--gpu-memory-utilization", "0", "--device", "cpu"], &["gpu-memory-utilization"]);
}

/// `random:PRESET`: a model of a published shape with random weights, for
/// benchmarks; unknown presets and commands that need a tokenizer fail clearly.
#[test]
fn random_weight_models() {
    let (out, _) = ok(&[
        "bench",
        "random:smollm2-135m",
        "--device",
        "cpu",
        "--prompt-tokens",
        "8",
        "--gen-tokens",
        "2",
        "--batch",
        "2",
        "--repetitions",
        "1",
        "--json",
    ]);
    let j: serde_json::Value = serde_json::from_str(out.lines().last().unwrap()).unwrap();
    assert_eq!(j["batch"], 2);
    assert!(j["decode_tokens_per_s"].as_f64().unwrap() > 0.0);
    fails(&["bench", "random:gpt-9", "--device", "cpu"], &["gpt-9", "llama-3.1-8b"]);
    fails(&["run", "random:smollm2-135m", "--device", "cpu", "--prompt", "hi"], &["no tokenizer"]);
}
