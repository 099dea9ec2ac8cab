//! Permits acquired, renewed and released, on limited and unlimited keys, and leases handed out or
//! abandoned.

use std::time::Duration;

use reqwest::{Client, StatusCode};
use serde_json::{json, Value};

use crate::common::{limits, metric, start_api, status_of, wait_in_flight, Make};
use crate::per_store;
use crate::{assert_error, body};

async fn permits_are_acquired_renewed_and_released<M: Make>() {
    let redis = M::redis();
    let server = start_api(&limits(2, 0), M::stores(&redis)).await;
    let http = Client::new();
    let url = server.url("/v1/keys/app-1/permits");

    let first = http.post(&url).send().await.unwrap();
    assert_eq!(first.status(), StatusCode::CREATED);
    let first = body(first).await;
    assert_eq!(first["key"], "app-1");
    assert_eq!(first["weight"], 1);
    assert_eq!(first["limit"], 2);
    assert_eq!(first["in_flight"], 1);
    assert_eq!(first["id"].as_str().unwrap().len(), 36, "a generated UUID");
    let expires = first["lease_expires_at_ms"].as_u64().unwrap();

    let second = http
        .post(&url)
        .json(&json!({"id": "req-2", "lease_ms": 60000}))
        .send()
        .await
        .unwrap();
    assert_eq!(second.status(), StatusCode::CREATED);
    let second = body(second).await;
    assert_eq!(
        (second["id"].as_str(), second["in_flight"].as_u64()),
        (Some("req-2"), Some(2))
    );
    assert!(second["lease_expires_at_ms"].as_u64().unwrap() > expires + 20_000);

    // Full: 429 with Retry-After and the stable body.
    let full = http.post(&url).send().await.unwrap();
    let retry_after: u64 = full.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!(retry_after >= 1);
    assert_error(full, StatusCode::TOO_MANY_REQUESTS, "too_many_requests").await;

    // The same id again counts once.
    let again = http
        .post(&url)
        .json(&json!({"id": "req-2"}))
        .send()
        .await
        .unwrap();
    assert_eq!(again.status(), StatusCode::CREATED);
    assert_eq!(body(again).await["in_flight"], 2);

    // Renew.
    let id = first["id"].as_str().unwrap();
    let renewed = http
        .put(server.url(&format!("/v1/keys/app-1/permits/{id}")))
        .json(&json!({"lease_ms": 120000}))
        .send()
        .await
        .unwrap();
    assert_eq!(renewed.status(), StatusCode::OK);
    let renewed = body(renewed).await;
    assert_eq!(renewed["id"], id);
    assert_eq!(
        (renewed["weight"].as_u64(), renewed["limit"].as_u64()),
        (Some(1), Some(2))
    );
    assert!(renewed["lease_expires_at_ms"].as_u64().unwrap() > expires + 60_000);
    let renewed = http
        .put(server.url(&format!("/v1/keys/app-1/permits/{id}")))
        .send()
        .await
        .unwrap();
    assert_eq!(
        renewed.status(),
        StatusCode::OK,
        "an empty body renews for the default lease"
    );

    // Release, twice.
    for _ in 0..2 {
        let released = http
            .delete(server.url(&format!("/v1/keys/app-1/permits/{id}")))
            .send()
            .await
            .unwrap();
        assert_eq!(released.status(), StatusCode::NO_CONTENT);
    }
    let gone = http
        .put(server.url(&format!("/v1/keys/app-1/permits/{id}")))
        .send()
        .await
        .unwrap();
    assert_error(gone, StatusCode::NOT_FOUND, "permit_not_found").await;

    let key = body(http.get(server.url("/v1/keys/app-1")).send().await.unwrap()).await;
    assert_eq!(key, json!({"key": "app-1", "limit": 2, "in_flight": 1}));
}

async fn an_unlimited_key_is_admitted_and_its_permits_renew<M: Make>() {
    let redis = M::redis();
    let server = start_api(&limits(0, 0), M::stores(&redis)).await;
    let http = Client::new();
    let permit = body(
        http.post(server.url("/v1/keys/free/permits"))
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(permit["limit"], Value::Null);
    assert_eq!(permit["lease_expires_at_ms"], Value::Null);
    let id = permit["id"].as_str().unwrap();
    let renewed = http
        .put(server.url(&format!("/v1/keys/free/permits/{id}")))
        .send()
        .await
        .unwrap();
    assert_eq!(
        renewed.status(),
        StatusCode::OK,
        "nothing to renew, nothing lost"
    );
    assert_eq!(body(renewed).await["limit"], Value::Null);
}

async fn an_abandoned_lease_frees_its_slot<M: Make>() {
    let redis = M::redis();
    let server = start_api(&limits(1, 0), M::stores(&redis)).await;
    let http = Client::new();
    let url = server.url("/v1/keys/app/permits");
    let held = http
        .post(&url)
        .json(&json!({"lease_ms": 300}))
        .send()
        .await
        .unwrap();
    assert_eq!(held.status(), StatusCode::CREATED);
    assert_eq!(status_of(http.post(&url)).await, 429);
    // The worker died: nobody renews. The slot comes back when the lease ends.
    let took = wait_in_flight(&server.base, "app", 0).await;
    assert!(took < Duration::from_secs(2));
    assert_eq!(status_of(http.post(&url)).await, 201);
}

/// `inflight_in_flight` counts the leases this server handed out, until they are released or end.
async fn a_lease_handed_out_is_in_flight_until_released_or_ended<M: Make>() {
    let redis = M::redis();
    let server = start_api(&limits(2, 0), M::stores(&redis)).await;
    let http = Client::new();
    let (url, metrics) = (server.url("/v1/keys/g/permits"), server.url("/metrics"));
    assert_eq!(metric(&http, &metrics, "inflight_in_flight").await, 0.0);
    let permit = body(http.post(&url).send().await.unwrap()).await;
    assert_eq!(metric(&http, &metrics, "inflight_in_flight").await, 1.0);
    let id = permit["id"].as_str().unwrap();
    let released = http.delete(format!("{url}/{id}")).send().await.unwrap();
    assert_eq!(released.status(), StatusCode::NO_CONTENT);
    assert_eq!(metric(&http, &metrics, "inflight_in_flight").await, 0.0);
    // A lease nobody renews is in flight until its deadline, not after.
    let short = http
        .post(&url)
        .json(&json!({"lease_ms": 200}))
        .send()
        .await
        .unwrap();
    assert_eq!(short.status(), StatusCode::CREATED);
    assert_eq!(metric(&http, &metrics, "inflight_in_flight").await, 1.0);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(metric(&http, &metrics, "inflight_in_flight").await, 0.0);
}

per_store!(
    a_lease_handed_out_is_in_flight_until_released_or_ended,
    permits_are_acquired_renewed_and_released,
    an_unlimited_key_is_admitted_and_its_permits_renew,
    an_abandoned_lease_frees_its_slot,
);
