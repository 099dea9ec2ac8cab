//! `/status` and `/status/events` over HTTP: held keys, refusals per minute, bounded watchers, the
//! admin token, and the proxy's admin listener.

use std::time::{Duration, Instant};

use futures_util::StreamExt;
use inflight_server::config::Layered;
use inflight_server::Settings;
use reqwest::{Client, StatusCode};
use serde_json::{json, Value};

use crate::common;
use crate::common::{limits, start_api, Make, Memory};
use crate::{acquire, next_event, release, Served};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_page_is_self_contained_and_its_events_show_held_keys() {
    let redis = Memory::redis();
    let server = start_api(&limits(4, 0), Memory::stores(&redis)).await;
    let http = Client::new();
    let page = http.get(server.url("/status")).send().await.unwrap();
    assert_eq!(page.status(), StatusCode::OK);
    assert_eq!(page.headers()["content-type"], "text/html; charset=utf-8");
    assert_eq!(page.headers()["cache-control"], "no-store");
    assert!(page.headers()["content-security-policy"]
        .to_str()
        .unwrap()
        .contains("default-src 'none'"));
    let html = page.text().await.unwrap();
    assert!(html.contains("status/events") && html.contains("<style>"));
    // Nothing from elsewhere: no external script, style, font or image.
    for outside in ["http://", "https://", "src=", "@import", "url("] {
        assert!(!html.contains(outside), "the page refers to {outside}");
    }

    let permit = acquire(&http, &server.base, "app:held", 2).await;
    let events = http.get(server.url("/status/events")).send().await.unwrap();
    assert_eq!(events.status(), StatusCode::OK);
    assert_eq!(events.headers()["content-type"], "text/event-stream");
    let (mut stream, mut buffer) = (events.bytes_stream(), String::new());
    let first = next_event(&mut stream, &mut buffer).await;
    assert_eq!(
        first["keys"],
        json!([{"key": "app:held", "limit": 4, "in_flight": 2}])
    );
    assert_eq!(first["store"]["ok"], true);
    assert_eq!(first["store"]["listing"], true);
    assert!(first["store"]["latency_ms"].as_f64().unwrap() >= 0.0);
    assert!(first["per_minute"]["admitted"].as_u64().is_some());
    release(&http, &server.base, "app:held", &permit).await;
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let event = next_event(&mut stream, &mut buffer).await;
        if event["keys"] == json!([]) {
            break;
        }
        assert!(Instant::now() < deadline, "still shown: {event}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refusals_are_counted_per_minute() {
    let served = Served::start(limits(1, 0)).await;
    let http = Client::new();
    let _held = acquire(&http, &served.base, "k", 1).await;
    for _ in 0..3 {
        let refused = http
            .post(served.url("/v1/keys/k/permits"))
            .send()
            .await
            .unwrap();
        assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
    }
    let events = http.get(served.url("/status/events")).send().await.unwrap();
    let (mut stream, mut buffer) = (events.bytes_stream(), String::new());
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let event = next_event(&mut stream, &mut buffer).await;
        // (The counts of a second land in the ring at the next tick.)
        if event["per_minute"]["refused"] == 3 {
            assert_eq!(event["per_minute"]["admitted"], 1);
            break;
        }
        assert!(Instant::now() < deadline, "refusals not counted: {event}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admissions_past_a_shadow_limit_are_counted_per_minute() {
    let flags = ["inflight", "--limit", "k=1,shadow"];
    let served = Served::start(Settings::from_flags(flags).unwrap()).await;
    let http = Client::new();
    let mut held = Vec::new();
    for _ in 0..3 {
        held.push(acquire(&http, &served.base, "k", 1).await);
    }
    let events = http.get(served.url("/status/events")).send().await.unwrap();
    let (mut stream, mut buffer) = (events.bytes_stream(), String::new());
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let event = next_event(&mut stream, &mut buffer).await;
        if event["per_minute"]["shadowed"] == 2 {
            assert_eq!(event["per_minute"]["refused"], 0);
            break;
        }
        assert!(
            Instant::now() < deadline,
            "shadow refusals not shown: {event}"
        );
    }
}

/// A key's waiters are shown by priority level and flow (one worker: a page shows its worker's own).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_events_show_waiters_by_priority_and_flow() {
    let redis = Memory::redis();
    let settings = Settings {
        workers: Some(1),
        ..limits(1, 0)
    };
    let server = start_api(&settings, Memory::stores(&redis)).await;
    let http = Client::new();
    let permit = acquire(&http, &server.base, "app:busy", 1).await;
    let url = server.url("/v1/keys/app:busy/permits");
    let body = json!({"wait_ms": 30_000, "priority": 7, "flow": "acme"});
    let waiter = tokio::spawn(http.post(url).json(&body).send());
    let events = http.get(server.url("/status/events")).send().await.unwrap();
    let (mut stream, mut buffer) = (events.bytes_stream(), String::new());
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let event = next_event(&mut stream, &mut buffer).await;
        if event["keys"][0]["queued"].is_array() {
            assert_eq!(event["keys"][0]["waiters"], 1);
            assert_eq!(
                event["keys"][0]["queued"],
                json!([{"priority": 7, "flow": "acme", "waiters": 1}])
            );
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the waiter is never shown: {event}"
        );
    }
    release(&http, &server.base, "app:busy", &permit).await;
    let admitted = waiter.await.unwrap().unwrap();
    assert_eq!(admitted.status(), StatusCode::CREATED);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watchers_are_bounded_and_their_streams_end_at_shutdown() {
    let mut settings = limits(1, 0);
    settings.shutdown_grace = Duration::from_secs(30);
    let served = Served::start(settings).await;
    let http = Client::new();
    let mut streams = Vec::new();
    for _ in 0..inflight_server::status::MAX_CLIENTS {
        let events = http.get(served.url("/status/events")).send().await.unwrap();
        assert_eq!(events.status(), StatusCode::OK);
        streams.push(events);
    }
    assert_eq!(
        served.board().clients(),
        inflight_server::status::MAX_CLIENTS
    );
    let refused = http.get(served.url("/status/events")).send().await.unwrap();
    assert_eq!(refused.status(), StatusCode::SERVICE_UNAVAILABLE);
    let body: Value = refused.json().await.unwrap();
    assert_eq!(body["code"], "too_many_status_clients");
    assert_eq!(body["status"], 503);
    // One goes away: its place is free again.
    drop(streams.pop());
    let started = Instant::now();
    let again = loop {
        let events = http.get(served.url("/status/events")).send().await.unwrap();
        if events.status() == StatusCode::OK {
            break events;
        }
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "the place stayed taken"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let mut stream = again.bytes_stream();
    let started = Instant::now();
    // Every stream ends when shutdown begins, not when the grace period (30 s) is over.
    served.shutdown().await.expect("no stream was cut");
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "{:?}",
        started.elapsed()
    );
    while let Some(chunk) = tokio::time::timeout(Duration::from_secs(5), stream.next())
        .await
        .expect("the stream ended")
    {
        if chunk.is_err() {
            break;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_an_admin_token_the_page_and_its_events_need_it() {
    let settings = Settings {
        admin_token: Some("adm-s3cret".into()),
        api_token: Some("api-s3cret".into()),
        ..limits(1, 0)
    };
    let served = Served::start(settings).await;
    let http = Client::new();
    for path in ["/status", "/status/events"] {
        for refused in [
            http.get(served.url(path)),
            http.get(served.url(&format!("{path}?token=wrong"))),
            http.get(served.url(&format!("{path}?token=api-s3cret"))),
            http.get(served.url(path)).bearer_auth("api-s3cret"),
        ] {
            let response = refused.send().await.unwrap();
            assert_eq!(response.status(), StatusCode::UNAUTHORIZED, "{path}");
            assert_eq!(response.headers()["cache-control"], "no-store");
            let body: Value = response.json().await.unwrap();
            assert_eq!(body["code"], "unauthorized");
        }
        for allowed in [
            http.get(served.url(&format!("{path}?token=adm-s3cret"))),
            http.get(served.url(&format!("{path}?events=1&token=adm%2Ds3cret"))),
            http.get(served.url(path)).bearer_auth("adm-s3cret"),
        ] {
            let response = allowed.send().await.unwrap();
            assert_eq!(response.status(), StatusCode::OK, "{path}");
            assert_eq!(response.headers()["referrer-policy"], "no-referrer");
        }
    }
    served.shutdown().await.unwrap();
}

/// `inflight proxy`: the page is on the admin listener, not on the proxied port.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_proxy_serves_the_page_on_its_admin_listener_only() {
    use common::process::{admin_of, listen_of, Running};
    let upstream = common::Upstream::start().await;
    let (_server, started) = Running::start(&common::process::proxy_args(
        &upstream.base,
        &["--default-limit", "8"],
    ));
    let (base, admin) = (
        format!("http://{}", listen_of(&started)),
        format!("http://{}", admin_of(&started)),
    );
    let http = Client::new();
    let page = http.get(format!("{admin}/status")).send().await.unwrap();
    assert_eq!(page.status(), StatusCode::OK);
    assert!(page.text().await.unwrap().contains("status/events"));
    let events = http
        .get(format!("{admin}/status/events"))
        .send()
        .await
        .unwrap();
    assert_eq!(events.headers()["content-type"], "text/event-stream");
    let (mut stream, mut buffer) = (events.bytes_stream(), String::new());
    let event = next_event(&mut stream, &mut buffer).await;
    assert_eq!(event["store"]["ok"], true);
    // On the proxied port /status is a path like any other (here refused: it has no key).
    let proxied = http.get(format!("{base}/status")).send().await.unwrap();
    let (status, body) = (proxied.status(), proxied.text().await.unwrap());
    assert!(
        !body.contains("status/events"),
        "the page on the proxied port"
    );
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert!(body.contains("missing_key"), "{body}");
}
