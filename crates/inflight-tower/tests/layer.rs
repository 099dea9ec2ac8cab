//! The layer in an axum app, with a real client: the permit lives as long as the response body.
#![allow(missing_docs)]

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::routing::get;
use axum::Router;
use inflight::{Limiter, MemoryStore, Policy};
use inflight_tower::InflightLayer;
use tokio::sync::Semaphore;

async fn app(gate: Arc<Semaphore>) -> (String, Limiter<MemoryStore>) {
    let limiter = Limiter::builder(MemoryStore::new())
        .policy(Policy::new(1, 0))
        .build();
    let tenant = |parts: &http::request::Parts| {
        parts
            .headers
            .get("x-tenant")?
            .to_str()
            .ok()
            .map(str::to_owned)
    };
    let app = Router::new()
        .route(
            "/stream",
            get(move || {
                let gate = gate.clone();
                async move {
                    let chunks = futures_util::stream::unfold(0, move |n| {
                        let gate = gate.clone();
                        async move {
                            if n == 2 {
                                return None;
                            }
                            if n == 1 {
                                gate.acquire().await.expect("gate").forget();
                            }
                            Some((
                                Ok::<_, Infallible>(Bytes::from(format!("chunk {n}\n"))),
                                n + 1,
                            ))
                        }
                    });
                    Body::from_stream(chunks)
                }
            }),
        )
        .layer(InflightLayer::new(limiter.clone(), tenant));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (base, limiter)
}

async fn in_flight(limiter: &Limiter<MemoryStore>, key: &str) -> u32 {
    limiter.status(key).await.unwrap().in_flight
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_permit_is_held_until_the_body_ends_not_the_headers() {
    let gate = Arc::new(Semaphore::new(0));
    let (base, limiter) = app(gate.clone()).await;
    let http = reqwest::Client::new();
    let mut first = http
        .get(format!("{base}/stream"))
        .header("x-tenant", "acme")
        .send()
        .await
        .unwrap();
    assert_eq!(first.status(), 200);
    assert_eq!(first.chunk().await.unwrap().unwrap(), "chunk 0\n");
    // Headers and a first chunk are out; tower's ConcurrencyLimit would have released by now.
    assert_eq!(in_flight(&limiter, "acme").await, 1);
    let refused = http
        .get(format!("{base}/stream"))
        .header("x-tenant", "acme")
        .send()
        .await
        .unwrap();
    assert_eq!(refused.status(), 429);
    assert!(refused.headers().contains_key("retry-after"));
    assert_eq!(
        refused.headers()["inflight-limit"],
        r#"key="acme"; class="default"; limit=1; in_flight=1"#
    );
    let body: serde_json::Value = refused.json().await.unwrap();
    assert_eq!(body["code"], "too_many_requests");
    assert_eq!((&body["key"], &body["limit"]), (&"acme".into(), &1.into()));
    // Another tenant has its own slot.
    let other = http
        .get(format!("{base}/stream"))
        .header("x-tenant", "globex")
        .send()
        .await
        .unwrap();
    assert_eq!(other.status(), 200);
    gate.add_permits(2);
    assert_eq!(first.chunk().await.unwrap().unwrap(), "chunk 1\n");
    assert!(first.chunk().await.unwrap().is_none());
    assert_eq!(
        in_flight(&limiter, "acme").await,
        0,
        "released at the end of the body"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_response_releases_and_a_request_without_key_is_refused() {
    let gate = Arc::new(Semaphore::new(0));
    let (base, limiter) = app(gate).await;
    let http = reqwest::Client::new();
    let missing = http.get(format!("{base}/stream")).send().await.unwrap();
    assert_eq!(missing.status(), 400);
    assert_eq!(
        missing.json::<serde_json::Value>().await.unwrap()["code"],
        "missing_key"
    );
    let mut response = http
        .get(format!("{base}/stream"))
        .header("x-tenant", "acme")
        .send()
        .await
        .unwrap();
    assert!(response.chunk().await.unwrap().is_some());
    drop(response);
    drop(http);
    for _ in 0..100 {
        if in_flight(&limiter, "acme").await == 0 {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("the slot of a client that went away was not released");
}
