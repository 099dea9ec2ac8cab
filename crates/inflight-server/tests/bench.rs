//! `inflight bench`: the real binary drives a store and prints one JSON line; its independent probe never
//! sees more permits in flight on a key than the limit.
#![allow(missing_docs)]

mod common;

use std::io::Seek;
use std::process::Command;
use std::time::Duration;

use common::process::Running;
use test_support::TestRedis;

/// Runs `inflight bench ARGS` (killed if it has not finished within 60 s); its one line of JSON, and
/// what it said on stderr.
fn bench_and_progress(args: &[&str]) -> (serde_json::Value, String) {
    let read = |mut file: std::fs::File| {
        file.rewind().expect("rewind");
        std::io::read_to_string(file).expect("utf-8")
    };
    let stdout = tempfile::tempfile().expect("a temporary file");
    let stderr = tempfile::tempfile().expect("a temporary file");
    let mut running = Running::spawn(
        Command::new(env!("CARGO_BIN_EXE_inflight"))
            .arg("bench")
            .args(args)
            .stdout(stdout.try_clone().expect("the file again"))
            .stderr(stderr.try_clone().expect("the file again")),
    );
    let status = running.wait_for(Duration::from_secs(60));
    let (stdout, stderr) = (read(stdout), read(stderr));
    assert!(status.success(), "inflight bench failed: {stderr}");
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), 1, "one line: {stdout}");
    (serde_json::from_str(lines[0]).expect("a JSON line"), stderr)
}

fn bench(args: &[&str]) -> serde_json::Value {
    bench_and_progress(args).0
}

/// A run of 2.5 s says how far it is once a second on stderr, and its JSON line stays alone on stdout.
#[test]
fn bench_prints_progress_to_stderr_while_it_runs() {
    let (report, stderr) = bench_and_progress(&["--duration", "2500ms", "--tasks", "4"]);
    assert!(report["pairs_per_sec"].as_f64().unwrap() > 0.0, "{report}");
    let progress: Vec<&str> = stderr
        .lines()
        .filter(|line| line.starts_with("inflight bench: ") && line.contains(" pairs, "))
        .collect();
    assert!(progress.len() >= 2, "a line a second: {stderr}");
    assert!(progress[0].contains("s of 2.5s, "), "{stderr}");
}

/// 16 tasks holding their permits 1 ms on a key of limit 3: admissions and refusals both happen, and the
/// probe never sees more than the limit (`reached`: it saw the limit itself, which on Redis, with a round
/// trip that may take longer than the hold on a loaded machine, is not certain).
fn assert_limited(report: &serde_json::Value, store: &str, threads: u64, reached: bool) {
    assert_eq!(report["store"], store);
    assert_eq!(report["tasks"], 16);
    assert_eq!(report["threads"], threads);
    assert_eq!(report["limit"], 3);
    assert_eq!(report["hold_us"], 1000);
    assert!(report["pairs_per_sec"].as_f64().unwrap() > 0.0, "{report}");
    assert!(
        report["rejected_per_sec"].as_f64().unwrap() > 0.0,
        "{report}"
    );
    let (p50, p99) = (
        report["p50_us"].as_f64().unwrap(),
        report["p99_us"].as_f64().unwrap(),
    );
    assert!(0.0 < p50 && p50 <= p99, "{report}");
    let seen = report["max_in_flight_seen"].as_u64().unwrap();
    assert!((1..=3).contains(&seen), "{report}");
    if reached {
        assert_eq!(seen, 3, "{report}");
    }
}

const LIMITED: [&str; 8] = [
    "--tasks",
    "16",
    "--limit",
    "3",
    "--hold",
    "1ms",
    "--duration",
    "300ms",
];

#[test]
fn bench_on_memory_prints_one_json_line_and_never_passes_the_limit() {
    for threads in ["1", "2"] {
        let mut args = vec!["--store", "memory://", "--threads", threads];
        args.extend(LIMITED);
        assert_limited(&bench(&args), "memory://", threads.parse().unwrap(), true);
    }
}

#[test]
fn bench_on_redis_prints_one_json_line_and_never_passes_the_limit() {
    let redis = TestRedis::start();
    let url = redis.url();
    let mut args = vec!["--store", url.as_str(), "--threads", "2"];
    args.extend(LIMITED);
    let report = bench(&args);
    assert_limited(&report, &url, 2, false);
    // What the load cost Redis itself: some CPU time, shared over the pairs (none on memory).
    let cpu = report["redis_cpu_us_per_pair"].as_f64();
    assert!(cpu.is_some_and(|us| us > 0.0), "{report}");
}

#[test]
fn bench_refuses_zero_threads_naming_the_flag() {
    let out = Command::new(env!("CARGO_BIN_EXE_inflight"))
        .args(["bench", "--threads", "0"])
        .output()
        .expect("run inflight bench");
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("--threads"), "{stderr}");
}
