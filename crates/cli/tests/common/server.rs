//! `ferrite serve` as a child process for the end-to-end server tests, curl,
//! and the repo's Python for the client scripts.

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use super::repo_root;

/// A running server, killed when dropped.
pub struct Server {
    child: Child,
    pub base: String,
    stderr: mpsc::Receiver<String>,
}

impl Server {
    /// `ferrite serve MODEL --port P --api-key KEY EXTRA...` on a free port;
    /// returns once it reports listening.
    pub fn start(model: &str, key: &str, extra: &[&str]) -> Server {
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let port_s = port.to_string();
        let mut args = vec!["serve", model, "--port", &port_s, "--api-key", key];
        args.extend_from_slice(extra);
        let mut child = Command::new(env!("CARGO_BIN_EXE_ferrite"))
            .args(&args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("cannot start ferrite serve");
        let (tx, rx) = mpsc::channel();
        let err = child.stderr.take().unwrap();
        std::thread::spawn(move || {
            for line in BufReader::new(err).lines().map_while(Result::ok) {
                let _ = tx.send(line);
            }
        });
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            let line = rx
                .recv_timeout(deadline.saturating_duration_since(Instant::now()))
                .unwrap_or_else(|_| panic!("ferrite serve did not report listening (exit: {:?})", child.try_wait()));
            assert!(!line.contains("panicked"), "{line}");
            if line.contains("listening on") {
                break;
            }
        }
        Server { child, base: format!("http://127.0.0.1:{port}"), stderr: rx }
    }

    /// Sends SIGTERM and waits for the exit status.
    pub fn terminate(mut self) -> std::process::ExitStatus {
        let pid = self.child.id().to_string();
        Command::new("kill").args(["-TERM", &pid]).status().unwrap();
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                let rest: Vec<String> = self.stderr.try_iter().collect();
                assert!(!rest.iter().any(|l| l.contains("panicked")), "{rest:?}");
                return status;
            }
            assert!(Instant::now() < deadline, "ferrite serve did not exit after SIGTERM");
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// curl; returns (HTTP status, body).
pub fn curl(args: &[&str]) -> (u16, String) {
    let out = Command::new("curl")
        .args(["-s", "-S", "--max-time", "120", "-w", "\n%{http_code}"])
        .args(args)
        .output()
        .expect("curl is required for the server tests");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (body, code) = text.rsplit_once('\n').unwrap_or(("", "0"));
    (code.trim().parse().unwrap_or(0), body.to_string())
}

/// The repo's `.venv` Python (scripts/setup-test-models.sh makes it).
pub fn python() -> PathBuf {
    let p = repo_root().join(".venv/bin/python");
    assert!(p.exists(), "{} is missing: run scripts/setup-test-models.sh first", p.display());
    p
}
