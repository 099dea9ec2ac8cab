//! The proxy's charges (`--quota-key`) against a real upstream and a real client, on the memory and the
//! Redis store: committed when the upstream answered below 500 and the body was sent to its end,
//! refunded otherwise.
#![allow(missing_docs)]

mod common;

use std::convert::Infallible;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::{Body, Bytes};
use axum::routing::get;
use axum::Router;
use common::{get_json, limits, proxy_settings, start_proxy, Make, Refusing};
use http::StatusCode;
use inflight_server::config::QuotaCommit;
use inflight_server::{ProxySettings, Settings};
use reqwest::Client;
use serde_json::{json, Value};
use tokio::sync::Semaphore;

/// An upstream: `/ok`, `/fail` (500), `/empty` (204), `/sse` (an event, then one more per gate permit,
/// three in all) and `/forever` (an event every 20 ms). Counts the requests it sees.
async fn upstream() -> (String, Arc<Semaphore>, Arc<AtomicUsize>) {
    let (gate, hits) = (Arc::new(Semaphore::new(0)), Arc::new(AtomicUsize::new(0)));
    let g = gate.clone();
    let events = move || {
        let gate = g.clone();
        let events = futures_util::stream::unfold(0u32, move |n| {
            let gate = gate.clone();
            async move {
                if n == 3 {
                    return None;
                }
                if n > 0 {
                    gate.acquire().await.expect("gate").forget();
                }
                Some((
                    Ok::<_, Infallible>(Bytes::from(format!("data: {n}\n\n"))),
                    n + 1,
                ))
            }
        });
        async move { Body::from_stream(events) }
    };
    let forever = || async {
        let ticks = futures_util::stream::unfold((), |()| async {
            tokio::time::sleep(Duration::from_millis(20)).await;
            Some((
                Ok::<_, Infallible>(Bytes::from_static(b"data: tick\n\n")),
                (),
            ))
        });
        Body::from_stream(ticks)
    };
    let counted = hits.clone();
    let app = Router::new()
        .route("/ok", get(|| async { "answered" }))
        .route(
            "/fail",
            get(|| async { (StatusCode::INTERNAL_SERVER_ERROR, "upstream failed") }),
        )
        .route("/empty", get(|| async { StatusCode::NO_CONTENT }))
        .route("/sse", get(events))
        .route("/forever", get(forever))
        .layer(axum::middleware::from_fn(
            move |request, next: axum::middleware::Next| {
                counted.fetch_add(1, Ordering::SeqCst);
                async move { next.run(request).await }
            },
        ));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (base, gate, hits)
}

/// A proxy charging `tenant:{header:X-Tenant}` for each request, limited by `app:{header:X-App}`.
fn charging(upstream: &str, serve: Settings) -> ProxySettings {
    let mut settings = proxy_settings(upstream, serve);
    settings.key = vec!["app:{header:X-App}".into()];
    settings.quota_key = Some("tenant:{header:X-Tenant}".into());
    settings
}

fn from_t1(http: &Client, url: String) -> reqwest::RequestBuilder {
    http.get(url).header("x-app", "a1").header("x-tenant", "t1")
}

/// Waits (at most 2 s) until `tenant:t1` has `want` (balance, reserved): a settlement the proxy did in
/// the background, once the response ended, has landed.
async fn settles_to(http: &Client, api: &str, want: (u64, u64)) {
    let started = Instant::now();
    loop {
        let body = get_json(http, format!("{api}/v1/quotas/tenant:t1")).await;
        let now = (
            body["balance"].as_u64().unwrap(),
            body["reserved"].as_u64().unwrap(),
        );
        if now == want {
            return;
        }
        assert!(
            started.elapsed() < Duration::from_secs(2),
            "tenant:t1 stayed at {now:?}, not {want:?}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

async fn fund(http: &Client, api: &str, balance: u64) {
    let url = format!("{api}/v1/quotas/tenant:t1");
    let response = http
        .put(url)
        .json(&json!({ "balance": balance }))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
}

async fn a_charge_is_committed_only_when_the_answer_reached_its_end<M: Make>() {
    let redis = M::redis();
    let (base, gate, hits) = upstream().await;
    let server = start_proxy(&charging(&base, limits(1, 0)), M::stores(&redis)).await;
    let (http, api) = (Client::new(), server.url("/_inflight"));
    fund(&http, &api, 10).await;

    let answer = from_t1(&http, server.url("/ok")).send().await.unwrap();
    assert_eq!(answer.status(), StatusCode::OK);
    assert_eq!(answer.text().await.unwrap(), "answered");
    settles_to(&http, &api, (9, 0)).await;
    let empty = from_t1(&http, server.url("/empty")).send().await.unwrap();
    assert_eq!(empty.status(), StatusCode::NO_CONTENT);
    settles_to(&http, &api, (8, 0)).await;
    // An upstream error is not charged.
    let failed = from_t1(&http, server.url("/fail")).send().await.unwrap();
    assert_eq!(failed.status(), StatusCode::INTERNAL_SERVER_ERROR);
    drop(failed.text().await);
    settles_to(&http, &api, (8, 0)).await;

    // A stream read to its end is charged; while it runs, the charge is reserved.
    let mut stream = from_t1(&http, server.url("/sse")).send().await.unwrap();
    assert_eq!(stream.chunk().await.unwrap().unwrap(), "data: 0\n\n");
    settles_to(&http, &api, (7, 1)).await;
    // The app is full: refused, and the refusal's charge is back before the answer.
    let refused = from_t1(&http, server.url("/ok")).send().await.unwrap();
    assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(
        refused.json::<Value>().await.unwrap()["code"],
        "too_many_requests"
    );
    settles_to(&http, &api, (7, 1)).await;
    gate.add_permits(2);
    while stream.chunk().await.unwrap().is_some() {}
    settles_to(&http, &api, (7, 0)).await;

    // A client that leaves mid-stream is not charged.
    let mut stream = from_t1(&http, server.url("/forever")).send().await.unwrap();
    assert!(stream.chunk().await.unwrap().is_some());
    settles_to(&http, &api, (6, 1)).await;
    drop(stream);
    settles_to(&http, &api, (7, 0)).await;

    // Spent: refused as such, and nothing is forwarded.
    fund(&http, &api, 0).await;
    let seen = hits.load(Ordering::SeqCst);
    let exhausted = from_t1(&http, server.url("/ok")).send().await.unwrap();
    assert_eq!(exhausted.status(), StatusCode::TOO_MANY_REQUESTS);
    let body: Value = exhausted.json().await.unwrap();
    assert_eq!(
        (body["code"].as_str(), body["key"].as_str()),
        (Some("quota_exhausted"), Some("tenant:t1"))
    );
    assert_eq!(hits.load(Ordering::SeqCst), seen, "nothing was forwarded");
    assert_eq!(
        server.in_flight("app:a1").await,
        0,
        "no admission was tried"
    );

    // A tenant without a balance is not charged; one without the header is refused like a missing key.
    let free = http
        .get(server.url("/ok"))
        .header("x-app", "a1")
        .header("x-tenant", "free");
    assert_eq!(free.send().await.unwrap().status(), StatusCode::OK);
    let unmetered = get_json(&http, format!("{api}/v1/quotas/tenant:free")).await;
    assert_eq!(unmetered["balance"], Value::Null);
    let missing = http
        .get(server.url("/ok"))
        .header("x-app", "a1")
        .send()
        .await
        .unwrap();
    assert_eq!(missing.status(), StatusCode::BAD_REQUEST);
    assert_eq!(
        missing.json::<Value>().await.unwrap()["code"],
        "missing_key"
    );
}

async fn an_unreachable_upstream_is_not_charged<M: Make>() {
    let redis = M::redis();
    // Nothing listens on this port (and no other test is given it while this one runs).
    let refusing = Refusing::new();
    let base = refusing.base.clone();
    let server = start_proxy(&charging(&base, limits(1, 0)), M::stores(&redis)).await;
    let (http, api) = (Client::new(), server.url("/_inflight"));
    fund(&http, &api, 3).await;
    let failed = from_t1(&http, server.url("/ok")).send().await.unwrap();
    assert_eq!(failed.status(), StatusCode::BAD_GATEWAY);
    settles_to(&http, &api, (3, 0)).await;
}

async fn committing_on_admission_charges_upstream_errors_too<M: Make>() {
    let redis = M::redis();
    let (base, _gate, _hits) = upstream().await;
    let mut serve = limits(1, 0);
    serve.quota.quota_commit = QuotaCommit::OnAdmission;
    let server = start_proxy(&charging(&base, serve), M::stores(&redis)).await;
    let (http, api) = (Client::new(), server.url("/_inflight"));
    fund(&http, &api, 3).await;
    let failed = from_t1(&http, server.url("/fail")).send().await.unwrap();
    assert_eq!(failed.status(), StatusCode::INTERNAL_SERVER_ERROR);
    settles_to(&http, &api, (2, 0)).await;
    let mut stream = from_t1(&http, server.url("/forever")).send().await.unwrap();
    assert!(stream.chunk().await.unwrap().is_some());
    drop(stream);
    settles_to(&http, &api, (1, 0)).await;
}

/// A stream that outlasts `--quota-ttl` is still charged when it reaches its end: the proxy extends the
/// reservation it holds while the response runs.
async fn a_stream_longer_than_the_quota_ttl_is_charged<M: Make>() {
    let redis = M::redis();
    let (base, gate, _hits) = upstream().await;
    let mut serve = limits(1, 0);
    serve.quota.quota_ttl = Duration::from_secs(1);
    let server = start_proxy(&charging(&base, serve), M::stores(&redis)).await;
    let (http, api) = (Client::new(), server.url("/_inflight"));
    fund(&http, &api, 10).await;
    let mut stream = from_t1(&http, server.url("/sse")).send().await.unwrap();
    assert_eq!(stream.chunk().await.unwrap().unwrap(), "data: 0\n\n");
    tokio::time::sleep(Duration::from_millis(3_000)).await;
    settles_to(&http, &api, (9, 1)).await;
    gate.add_permits(2);
    while stream.chunk().await.unwrap().is_some() {}
    settles_to(&http, &api, (9, 0)).await;
}

per_store!(
    a_charge_is_committed_only_when_the_answer_reached_its_end,
    an_unreachable_upstream_is_not_charged,
    committing_on_admission_charges_upstream_errors_too,
    a_stream_longer_than_the_quota_ttl_is_charged,
);
