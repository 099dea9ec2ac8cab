//! Fuzzing with proptest (stable Rust, no cargo-fuzz): hostile input against the API's routes (paths,
//! headers, JSON bodies), the server's reading of raw requests, the proxy's key templates and header
//! handling, and the settings (the TOML file, the flags). The promises: no panic, no 5xx but the
//! documented 502/503/504, every refusal JSON `{"code","message","status"}`, and the keys the proxy
//! admits are keys the API reads.
//!
//! Each target replays its corpus first (`tests/fuzz/corpus.json`: known hostile inputs, add to it), then
//! the seeds of past failures (`tests/fuzz/regressions/*.txt`, written by proptest), then `FUZZ_CASES`
//! random cases (default 64, so that the normal test run stays fast; `.ci/run` runs more).
#![allow(missing_docs)]

mod common;
#[path = "fuzz/api.rs"]
mod fuzz_api;
#[path = "fuzz/config.rs"]
mod fuzz_config;
#[path = "fuzz/proxy.rs"]
mod fuzz_proxy;

use proptest::strategy::Strategy;
use proptest::test_runner::{Config, FileFailurePersistence, TestCaseError, TestRunner};

/// Random cases per target.
fn cases() -> u32 {
    std::env::var("FUZZ_CASES")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(64)
}

/// The corpus of `target`: its entries in `tests/fuzz/corpus.json`.
fn corpus<T: serde::de::DeserializeOwned>(target: &str) -> Vec<T> {
    let text = include_str!("fuzz/corpus.json");
    let all: serde_json::Value = serde_json::from_str(text).expect("corpus.json is JSON");
    serde_json::from_value(all[target].clone())
        .unwrap_or_else(|e| panic!("corpus.json's {target:?}: {e}"))
}

/// Runs `check` on the corpus of `target`, then on random cases of `strategy`, persisting the seeds of
/// failures in `regressions` (a path under the crate).
fn fuzz<S: Strategy>(
    target: &str,
    regressions: &'static str,
    corpus: Vec<S::Value>,
    strategy: S,
    check: impl Fn(S::Value) -> Result<(), TestCaseError>,
) where
    S::Value: std::fmt::Debug,
{
    for case in corpus {
        let shown = format!("{case:?}");
        if let Err(failure) = check(case) {
            panic!("{target}: corpus case {shown} failed: {failure}");
        }
    }
    let config = Config {
        cases: cases(),
        failure_persistence: Some(Box::new(FileFailurePersistence::Direct(regressions))),
        // A failure's shrinking is bounded too, so that a run stays bounded.
        max_shrink_time: 30_000,
        ..Config::default()
    };
    let mut runner = TestRunner::new(config);
    if let Err(failure) = runner.run(&strategy, check) {
        panic!("{target}: {failure}");
    }
}

/// A multi-thread runtime for a target's servers and clients (the cases run on the test's thread).
fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a runtime")
}

#[test]
fn api_routes() {
    let runtime = runtime();
    let router = fuzz_api::router(&runtime);
    fuzz(
        "api_routes",
        "tests/fuzz/regressions/api_routes.txt",
        corpus("api_routes"),
        fuzz_api::requests(),
        |case| runtime.block_on(fuzz_api::check_route(&router, case)),
    );
}

#[test]
fn raw_requests() {
    let runtime = runtime();
    let server = runtime.block_on(fuzz_api::server());
    let corpus: Vec<String> = corpus("raw_requests");
    fuzz(
        "raw_requests",
        "tests/fuzz/regressions/raw_requests.txt",
        corpus.into_iter().map(String::into_bytes).collect(),
        fuzz_api::raw(),
        |bytes| runtime.block_on(fuzz_api::check_raw(&server.base, bytes)),
    );
}

#[test]
fn proxied_requests() {
    let runtime = runtime();
    let proxy = runtime.block_on(fuzz_proxy::Proxied::start());
    fuzz(
        "proxied_requests",
        "tests/fuzz/regressions/proxied_requests.txt",
        corpus("proxied_requests"),
        fuzz_proxy::requests(),
        |case| runtime.block_on(proxy.check(case)),
    );
}

#[test]
fn key_templates() {
    fuzz(
        "key_templates",
        "tests/fuzz/regressions/key_templates.txt",
        corpus("key_templates"),
        fuzz_proxy::templates(),
        fuzz_proxy::check_templates,
    );
}

#[test]
fn config_files() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    fuzz(
        "config_files",
        "tests/fuzz/regressions/config_files.txt",
        corpus("config_files"),
        fuzz_config::files(),
        |text| fuzz_config::check_file(dir.path(), &text),
    );
}

#[test]
fn flags() {
    fuzz(
        "flags",
        "tests/fuzz/regressions/flags.txt",
        corpus("flags"),
        fuzz_config::flags(),
        fuzz_config::check_flags,
    );
}
