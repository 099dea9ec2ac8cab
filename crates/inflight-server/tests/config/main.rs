//! The `inflight` binary's settings: flags > environment > file > defaults, the Dify aliases, bad values
//! named, secrets never logged, SIGTERM handled. Runs the real binary.
//!
//! By theme: where each setting comes from (layers.rs), bad values refused by name (refusals.rs),
//! and the running process: its log, its secrets, SIGTERM and its workers (process.rs).
#![allow(missing_docs)]

#[path = "../common/mod.rs"]
mod common;
mod layers;
mod process;
mod refusals;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};

/// Runs `inflight ARGS` with only `env` set (plus PATH); returns its start line, or its failure output.
fn start(args: &[&str], env: &[(&str, &str)]) -> Result<String, String> {
    let mut child = Command::new(env!("CARGO_BIN_EXE_inflight"))
        .args(args)
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .envs(env.iter().copied())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run inflight");
    let stderr = BufReader::new(child.stderr.take().unwrap());
    let mut seen = String::new();
    for line in stderr.lines() {
        let line = line.unwrap();
        if line.contains("inflight started") {
            child.kill().unwrap();
            child.wait().unwrap();
            return Ok(line);
        }
        seen.push_str(&line);
        seen.push('\n');
    }
    let status = child.wait().unwrap();
    assert!(
        !status.success(),
        "inflight exited 0 without starting: {seen}"
    );
    Err(seen)
}

fn serve(args: &[&str], env: &[(&str, &str)]) -> Result<String, String> {
    let mut all = vec!["serve", "--listen", "127.0.0.1:0"];
    all.extend_from_slice(args);
    start(&all, env)
}

fn file(contents: &str) -> tempfile::NamedTempFile {
    let mut file = tempfile::Builder::new().suffix(".toml").tempfile().unwrap();
    std::io::Write::write_all(&mut file, contents.as_bytes()).unwrap();
    file
}

fn proxy(args: &[&str], env: &[(&str, &str)]) -> Result<String, String> {
    start(
        &common::process::proxy_args("http://127.0.0.1:9", args),
        env,
    )
}
