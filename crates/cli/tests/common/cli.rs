//! Driving the `ferrite` binary as a user does, for the CLI tests: good input
//! gives the documented output; bad input exits non-zero with one `error:`
//! line naming the problem and never a panic or a backtrace.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

pub fn ferrite_cmd(args: &[&str]) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_ferrite"));
    // A panic would print its backtrace; the error checks look for it.
    c.args(args).env("RUST_BACKTRACE", "1").stdin(Stdio::null());
    c
}

pub fn ferrite(args: &[&str]) -> Output {
    ferrite_cmd(args).output().expect("cannot start ferrite")
}

pub fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// Runs a command that must succeed; returns (stdout, stderr).
pub fn ok(args: &[&str]) -> (String, String) {
    let o = ferrite(args);
    let (out, err) = (text(&o.stdout), text(&o.stderr));
    assert!(o.status.success(), "ferrite {args:?} failed ({}):\nstdout: {out}\nstderr: {err}", o.status);
    assert!(!err.contains("panicked"), "ferrite {args:?} panicked:\n{err}");
    (out, err)
}

/// Checks a failed run: non-zero exit, nothing on stdout, no panic, and the last
/// stderr line is the only `error:` line, mentioning every needle
/// (case-insensitively). Lines before it may only be the status lines a command
/// prints once the model is loaded. Returns the error line.
pub fn check_failure(args: &[&str], o: &Output, needles: &[&str]) -> String {
    let (out, err) = (text(&o.stdout), text(&o.stderr));
    let ctx = format!("ferrite {args:?}\nstatus: {}\nstdout: {out}\nstderr: {err}", o.status);
    assert!(!o.status.success(), "expected a failure: {ctx}");
    assert_eq!(o.status.code(), Some(1), "expected exit code 1: {ctx}");
    assert!(out.is_empty(), "nothing may reach stdout on failure: {ctx}");
    for bad in ["panicked", "backtrace", "RUST_BACKTRACE", "memory allocation"] {
        assert!(!err.contains(bad), "stderr mentions {bad:?}: {ctx}");
    }
    let lines: Vec<&str> = err.lines().collect();
    let last = *lines.last().unwrap_or(&"");
    assert!(last.starts_with("error: "), "last stderr line is not an error: {ctx}");
    for l in &lines[..lines.len() - 1] {
        let status = ["loaded ", "warning: ", "note: "].iter().any(|p| l.starts_with(p));
        assert!(status, "unexpected stderr line {l:?}: {ctx}");
    }
    let lower = last.to_lowercase();
    for n in needles {
        assert!(lower.contains(&n.to_lowercase()), "error line does not mention {n:?}: {ctx}");
    }
    last.to_string()
}

/// A failure found before any model is loaded: stderr is exactly one line.
pub fn fails(args: &[&str], needles: &[&str]) -> String {
    let o = ferrite(args);
    let line = check_failure(args, &o, needles);
    assert_eq!(text(&o.stderr).lines().count(), 1, "stderr must be one line: {}", text(&o.stderr));
    line
}

/// A failure found once the model is loaded (its status line may precede the error).
pub fn fails_after_load(args: &[&str], needles: &[&str]) -> String {
    let o = ferrite(args);
    check_failure(args, &o, needles)
}

/// A fresh, empty scratch directory for one test.
pub fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("ferrite-cli-test-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

pub fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// Runs `ferrite ARGS` with `input` on stdin, closed after it (the user's Ctrl-D).
pub fn with_stdin(args: &[&str], input: &[u8]) -> Output {
    use std::io::Write;
    let mut child =
        ferrite_cmd(args).stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    // (A child that exits before reading it all closes the pipe: not a failure here.)
    if let Err(e) = child.stdin.take().unwrap().write_all(input) {
        assert_eq!(e.kind(), std::io::ErrorKind::BrokenPipe, "{e}");
    }
    child.wait_with_output().unwrap()
}
