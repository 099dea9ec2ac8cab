//! The log as the binary writes it: `--log-format json` (one object a line), the proxy's access line for
//! each request (switched off by `--access-log false` or a directive), and no secret in any line.
#![allow(missing_docs)]

mod common;

use std::time::Duration;

use common::process::Running;
use common::Upstream;
use reqwest::{Client, StatusCode};
use serde_json::Value;

const API_KEY: &str = "sk-live-the-api-key-4f1c9a";
const BEARER: &str = "the-bearer-token-77d0e2";
const IN_QUERY: &str = "the-query-secret-0b5a13";

/// A JSON proxy in front of `upstream` (limit 1 per API key), with `args` and `env` besides; its
/// proxied base URL and its start line.
fn proxy(upstream: &Upstream, args: &[&str], env: &[(&str, &str)]) -> (Running, String, Value) {
    let mut all = common::process::proxy_args(
        &upstream.base,
        &[
            "--workers",
            "1",
            "--default-limit",
            "1",
            "--key",
            "user:{header:X-Api-Key}",
        ],
    );
    all.extend_from_slice(args);
    let (server, started) = Running::start_with_env(&all, env);
    let started: Value = serde_json::from_str(&started).expect("the start line is JSON");
    let base = format!("http://{}", started["listen"].as_str().expect("listen"));
    (server, base, started)
}

/// Stops `server` and returns what it logged after its start line, each line parsed as JSON.
fn stop(mut server: Running) -> (Vec<Value>, String) {
    server.signal("-TERM");
    let exit = server.wait_for(Duration::from_secs(10));
    assert!(exit.success(), "{exit:?}");
    let lines = server.rest_of_log();
    let parsed = lines
        .iter()
        .map(|line| serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}")))
        .collect();
    (parsed, lines.join("\n"))
}

/// GET `path` with the API key, answered 200 and read to its end.
async fn get_ok(http: &Client, base: &str, path: &str) {
    let answer = http
        .get(format!("{base}{path}"))
        .header("x-api-key", API_KEY)
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status(), StatusCode::OK);
    answer.bytes().await.unwrap();
}

fn access_lines(lines: &[Value]) -> Vec<&Value> {
    lines
        .iter()
        .filter(|line| line["target"] == "inflight::access")
        .collect()
}

/// The hash an access line shows of `key`: the first 16 hex digits of its SHA-256.
fn hash(key: &str) -> String {
    let digest = ring::digest::digest(&ring::digest::SHA256, key.as_bytes());
    digest.as_ref()[..8]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_proxy_writes_one_json_access_line_per_request_and_no_secret() {
    let upstream = Upstream::start().await;
    let (server, base, started) = proxy(&upstream, &["--log-format", "json"], &[]);
    assert_eq!(started["message"], "inflight started");
    assert_eq!(started["level"], "INFO");
    let http = Client::new();
    let with_key = |path: &str| {
        http.get(format!("{base}{path}"))
            .header("x-api-key", API_KEY)
            .header("authorization", format!("Bearer {BEARER}"))
    };
    // Admitted and forwarded; its query string carries a secret.
    let echoed = with_key(&format!("/echo/one?token={IN_QUERY}"))
        .send()
        .await
        .unwrap();
    assert_eq!(echoed.status(), StatusCode::OK);
    echoed.bytes().await.unwrap();
    // Held by a streamed response, so the next one is refused.
    let mut held = with_key("/sse").send().await.unwrap();
    assert_eq!(held.status(), StatusCode::OK);
    assert!(held.chunk().await.unwrap().is_some());
    let refused = with_key("/echo/two").send().await.unwrap();
    assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
    upstream.gate.add_permits(2);
    while held.chunk().await.unwrap().is_some() {}
    // No key: the proxy's own 400.
    let missing = http.get(format!("{base}/echo/three")).send().await.unwrap();
    assert_eq!(missing.status(), StatusCode::BAD_REQUEST);
    drop(http);

    let (lines, text) = stop(server);
    for secret in [API_KEY, BEARER, IN_QUERY] {
        assert!(!text.contains(secret), "{secret} logged:\n{text}");
    }
    let access = access_lines(&lines);
    assert_eq!(access.len(), 4, "one line per request: {access:?}");
    let line = |path: &str| {
        *access
            .iter()
            .find(|line| line["path"] == path)
            .unwrap_or_else(|| panic!("no access line for {path}: {access:?}"))
    };
    let key_hash = hash(&format!("user:{API_KEY}"));
    let one = line("/echo/one");
    assert_eq!(one["level"], "INFO");
    assert_eq!(one["method"], "GET");
    assert_eq!(one["status"], 200);
    assert_eq!(one["result"], "admitted");
    assert_eq!(one["class"], "default");
    assert_eq!(one["key_hash"], key_hash.as_str());
    assert!(one["duration_ms"].is_u64(), "{one}");
    assert!(
        one.get("key").is_none(),
        "the key itself is not logged: {one}"
    );
    let streamed = line("/sse");
    assert_eq!(
        (&streamed["status"], &streamed["result"]),
        (&200.into(), &"admitted".into())
    );
    let two = line("/echo/two");
    assert_eq!(two["status"], 429);
    assert_eq!(two["result"], "refused");
    assert_eq!(two["key_hash"], key_hash.as_str());
    assert!(two["code"].is_string(), "{two}");
    let three = line("/echo/three");
    assert_eq!(three["status"], 400);
    assert_eq!(three["result"], "error");
    assert_eq!(three["code"], "missing_key");
    assert_eq!(three["class"], "none");
    assert!(three.get("key_hash").is_none(), "{three}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn access_log_false_writes_no_access_line() {
    let upstream = Upstream::start().await;
    let (server, base, _) = proxy(
        &upstream,
        &["--log-format", "json", "--access-log", "false"],
        &[],
    );
    get_ok(&Client::new(), &base, "/echo/one").await;
    assert_eq!(upstream.hits(), 1);
    let (lines, _) = stop(server);
    assert!(
        lines.iter().any(|line| line["message"]
            .as_str()
            .is_some_and(|m| m.starts_with("shutting down"))),
        "the rest of the log is written: {lines:?}"
    );
    assert!(access_lines(&lines).is_empty(), "{lines:?}");
}

/// The environment's names: INFLIGHT_LOG_FORMAT, and INFLIGHT_LOG with tracing's directives (here the
/// access lines off, the rest at info).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inflight_log_takes_directives_from_the_environment() {
    let upstream = Upstream::start().await;
    let env = [
        ("INFLIGHT_LOG_FORMAT", "json"),
        ("INFLIGHT_LOG", "info,inflight::access=off"),
    ];
    let (server, base, _) = proxy(&upstream, &[], &env);
    get_ok(&Client::new(), &base, "/echo/one").await;
    let (lines, _) = stop(server);
    assert!(!lines.is_empty());
    assert!(access_lines(&lines).is_empty(), "{lines:?}");
}

/// SIGHUP puts the file's `log_level` in force: the access lines, off at the start, are written after
/// the reload; and a bad level in the file is refused, keeping the one in force.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_puts_the_files_log_level_in_force() {
    let upstream = Upstream::start().await;
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("inflight.toml");
    std::fs::write(&file, "log_level = \"info,inflight::access=off\"\n").unwrap();
    let config = file.to_str().unwrap();
    let (server, base, _) = proxy(
        &upstream,
        &["--log-format", "json", "--config", config],
        &[],
    );
    let http = Client::new();
    get_ok(&http, &base, "/echo/before").await;
    std::fs::write(&file, "log_level = \"info\"\n").unwrap();
    server.signal("-HUP");
    // Requests until a while after the reload must have happened (it takes a moment).
    for n in 0..20 {
        get_ok(&http, &base, &format!("/echo/after-{n}")).await;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    std::fs::write(&file, "log_level = \"info,[=nonsense\"\n").unwrap();
    server.signal("-HUP");
    // A while for the refused reload to be logged before the server stops.
    for _ in 0..20 {
        get_ok(&http, &base, "/echo/kept").await;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let (lines, text) = stop(server);
    let paths: Vec<&str> = access_lines(&lines)
        .iter()
        .filter_map(|line| line["path"].as_str())
        .collect();
    assert!(!paths.contains(&"/echo/before"), "{paths:?}");
    assert!(
        paths.contains(&"/echo/after-19"),
        "the reloaded level: {text}"
    );
    assert!(
        paths.contains(&"/echo/kept"),
        "a bad level keeps the one in force: {text}"
    );
    let reloaded = lines
        .iter()
        .filter(|l| l["message"] == "limits reloaded")
        .count();
    let refused = lines.iter().filter(|l| {
        l["message"]
            .as_str()
            .is_some_and(|m| m.starts_with("reload refused"))
    });
    assert_eq!((reloaded, refused.count()), (1, 1), "{text}");
}

/// `inflight serve ARGS` that exits at once: its stderr.
fn refused(args: &[&str]) -> String {
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_inflight"))
        .arg("serve")
        .args(["--listen", "127.0.0.1:0"])
        .args(args)
        .env_clear()
        .output()
        .expect("run inflight");
    assert!(!output.status.success(), "{args:?} was accepted");
    String::from_utf8_lossy(&output.stderr).into_owned()
}

#[test]
fn the_log_settings_come_from_the_file_too_and_bad_ones_are_named() {
    let stderr = refused(&["--log-level", "info,[=nonsense"]);
    assert!(stderr.contains("invalid setting `log_level`"), "{stderr}");
    let stderr = refused(&["--log-format", "xml"]);
    assert!(stderr.contains("--log-format"), "{stderr}");
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.toml");
    std::fs::write(&bad, "log_format = \"xml\"\n").unwrap();
    let stderr = refused(&["--config", bad.to_str().unwrap()]);
    assert!(stderr.contains("invalid setting `log_format`"), "{stderr}");
    std::fs::write(&bad, "access_log = \"maybe\"\n").unwrap();
    let stderr = refused(&["--config", bad.to_str().unwrap()]);
    assert!(stderr.contains("invalid setting `access_log`"), "{stderr}");

    let good = dir.path().join("good.toml");
    std::fs::write(&good, "log_format = \"json\"\nlog_level = \"debug\"\n").unwrap();
    let (_server, started) = Running::start(&[
        "serve",
        "--listen",
        "127.0.0.1:0",
        "--config",
        good.to_str().unwrap(),
    ]);
    let started: Value = serde_json::from_str(&started).expect("JSON, as the file says");
    assert_eq!(started["command"], "serve");
}
