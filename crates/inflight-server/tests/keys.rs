//! `GET /v1/keys`: the busy keys over HTTP, on the memory and the Redis store.
#![allow(missing_docs)]

mod common;

use std::time::{Duration, Instant};

use axum::body::Body;
use axum::Router;
use common::{limits, start_api, Make};
use inflight_server::Settings;
use reqwest::{Client, StatusCode};
use serde_json::{json, Value};

async fn listed(http: &Client, url: &str) -> Value {
    let response = http.get(url).send().await.unwrap();
    assert_eq!(response.status(), StatusCode::OK, "{url}");
    response.json().await.unwrap()
}

/// Waits (bounded) until the listing at `url` has these `(key, in_flight)`.
async fn until_listed(http: &Client, url: &str, want: &[(&str, u64)]) -> Value {
    let started = Instant::now();
    loop {
        let body = listed(http, url).await;
        let got: Vec<(String, u64)> = body["keys"]
            .as_array()
            .unwrap()
            .iter()
            .map(|k| {
                (
                    k["key"].as_str().unwrap().to_owned(),
                    k["in_flight"].as_u64().unwrap(),
                )
            })
            .collect();
        let want: Vec<(String, u64)> = want.iter().map(|(k, n)| ((*k).to_owned(), *n)).collect();
        if got == want {
            return body;
        }
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "{url}: {got:?}, want {want:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn busy_keys_are_listed_busiest_first<M: Make>() {
    let redis = M::redis();
    let server = start_api(&limits(4, 0), M::stores(&redis)).await;
    let http = Client::new();
    let acquire = |key: &str, weight: u32| {
        http.post(server.url(&format!("/v1/keys/{key}/permits")))
            .json(&json!({"weight": weight}))
            .send()
    };
    let a = acquire("app:a", 3).await.unwrap();
    assert_eq!(a.status(), StatusCode::CREATED);
    let a: Value = a.json().await.unwrap();
    let b: Value = acquire("app:b", 1).await.unwrap().json().await.unwrap();
    acquire("other", 2).await.unwrap();
    let set = http
        .put(server.url("/v1/keys/app:b/limit"))
        .json(&json!({"limit": 7}))
        .send()
        .await
        .unwrap();
    assert_eq!(set.status(), StatusCode::OK);

    let body = listed(&http, &server.url("/v1/keys?prefix=app%3A")).await;
    assert_eq!(
        body,
        json!({"keys": [
            {"key": "app:a", "limit": 4, "in_flight": 3},
            {"key": "app:b", "limit": 7, "in_flight": 1},
        ], "truncated": false})
    );
    let body = listed(&http, &server.url("/v1/keys?limit=1")).await;
    assert_eq!(body["keys"].as_array().unwrap().len(), 1);
    assert_eq!(body["keys"][0]["key"], "app:a");
    assert_eq!(body["truncated"], true);

    let release = |key: &str, id: &Value| {
        http.delete(server.url(&format!("/v1/keys/{key}/permits/{}", id.as_str().unwrap())))
            .send()
    };
    assert_eq!(
        release("app:a", &a["id"]).await.unwrap().status(),
        StatusCode::NO_CONTENT
    );
    until_listed(&http, &server.url("/v1/keys?prefix=app:"), &[("app:b", 1)]).await;
    release("app:b", &b["id"]).await.unwrap();
    let body = until_listed(&http, &server.url("/v1/keys?prefix=app:"), &[]).await;
    assert_eq!(body["truncated"], false);
}

async fn waiters_of_the_worker_are_shown<M: Make>() {
    let redis = M::redis();
    let mut settings = limits(1, 0);
    settings.workers = Some(1);
    let server = start_api(&settings, M::stores(&redis)).await;
    let http = Client::new();
    let url = server.url("/v1/keys/k/permits");
    let held: Value = http.post(&url).send().await.unwrap().json().await.unwrap();
    let waiting = tokio::spawn(http.post(&url).json(&json!({"wait_ms": 10_000})).send());
    let started = Instant::now();
    loop {
        let body = listed(&http, &server.url("/v1/keys")).await;
        if body["keys"][0]["waiters"] == 1 {
            assert_eq!(body["keys"][0]["in_flight"], 1);
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "no waiter: {body}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let id = held["id"].as_str().unwrap();
    http.delete(server.url(&format!("/v1/keys/k/permits/{id}")))
        .send()
        .await
        .unwrap();
    assert_eq!(
        waiting.await.unwrap().unwrap().status(),
        StatusCode::CREATED
    );
    let body = listed(&http, &server.url("/v1/keys")).await;
    assert!(body["keys"][0].get("waiters").is_none(), "{body}");
}

async fn bad_listings_are_400_and_the_api_token_is_needed<M: Make>() {
    let redis = M::redis();
    let settings = Settings {
        api_token: Some("api-s3cret".into()),
        ..limits(1, 0)
    };
    let server = start_api(&settings, M::stores(&redis)).await;
    let http = Client::new();
    let unauthorized = http.get(server.url("/v1/keys")).send().await.unwrap();
    assert_eq!(unauthorized.status(), StatusCode::UNAUTHORIZED);
    for query in [
        "limit=0",
        "limit=1001",
        "limit=ten",
        "prefix=%0A",
        "sort=asc",
    ] {
        let response = http
            .get(server.url(&format!("/v1/keys?{query}")))
            .bearer_auth("api-s3cret")
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::BAD_REQUEST, "{query}");
        let body: Value = response.json().await.unwrap();
        assert_eq!(body["code"], "invalid_request", "{query}: {body}");
        assert_eq!(body["status"], 400);
    }
    let fine = http
        .get(server.url("/v1/keys?limit=1000"))
        .bearer_auth("api-s3cret")
        .send()
        .await
        .unwrap();
    assert_eq!(fine.status(), StatusCode::OK);
}

/// `GET path` on `router` (a worker's routes, without a server): status, `Retry-After`, JSON body.
async fn routed(router: &Router, path: &str) -> (u16, Option<String>, Value) {
    let request = http::Request::get(path).body(Body::empty()).unwrap();
    let response = tower_service::Service::call(&mut router.clone(), request)
        .await
        .unwrap();
    let status = response.status().as_u16();
    let retry = response.headers().get("retry-after");
    let retry = retry.map(|value| value.to_str().unwrap().to_owned());
    let body = axum::body::to_bytes(response.into_body(), 1 << 20)
        .await
        .unwrap();
    (status, retry, serde_json::from_slice(&body).unwrap())
}

/// The cap on listings in progress is the process's, every worker's together: with its places held (as
/// listings in progress hold them), a listing on any worker is `429 too_many_listings`; a place given
/// back is the next listing's, which gives it back once answered.
#[tokio::test]
async fn listings_past_the_processs_cap_are_refused_until_a_place_is_given_back() {
    let settings = limits(4, 0);
    let shared = inflight_server::Shared::new(&settings).unwrap();
    let store = inflight::MemoryStore::new();
    // Two workers' routes over one store, sharing what a process's workers share.
    let workers: Vec<Router> = (0..2)
        .map(|_| {
            let app = inflight_server::app(&settings, &shared, store.clone().into()).unwrap();
            inflight_server::api::router(app)
        })
        .collect();
    let max = inflight_server::app::MAX_LISTINGS;
    let mut held: Vec<_> = (0..max)
        .map(|_| shared.listings.try_enter().expect("a free place"))
        .collect();
    for worker in &workers {
        let (status, retry, body) = routed(worker, "/v1/keys?limit=1000").await;
        assert_eq!(status, 429, "{body}");
        assert_eq!(retry.as_deref(), Some("1"));
        assert_eq!(body["code"], "too_many_listings");
        assert_eq!(body["status"], 429);
    }
    let (status, _, _) = routed(&workers[0], "/v1/keys/app").await;
    assert_eq!(status, 200, "other routes are not capped");

    drop(held.pop());
    for worker in &workers {
        let (status, _, body) = routed(worker, "/v1/keys").await;
        assert_eq!(status, 200, "{body}");
        assert_eq!(shared.listings.free(), 1, "the listing gave its place back");
    }
    drop(held);
    assert_eq!(shared.listings.free(), max);
}

per_store!(
    busy_keys_are_listed_busiest_first,
    waiters_of_the_worker_are_shown,
    bad_listings_are_400_and_the_api_token_is_needed,
);
