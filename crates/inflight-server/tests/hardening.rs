//! A hostile client against the server, on loopback: each test is a row of RELIABILITY.md.
#![allow(missing_docs)]

mod common;

use std::time::{Duration, Instant};

use common::{limits, start_api, Make, Memory};
use inflight_server::Settings;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// A client that sends its headers one byte at a time, slowly, is closed after `--header-timeout`; one
/// that sends them at once is answered.
#[tokio::test]
async fn a_slow_header_sender_is_closed_after_the_header_timeout() {
    let mut settings = limits(1, 0);
    settings.connections.header_timeout = Duration::from_millis(300);
    let server = start_api(&settings, Memory::stores(&None)).await;
    let address = server.url("").trim_start_matches("http://").to_owned();

    let mut prompt = tokio::net::TcpStream::connect(&address).await.unwrap();
    prompt
        .write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut answer = String::new();
    prompt.read_to_string(&mut answer).await.unwrap();
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");

    let mut slow = tokio::net::TcpStream::connect(&address).await.unwrap();
    let started = Instant::now();
    let request =
        b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Padding: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\r\n\r\n";
    let mut closed = false;
    for byte in request {
        if slow.write_all(&[*byte]).await.is_err() {
            closed = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        // Closed by the server: a read sees the end (or a reset).
        let mut buf = [0u8; 256];
        match tokio::time::timeout(Duration::from_millis(1), slow.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => {
                closed = true;
                break;
            }
            Ok(Ok(n)) => {
                let text = String::from_utf8_lossy(&buf[..n]).to_string();
                assert!(
                    !text.starts_with("HTTP/1.1 200"),
                    "answered a slow sender: {text}"
                );
            }
            Err(_) => {}
        }
    }
    assert!(closed, "the slow sender was never closed");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "closed only after {:?}",
        started.elapsed()
    );
}

#[tokio::test]
async fn a_header_timeout_out_of_range_is_refused() {
    use inflight_server::config::Layered;
    let flags = ["inflight", "--header-timeout", "1ms"];
    let err = Settings::from_flags(flags).unwrap_err();
    assert_eq!(err.setting, "header_timeout");
    let fine = Settings::from_flags(["inflight"]).unwrap();
    assert_eq!(
        fine.connections.header_timeout,
        Duration::from_secs(10),
        "the default"
    );
}

/// `--api-token` guards every /v1 route (the admin token passes too); limits need the admin token; the
/// health, readiness, metrics and OpenAPI routes stay open.
#[tokio::test]
async fn the_api_token_guards_the_permit_routes_and_the_admin_token_the_limits() {
    let settings = Settings {
        admin_token: Some("admin-s3cret".into()),
        api_token: Some("api-s3cret".into()),
        ..limits(5, 0)
    };
    let server = start_api(&settings, Memory::stores(&None)).await;
    let http = reqwest::Client::new();
    let acquire = server.url("/v1/keys/k/permits");
    let status = |auth: Option<&'static str>, request: reqwest::RequestBuilder| async move {
        let request = match auth {
            Some(token) => request.bearer_auth(token),
            None => request,
        };
        request.send().await.unwrap().status().as_u16()
    };
    assert_eq!(status(None, http.post(&acquire)).await, 401);
    assert_eq!(status(Some("guess"), http.post(&acquire)).await, 401);
    assert_eq!(status(Some("api-s3cret"), http.post(&acquire)).await, 201);
    assert_eq!(status(Some("admin-s3cret"), http.post(&acquire)).await, 201);
    let several = || {
        http.post(server.url("/v1/permits"))
            .json(&serde_json::json!({"keys": ["a"]}))
    };
    assert_eq!(status(None, several()).await, 401);
    assert_eq!(status(Some("api-s3cret"), several()).await, 201);
    assert_eq!(status(None, http.get(server.url("/v1/keys/k"))).await, 401);
    let limit = || {
        http.put(server.url("/v1/keys/k/limit"))
            .json(&serde_json::json!({"limit": 9}))
    };
    assert_eq!(
        status(Some("api-s3cret"), limit()).await,
        401,
        "the API token sets no limit"
    );
    assert_eq!(status(Some("admin-s3cret"), limit()).await, 200);
    for open in ["/healthz", "/readyz", "/metrics", "/openapi.json"] {
        assert_eq!(
            status(None, http.get(server.url(open))).await,
            200,
            "{open}"
        );
    }
}

/// `--admin-token-file`: the token comes from a file, so it is not in the process's command line.
#[tokio::test]
async fn the_admin_token_can_come_from_a_file_and_stays_out_of_the_command_line() {
    use common::process::{listen_of, Running};
    let dir = std::env::temp_dir().join(format!("inflight-token-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("admin-token");
    std::fs::write(&file, "from-a-file-7f3a\n").unwrap();
    let path = file.to_str().unwrap().to_owned();
    let (server, started) = Running::start(&[
        "serve",
        "--listen",
        "127.0.0.1:0",
        "--admin-token-file",
        &path,
    ]);
    let cmdline = std::fs::read(format!("/proc/{}/cmdline", server.id())).unwrap();
    assert!(!String::from_utf8_lossy(&cmdline).contains("from-a-file-7f3a"));
    assert!(!started.contains("from-a-file-7f3a"), "{started}");
    let base = format!("http://{}", listen_of(&started));
    let http = reqwest::Client::new();
    let limit = |token: &'static str| {
        http.put(format!("{base}/v1/keys/k/limit"))
            .bearer_auth(token)
            .json(&serde_json::json!({"limit": 3}))
            .send()
    };
    assert_eq!(limit("wrong").await.unwrap().status(), 401);
    assert_eq!(limit("from-a-file-7f3a").await.unwrap().status(), 200);
    let both = Settings {
        admin_token: Some("x".into()),
        admin_token_file: Some(file.clone()),
        ..limits(1, 0)
    };
    assert_eq!(both.admin_token().unwrap_err().setting, "admin_token_file");
    let _ = std::fs::remove_dir_all(&dir);
}

/// `--max-overrides`: past the bound a new override is `409 too_many_overrides`; changing or clearing an
/// existing one still works, and clearing one makes room. On both stores.
async fn overrides_are_bounded<M: Make>(stores: common::Stores<M::S>) {
    let server = start_api(&limits(1, 0), stores).await;
    let http = reqwest::Client::new();
    let set = |key: &'static str, limit: u32| {
        http.put(server.url(&format!("/v1/keys/{key}/limit")))
            .json(&serde_json::json!({ "limit": limit }))
            .send()
    };
    assert_eq!(set("a", 5).await.unwrap().status(), 200);
    assert_eq!(set("b", 5).await.unwrap().status(), 200);
    let refused = set("c", 5).await.unwrap();
    assert_eq!(refused.status(), 409);
    let body: serde_json::Value = refused.json().await.unwrap();
    assert_eq!(body["code"], "too_many_overrides");
    assert_eq!(
        set("a", 7).await.unwrap().status(),
        200,
        "an existing one changes"
    );
    assert_eq!(set("a", 0).await.unwrap().status(), 200, "and clears");
    assert_eq!(set("c", 5).await.unwrap().status(), 200, "which makes room");
}

#[tokio::test]
async fn overrides_are_bounded_on_memory() {
    let store = inflight::MemoryStore::new().max_overrides(2);
    overrides_are_bounded::<Memory>(std::sync::Arc::new(move || store.clone())).await;
}

#[tokio::test]
async fn overrides_are_bounded_on_redis() {
    let redis = common::TestRedis::start();
    let url = redis.url();
    let stores: common::Stores<inflight::RedisStore> = std::sync::Arc::new(move || {
        inflight::RedisStore::builder(url.clone())
            .max_overrides(2)
            .open()
            .expect("a store")
    });
    overrides_are_bounded::<common::Redis>(stores).await;
}

/// The proxy serves its API on its own listener: a proxied client cannot reach it, so it cannot fill a
/// victim's key with day-long permits or change limits; `--admin-on-proxy-port` puts it back, with a
/// warning.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_proxys_api_is_not_on_the_proxied_port() {
    use common::process::{admin_of, listen_of, Running};
    let upstream = common::Upstream::start().await;
    let (mut server, started) = Running::start(&common::process::proxy_args(
        &upstream.base,
        &["--default-limit", "8"],
    ));
    let (base, admin) = (
        format!("http://{}", listen_of(&started)),
        admin_of(&started),
    );
    let admin = format!("http://{admin}");
    assert_ne!(base, admin);
    let http = reqwest::Client::new();
    let fill = http
        .post(format!("{base}/_inflight/v1/keys/victim/permits"))
        .json(&serde_json::json!({"lease_ms": 86_400_000}))
        .send()
        .await
        .unwrap();
    assert_eq!(fill.status(), 404);
    let body: serde_json::Value = fill.json().await.unwrap();
    assert_eq!(body["code"], "not_found");
    let limit = http
        .put(format!("{base}/_inflight/v1/keys/victim/limit"))
        .json(&serde_json::json!({"limit": 1}))
        .send()
        .await
        .unwrap();
    assert_eq!(limit.status(), 404);
    let victim: serde_json::Value = http
        .get(format!("{admin}/v1/keys/victim"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(
        (victim["limit"].as_u64(), victim["in_flight"].as_u64()),
        (Some(8), Some(0))
    );
    for open in ["/healthz", "/metrics"] {
        let status = http
            .get(format!("{admin}{open}"))
            .send()
            .await
            .unwrap()
            .status();
        assert_eq!(status, 200, "{open} on the admin listener");
    }
    server.signal("-TERM");
    let exit = tokio::task::spawn_blocking(move || {
        let exit = server.wait_for(Duration::from_secs(10));
        (exit, server.rest_of_log())
    });
    assert!(exit.await.unwrap().0.success());

    let (mut exposed, started) = Running::start(&[
        "proxy",
        "--listen",
        "127.0.0.1:0",
        "--upstream",
        &upstream.base,
        "--admin-on-proxy-port",
    ]);
    assert!(!started.contains("admin="), "{started}");
    let base = format!("http://{}", listen_of(&started));
    let status = http
        .get(format!("{base}/_inflight/healthz"))
        .send()
        .await
        .unwrap()
        .status();
    assert_eq!(
        status, 200,
        "the API under /_inflight on the proxied port, when asked for"
    );
    exposed.signal("-TERM");
    let log = tokio::task::spawn_blocking(move || {
        exposed.wait_for(Duration::from_secs(10));
        exposed.rest_of_log().join("\n")
    });
    let log = log.await.unwrap();
    assert!(
        log.contains("--admin-on-proxy-port"),
        "warned at start: {log}"
    );
}

/// A client's claims about its address (X-Forwarded-For, X-Real-IP, Forwarded) do not reach the upstream
/// unless `--trust-forwarded`: it sees the address the proxy saw.
#[tokio::test]
async fn a_clients_forwarding_headers_are_replaced_unless_trusted() {
    let upstream = common::Upstream::start().await;
    for trust in [false, true] {
        let mut settings = common::proxy_settings(&upstream.base, limits(5, 0));
        settings.trust_forwarded = trust;
        let server = common::start_proxy(&settings, Memory::stores(&None)).await;
        let echo: serde_json::Value = reqwest::Client::new()
            .get(server.url("/echo/x"))
            .header("x-inflight-key", "k")
            .header("x-forwarded-for", "203.0.113.9")
            .header("x-real-ip", "203.0.113.9")
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        let headers = &echo["headers"];
        if trust {
            assert_eq!(headers["x-forwarded-for"], "203.0.113.9, 127.0.0.1");
            assert_eq!(headers["x-real-ip"], "203.0.113.9");
        } else {
            assert_eq!(headers["x-forwarded-for"], "127.0.0.1", "{headers}");
            assert!(headers.get("x-real-ip").is_none(), "{headers}");
        }
    }
}

/// `--overrides-for-classes-only`: an override of a key that matches no `--limit` class is `409
/// override_not_allowed`; a key of a class takes one; clearing is always allowed.
#[tokio::test]
async fn overrides_of_keys_outside_every_class_can_be_refused() {
    use inflight_server::config::LimitRule;
    let mut settings = limits(1, 0);
    settings.limits = vec![LimitRule::parse("tenant:*=5").unwrap()];
    settings.overrides_for_classes_only = true;
    let server = start_api(&settings, Memory::stores(&None)).await;
    let http = reqwest::Client::new();
    let set = |key: &'static str, limit: u32| {
        http.put(server.url(&format!("/v1/keys/{key}/limit")))
            .json(&serde_json::json!({ "limit": limit }))
            .send()
    };
    let refused = set("victim", 50).await.unwrap();
    assert_eq!(refused.status(), 409);
    let body: serde_json::Value = refused.json().await.unwrap();
    assert_eq!(body["code"], "override_not_allowed", "{body}");
    assert_eq!(set("tenant:t1", 9).await.unwrap().status(), 200);
    assert_eq!(set("victim", 0).await.unwrap().status(), 200, "clearing");
    let cleared = http.delete(server.url("/v1/keys/victim/limit")).send();
    assert_eq!(cleared.await.unwrap().status(), 200);
    let victim: serde_json::Value = common::get_json(&http, server.url("/v1/keys/victim")).await;
    assert_eq!(victim["limit"], 1, "the default, no override: {victim}");
    let flags = ["inflight", "--overrides-for-classes-only"];
    let parsed = <Settings as inflight_server::config::Layered>::from_flags(flags).unwrap();
    assert!(parsed.overrides_for_classes_only);
}
