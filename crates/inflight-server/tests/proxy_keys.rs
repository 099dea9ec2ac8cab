//! The proxy's keys formed from each request (`--key`), `--on-missing-key` and `--limit-path`, against a
//! real upstream and a real client.
#![allow(missing_docs)]

mod common;

use std::io::{Read, Write};

use common::process::{admin_of, listen_of, Running};
use common::{
    get_json, get_text, limits, metric, proxy_settings, start_proxy, wait_in_flight, Make,
    TestRedis, Upstream,
};
use inflight_server::{ProxySettings, Settings};
use reqwest::{Client, StatusCode};
use serde_json::Value;

/// A store, an upstream and a proxy in front of it, its settings changed by `change`.
async fn proxied<M: Make>(
    serve: Settings,
    change: impl FnOnce(&mut ProxySettings),
) -> (Option<TestRedis>, Upstream, common::Server<M::S>) {
    let redis = M::redis();
    let upstream = Upstream::start().await;
    let mut settings = proxy_settings(&upstream.base, serve);
    change(&mut settings);
    let server = start_proxy(&settings, M::stores(&redis)).await;
    (redis, upstream, server)
}

fn templates(settings: &mut ProxySettings, keys: &[&str]) {
    settings.key = keys.iter().map(|key| (*key).to_owned()).collect();
}

/// `GET url` with these headers (a name given twice is sent twice).
async fn get(http: &Client, url: String, headers: &[(&str, &str)]) -> reqwest::Response {
    let mut request = http.get(url);
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    request.send().await.unwrap()
}

async fn code_of(response: reqwest::Response) -> (StatusCode, Value) {
    let status = response.status();
    (status, response.json::<Value>().await.unwrap_or_default())
}

/// The status of `GET target` sent as written (clients such as reqwest would resolve `.` and `..`).
fn raw_status(base: &str, target: &str, key: &str) -> u16 {
    let mut tcp = std::net::TcpStream::connect(base.trim_start_matches("http://")).unwrap();
    let request = format!(
        "GET {target} HTTP/1.1\r\nHost: x\r\nX-Inflight-Key: {key}\r\nConnection: close\r\n\r\n"
    );
    tcp.write_all(request.as_bytes()).unwrap();
    let mut answer = String::new();
    tcp.read_to_string(&mut answer).unwrap();
    answer
        .split(' ')
        .nth(1)
        .and_then(|status| status.parse().ok())
        .unwrap_or_else(|| panic!("no status in {answer:?}"))
}

async fn a_full_tenant_refuses_every_app_of_it_at_once<M: Make>() {
    let (_redis, upstream, server) = proxied::<M>(limits(10, 0), |s| {
        templates(
            s,
            &[
                "tenant:{header:X-Tenant-Id}",
                "app:{header:X-App-Id}",
                "global",
            ],
        );
    })
    .await;
    let http = Client::new();
    let api = server.url("/_inflight");
    let set = http
        .put(server.url("/_inflight/v1/keys/tenant:acme/limit"))
        .json(&serde_json::json!({"limit": 2}))
        .send()
        .await
        .unwrap();
    assert_eq!(set.status(), StatusCode::OK);
    let acme = |app: &'static str| [("x-tenant-id", "acme"), ("x-app-id", app)];
    let a = get(&http, server.url("/sse"), &acme("a")).await;
    let b = get(&http, server.url("/sse"), &acme("b")).await;
    assert_eq!((a.status(), b.status()), (StatusCode::OK, StatusCode::OK));
    for key in ["tenant:acme", "app:a", "app:b"] {
        wait_in_flight(&api, key, 1 + u64::from(key == "tenant:acme")).await;
    }
    wait_in_flight(&api, "global", 2).await;
    let hits = upstream.hits();
    for app in ["a", "c"] {
        let refused = get(&http, server.url("/echo/x"), &acme(app)).await;
        assert!(refused.headers().contains_key("retry-after"));
        let (status, body) = code_of(refused).await;
        assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "app {app}: {body}");
        assert_eq!(body["code"], "too_many_requests");
        assert_eq!(body["key"], "tenant:acme", "the 429 names the refusing key");
        assert_eq!(body["status"], 429);
        assert!(body["message"].as_str().is_some());
    }
    assert_eq!(upstream.hits(), hits, "nothing was forwarded");
    // Nothing taken by the refusals: all or none.
    wait_in_flight(&api, "app:c", 0).await;
    wait_in_flight(&api, "app:a", 1).await;
    wait_in_flight(&api, "global", 2).await;
    // Another tenant's same app is admitted, under its own tenant key.
    let other = get(
        &http,
        server.url("/echo/x"),
        &[("x-tenant-id", "globex"), ("x-app-id", "a")],
    )
    .await;
    assert_eq!(other.status(), StatusCode::OK);
    drop((a, b));
    wait_in_flight(&api, "tenant:acme", 0).await;
    wait_in_flight(&api, "app:a", 0).await;
    wait_in_flight(&api, "global", 0).await;
}

async fn missing_keys_are_rejected_or_passed_and_duplicates_always_refused<M: Make>() {
    let tenant = ["tenant:{header:X-Tenant-Id}"];
    let (_redis, upstream, server) = proxied::<M>(limits(1, 0), |s| templates(s, &tenant)).await;
    let http = Client::new();
    for headers in [&[][..], &[("x-tenant-id", "")][..]] {
        let (status, body) = code_of(get(&http, server.url("/echo/x"), headers).await).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{headers:?}");
        assert_eq!(body["code"], "missing_key", "{headers:?}");
        assert!(body.get("key").is_none(), "{body}");
    }
    let twice = [("x-tenant-id", "acme"), ("X-Tenant-Id", "evil")];
    let (status, body) = code_of(get(&http, server.url("/echo/x"), &twice).await).await;
    assert_eq!(
        (status, body["code"].as_str()),
        (StatusCode::BAD_REQUEST, Some("invalid_key"))
    );
    assert_eq!(upstream.hits(), 0, "nothing was forwarded");

    let (_redis, upstream, server) = proxied::<M>(limits(1, 0), |s| {
        templates(s, &tenant);
        s.on_missing_key = "pass".to_owned();
    })
    .await;
    let metrics = server.url("/_inflight/metrics");
    // Unkeyed requests go through without a limit, and are not in flight.
    let mut streams = Vec::new();
    for _ in 0..2 {
        let stream = get(&http, server.url("/sse"), &[]).await;
        assert_eq!(stream.status(), StatusCode::OK);
        streams.push(stream);
    }
    let empty = get(&http, server.url("/echo/x"), &[("x-tenant-id", "")]).await;
    assert_eq!(empty.status(), StatusCode::OK);
    assert_eq!(metric(&http, &metrics, "inflight_in_flight").await, 0.0);
    // Keyed requests are still limited.
    let keyed = get(&http, server.url("/sse"), &[("x-tenant-id", "acme")]).await;
    assert_eq!(keyed.status(), StatusCode::OK);
    assert_eq!(metric(&http, &metrics, "inflight_in_flight").await, 1.0);
    let full = get(&http, server.url("/echo/x"), &[("x-tenant-id", "acme")]).await;
    assert_eq!(full.status(), StatusCode::TOO_MANY_REQUESTS);
    // A duplicated header does not pass: the upstream may read either value as the tenant.
    let hits = upstream.hits();
    let (status, body) = code_of(get(&http, server.url("/echo/x"), &twice).await).await;
    assert_eq!(
        (status, body["code"].as_str()),
        (StatusCode::BAD_REQUEST, Some("invalid_key"))
    );
    assert_eq!(upstream.hits(), hits);
    drop((streams, keyed));
}

/// `--key-header` with no `--key` is one key from that header, refused when duplicated; with `--key`, one more.
async fn the_key_header_alone_is_one_key_and_a_duplicate_is_refused<M: Make>() {
    let (_redis, upstream, server) = proxied::<M>(limits(1, 0), |s| {
        s.key_header = Some("X-App".to_owned());
    })
    .await;
    let http = Client::new();
    let stream = get(&http, server.url("/sse"), &[("x-app", "one")]).await;
    assert_eq!(stream.status(), StatusCode::OK);
    wait_in_flight(&server.url("/_inflight"), "one", 1).await;
    let (status, body) =
        code_of(get(&http, server.url("/echo/x"), &[("x-app", "one")]).await).await;
    assert_eq!(
        (status, &body["key"]),
        (StatusCode::TOO_MANY_REQUESTS, &"one".into())
    );
    let twice = [("x-app", "two"), ("x-app", "three")];
    let (status, body) = code_of(get(&http, server.url("/echo/x"), &twice).await).await;
    assert_eq!(
        (status, &body["code"]),
        (StatusCode::BAD_REQUEST, &"invalid_key".into())
    );
    let (status, body) = code_of(get(&http, server.url("/echo/x"), &[]).await).await;
    assert_eq!(
        (status, &body["code"]),
        (StatusCode::BAD_REQUEST, &"missing_key".into())
    );
    assert_eq!(upstream.hits(), 1);
    drop(stream);

    // With --key too, the header's key comes first and the templates' follow.
    let (_redis, _upstream, server) = proxied::<M>(limits(1, 0), |s| {
        s.key_header = Some("X-App".to_owned());
        templates(s, &["global"]);
    })
    .await;
    let stream = get(&http, server.url("/sse"), &[("x-app", "one")]).await;
    assert_eq!(stream.status(), StatusCode::OK);
    let (status, body) =
        code_of(get(&http, server.url("/echo/x"), &[("x-app", "two")]).await).await;
    assert_eq!(
        (status, &body["key"]),
        (StatusCode::TOO_MANY_REQUESTS, &"global".into())
    );
    let (status, body) = code_of(get(&http, server.url("/echo/x"), &[]).await).await;
    assert_eq!(
        (status, &body["code"]),
        (StatusCode::BAD_REQUEST, &"missing_key".into())
    );
    drop(stream);
}

async fn only_the_limited_paths_are_limited_however_they_are_spelt<M: Make>() {
    let (_redis, upstream, server) = proxied::<M>(limits(1, 0), |s| {
        s.limit_path = vec!["/sse".to_owned(), "/echo/Limited".to_owned()];
    })
    .await;
    let http = Client::new();
    let key = [("x-inflight-key", "k")];
    let stream = get(&http, server.url("/sse"), &key).await;
    assert_eq!(stream.status(), StatusCode::OK);
    wait_in_flight(&server.url("/_inflight"), "k", 1).await;
    // Outside the prefixes: forwarded without a limit, and without a key.
    for path in ["/echo/x", "/echo/limitedx", "/echo"] {
        let response = get(&http, server.url(path), &key).await;
        assert_ne!(response.status(), StatusCode::TOO_MANY_REQUESTS, "{path}");
        let unkeyed = get(&http, server.url(path), &[]).await;
        assert_ne!(unkeyed.status(), StatusCode::BAD_REQUEST, "{path}");
    }
    let hits = upstream.hits();
    let free = get(&http, server.url("/ssex"), &key).await;
    assert_eq!(free.text().await.unwrap(), "no such route upstream");
    assert_eq!(upstream.hits(), hits + 1, "/ssex is not /sse");
    let hits = upstream.hits();
    let base = server.base.clone();
    let statuses = tokio::task::spawn_blocking(move || {
        let limited = [
            "/sse",
            "//sse",
            "/SSE",
            "/%73se",
            "/sse/",
            "/sse;x=1",
            "/%5Csse",
            "/echo/limited",
            "/echo/limited/abc/stop",
            "/echo//LIMITED/abc",
            "/echo%2Flimited",
        ];
        let dotted = [
            "/./sse",
            "/x/../sse",
            "/%2e/sse",
            "/x/%2E%2E/sse",
            "/echo/a/..;/limited",
        ];
        // Full (429) however the limited path is written; refused (400) with a dot segment.
        let limited = limited.map(|target| (target, 429));
        let dotted = dotted.map(|target| (target, 400));
        let raw: Vec<(&str, u16, u16)> = limited
            .iter()
            .chain(&dotted)
            .map(|&(target, want)| (target, want, raw_status(&base, target, "k")))
            .collect();
        raw
    })
    .await
    .unwrap();
    for (target, want, status) in statuses {
        assert_eq!(status, want, "{target}");
    }
    assert_eq!(upstream.hits(), hits, "no spelling got through");
    // A missing key on a limited path is still the default's 400.
    let unkeyed = get(&http, server.url("/echo/limited"), &[]).await;
    assert_eq!(code_of(unkeyed).await.1["code"], "missing_key");
    drop(stream);
    wait_in_flight(&server.url("/_inflight"), "k", 0).await;
}

/// `{path}`: the canonical path, so that no spelling of it makes a key of its own.
async fn the_path_key_is_the_canonical_path<M: Make>() {
    let (_redis, _upstream, server) = proxied::<M>(limits(1, 0), |s| {
        templates(s, &["route:{path}"]);
    })
    .await;
    let http = Client::new();
    let stream = get(&http, server.url("/sse"), &[]).await;
    assert_eq!(stream.status(), StatusCode::OK);
    wait_in_flight(&server.url("/_inflight"), "route:%2Fsse", 1).await;
    let base = server.base.clone();
    let statuses = tokio::task::spawn_blocking(move || {
        ["//sse", "/SSE/", "/x/../sse", "/echo/x"].map(|target| raw_status(&base, target, "-"))
    })
    .await
    .unwrap();
    assert_eq!(statuses, [429, 429, 400, 200]);
    drop(stream);
}

/// The bearer token is hashed into the key and appears in no key, answer, metric or log line.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_bearer_hash_is_the_key_and_the_token_is_nowhere() {
    const TOKEN: &str = "app-s3cr3t-T0KEN-4711";
    let digest = ring::digest::digest(&ring::digest::SHA256, TOKEN.as_bytes());
    let hash: String = digest.as_ref()[..8]
        .iter()
        .map(|byte| format!("{byte:02x}"))
        .collect();
    let key = format!("user:{hash}");
    let upstream = Upstream::start().await;
    let (mut server, started) = Running::start_with_env(
        &[
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
            "user:{bearer_hash}",
            "--admin-listen",
            "127.0.0.1:0",
        ],
        &[("INFLIGHT_LOG", "trace")],
    );
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

per_store!(
    a_full_tenant_refuses_every_app_of_it_at_once,
    missing_keys_are_rejected_or_passed_and_duplicates_always_refused,
    the_key_header_alone_is_one_key_and_a_duplicate_is_refused,
    only_the_limited_paths_are_limited_however_they_are_spelt,
    the_path_key_is_the_canonical_path,
);
