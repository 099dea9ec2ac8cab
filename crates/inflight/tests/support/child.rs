//! Child processes of a test binary: the binary run again, doing one role of its `child_process` test.

use std::process::{Child, Command, Stdio};

/// Runs this test binary again as a child process doing `role` (its ignored `child_process` test reads
/// `INFLIGHT_TEST_CHILD`), with `env` set.
pub fn spawn_child(role: &str, env: &[(&str, String)]) -> Child {
    let mut cmd = Command::new(std::env::current_exe().expect("test binary"));
    cmd.args([
        "--ignored",
        "--exact",
        "child_process",
        "--nocapture",
        "--test-threads=1",
    ])
    .env("INFLIGHT_TEST_CHILD", role)
    .stdout(Stdio::piped())
    .stderr(Stdio::inherit());
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.spawn().expect("spawn child test process")
}

/// Reads the child's output until `line`, then drains the rest in the background (so the child never
/// writes into a closed pipe).
pub fn wait_for_line(child: &mut Child, line: &str) {
    use std::io::BufRead;
    let mut lines = std::io::BufReader::new(child.stdout.take().expect("piped stdout")).lines();
    for got in lines.by_ref() {
        if got.expect("child output").contains(line) {
            std::thread::spawn(move || lines.for_each(drop));
            return;
        }
    }
    panic!("the child ended without saying {line:?}");
}

/// A variable the parent set for the child.
pub fn env(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| panic!("{name} not set"))
}
