//! The bearer token's hash, or the path's, as the key: the token (the path) itself is nowhere.

use reqwest::{Client, StatusCode};
use serde_json::Value;

use crate::common::process::{admin_of, listen_of, Running};
use crate::common::{get_json, get_text, Upstream};
use crate::{code_of, get};

/// The first 16 hex digits of the SHA-256 of `text`, as `{bearer_hash}` and `{path_hash}` give them.
fn short_hash(text: &str) -> String {
    let digest = ring::digest::digest(&ring::digest::SHA256, text.as_bytes());
    digest.as_ref()[..8]
        .iter()
        .map(|byte| format!("{byte:02x}"))
        .collect()
}

/// `inflight proxy` in front of `upstream`, limit 1 per key formed by `template`, per-key metrics, a
/// trace log.
fn proxy(upstream: &Upstream, template: &str) -> (Running, String) {
    let args = [
        "proxy",
        "--listen",
        "127.0.0.1:0",
        "--upstream",
        &upstream.base,
        "--default-limit",
        "1",
        "--metrics-per-key",
        "true",
        "--key",
        template,
        "--admin-listen",
        "127.0.0.1:0",
    ];
    Running::start_with_env(&args, &[("INFLIGHT_LOG", "trace")])
}

/// The bearer token is hashed into the key and appears in no key, answer, metric or log line.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_bearer_hash_is_the_key_and_the_token_is_nowhere() {
    const TOKEN: &str = "app-s3cr3t-T0KEN-4711";
    let hash = short_hash(TOKEN);
    let key = format!("user:{hash}");
    let upstream = Upstream::start().await;
    let (mut server, started) = proxy(&upstream, "user:{bearer_hash}");
    let base = format!("http://{}", listen_of(&started));
    let admin = format!("http://{}", admin_of(&started));
    let http = Client::new();
    let (bearer, shouted) = (format!("Bearer {TOKEN}"), format!("bEaReR {TOKEN}"));
    let stream = get(&http, format!("{base}/sse"), &[("authorization", &bearer)]).await;
    assert_eq!(stream.status(), StatusCode::OK);
    let status: Value = get_json(&http, format!("{admin}/v1/keys/{key}")).await;
    assert_eq!(status["in_flight"], 1, "{status}");
    let refused = get(
        &http,
        format!("{base}/echo/x"),
        &[("authorization", &shouted)],
    )
    .await;
    let refused = refused.text().await.unwrap();
    assert!(
        refused.contains(&key) && refused.contains("too_many_requests"),
        "{refused}"
    );
    let other = get(
        &http,
        format!("{base}/echo/x"),
        &[("authorization", "Bearer another")],
    )
    .await;
    assert_eq!(other.status(), StatusCode::OK);
    let echo: Value = other.json().await.unwrap();
    assert_eq!(
        echo["headers"]["authorization"], "Bearer another",
        "forwarded as it came"
    );
    let (status, body) = code_of(
        get(
            &http,
            format!("{base}/echo/x"),
            &[("authorization", "Basic eA==")],
        )
        .await,
    )
    .await;
    assert_eq!(
        (status, &body["code"]),
        (StatusCode::BAD_REQUEST, &"missing_key".into())
    );
    let metrics = get_text(&http, format!("{admin}/metrics")).await;
    assert!(
        metrics.contains(&hash),
        "the per-key metrics name the hash: {metrics}"
    );
    drop(stream);
    server.signal("-TERM");
    assert!(server
        .wait_for(std::time::Duration::from_secs(10))
        .success());
    let log = server.rest_of_log().join("\n");
    for (what, text) in [
        ("answer", &refused),
        ("metrics", &metrics),
        ("log", &log),
        ("start line", &started),
    ] {
        assert!(!text.contains(TOKEN), "the token is in the {what}: {text}");
        assert!(
            !text.contains("s3cr3t"),
            "part of the token is in the {what}: {text}"
        );
    }
}

/// `{path_hash}`: a path that carries a secret (Dify's MCP server URL, whose server code is its only
/// credential) keys the request by its hash; the path is in no key, answer or metric.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_path_hash_is_the_key_and_the_path_is_in_no_key() {
    let upstream = Upstream::start().await;
    let (_server, started) = proxy(&upstream, "run:{path_hash}");
    let base = format!("http://{}", listen_of(&started));
    let admin = format!("http://{}", admin_of(&started));
    let http = Client::new();
    // One held stream on a path: its hash is the key, at its limit.
    let stream = get(&http, format!("{base}/sse"), &[]).await;
    assert_eq!(stream.status(), StatusCode::OK);
    let key = format!("run:{}", short_hash("/sse"));
    let status: Value = get_json(&http, format!("{admin}/v1/keys/{key}")).await;
    assert_eq!(status["in_flight"], 1, "{status}");
    let refused = get(&http, format!("{base}/SSE"), &[])
        .await
        .text()
        .await
        .unwrap();
    assert!(
        refused.contains(&key) && refused.contains("too_many_requests"),
        "the canonical path (lower-cased) is hashed: {refused}"
    );
    // Another path is another key, and the secret in it goes into no key or metric.
    let other = get(&http, format!("{base}/echo/s3cr3t-code"), &[]).await;
    assert_eq!(other.status(), StatusCode::OK);
    let metrics = get_text(&http, format!("{admin}/metrics")).await;
    assert!(
        metrics.contains(&short_hash("/echo/s3cr3t-code")),
        "{metrics}"
    );
    assert!(!metrics.contains("s3cr3t") && !refused.contains("s3cr3t"));
    drop(stream);
}
