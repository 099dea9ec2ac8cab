//! The `inflight` binary as a child process: killed when dropped (also when a test fails), so that no
//! test leaves a server running.

use std::io::{BufRead, BufReader, Lines};
use std::process::{Child, ChildStderr, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// A running `inflight`.
pub struct Running {
    child: Child,
    /// Its log (stderr), when it was started by [`Running::start`].
    log: Option<Lines<BufReader<ChildStderr>>>,
    exited: bool,
}

impl Running {
    /// `inflight ARGS` with an empty environment, once it has logged that it started; returns that line.
    /// Its log stays open (a server whose stderr is closed may behave otherwise).
    pub fn start(args: &[&str]) -> (Self, String) {
        Self::start_with_env(args, &[])
    }

    /// As [`Running::start`], with only `env` in its environment.
    pub fn start_with_env(args: &[&str], env: &[(&str, &str)]) -> (Self, String) {
        Self::start_command(
            Command::new(env!("CARGO_BIN_EXE_inflight"))
                .args(args)
                .env_clear()
                .envs(env.iter().copied()),
        )
    }

    /// As [`Running::start`], the process `command` starts (`inflight` under a shell, say).
    pub fn start_command(command: &mut Command) -> (Self, String) {
        let mut running = Self::spawn(command.stderr(Stdio::piped()));
        let mut log = BufReader::new(running.child.stderr.take().expect("piped")).lines();
        let started = log
            .by_ref()
            .map_while(Result::ok)
            .find(|line| line.contains("inflight started"))
            .expect("inflight starts");
        running.log = Some(log);
        (running, started)
    }

    /// The process `command` starts, as it is set up.
    pub fn spawn(command: &mut Command) -> Self {
        Self {
            child: command.spawn().expect("run inflight"),
            log: None,
            exited: false,
        }
    }

    /// Sends `signal` (as `kill` names it, e.g. `-TERM`).
    pub fn signal(&self, signal: &str) {
        let status = Command::new("kill")
            .args([signal, &self.child.id().to_string()])
            .status()
            .expect("run kill");
        assert!(status.success(), "kill {signal} failed");
    }

    /// Its process id.
    #[allow(dead_code)] // not every test binary that includes this module asks
    pub fn id(&self) -> u32 {
        self.child.id()
    }

    /// True while it has not exited.
    pub fn is_running(&mut self) -> bool {
        self.child.try_wait().expect("try_wait").is_none()
    }

    /// Its exit status; a panic (and a kill, on drop) if it has not exited within `limit`.
    pub fn wait_for(&mut self, limit: Duration) -> ExitStatus {
        let deadline = Instant::now() + limit;
        loop {
            if let Some(exit) = self.child.try_wait().expect("try_wait") {
                self.exited = true;
                return exit;
            }
            assert!(Instant::now() < deadline, "still running after {limit:?}");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// What it logged after its start line; reads to the end, so call it once it has exited.
    pub fn rest_of_log(&mut self) -> Vec<String> {
        self.log
            .as_mut()
            .map(|log| log.map_while(Result::ok).collect())
            .unwrap_or_default()
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if !self.exited {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// The address in a start line's `listen=` field.
pub fn listen_of(started: &str) -> String {
    started
        .split_whitespace()
        .find_map(|field| field.strip_prefix("listen="))
        .unwrap_or_else(|| panic!("no listen= in {started}"))
        .to_owned()
}

/// The address in a start line's `admin=` field (the proxy's admin listener).
#[allow(dead_code)] // not every test binary that includes this module asks
pub fn admin_of(started: &str) -> String {
    started
        .split_whitespace()
        .find_map(|field| {
            field
                .strip_prefix("admin=\"")
                .or_else(|| field.strip_prefix("admin="))
        })
        .map(|addr| addr.trim_end_matches('"').to_owned())
        .unwrap_or_else(|| panic!("no admin= in {started}"))
}

/// The arguments of `inflight proxy` on free ports (`--listen` and `--admin-listen` 127.0.0.1:0) in
/// front of `upstream`, then `more`.
pub fn proxy_args<'a>(upstream: &'a str, more: &[&'a str]) -> Vec<&'a str> {
    let mut args = vec![
        "proxy",
        "--listen",
        "127.0.0.1:0",
        "--admin-listen",
        "127.0.0.1:0",
        "--upstream",
        upstream,
    ];
    args.extend_from_slice(more);
    args
}
