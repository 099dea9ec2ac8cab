//! The HTTP limiter API against a real HTTP client, on the memory and the Redis store: every row of the
//! API table and every error code.
#![allow(missing_docs)]

mod common;

use std::time::Duration;

use common::{
    get_json, get_text, limits, metric, start_api, status_of, wait_in_flight, Make, TestRedis,
};
use inflight_server::Settings;
use reqwest::{Client, StatusCode};
use serde_json::{json, Value};

async fn body(response: reqwest::Response) -> Value {
    response.json().await.expect("a JSON body")
}

async fn assert_error(response: reqwest::Response, status: StatusCode, code: &str) {
    assert_eq!(response.status(), status);
    assert_eq!(
        response.headers()["content-type"],
        "application/json",
        "errors are JSON"
    );
    let body = body(response).await;
    assert_eq!(body["code"], code, "{body}");
    assert_eq!(body["status"], status.as_u16());
    assert!(body["message"].as_str().is_some_and(|m| !m.is_empty()));
}

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

async fn limits_are_set_and_cleared<M: Make>() {
    let redis = M::redis();
    let server = start_api(&limits(1, 10), M::stores(&redis)).await;
    let http = Client::new();
    let set = http
        .put(server.url("/v1/keys/tenant%2F7/limit"))
        .json(&json!({"limit": 50}))
        .send()
        .await
        .unwrap();
    assert_eq!(set.status(), StatusCode::OK);
    assert_eq!(
        body(set).await,
        json!({"key": "tenant/7", "limit": 10, "in_flight": 0}),
        "capped by the ceiling"
    );
    let set = http
        .put(server.url("/v1/keys/tenant%2F7/limit"))
        .json(&json!({"limit": 3}))
        .send()
        .await
        .unwrap();
    assert_eq!(body(set).await["limit"], 3);
    for _ in 0..3 {
        assert_eq!(
            status_of(http.post(server.url("/v1/keys/tenant%2F7/permits"))).await,
            201
        );
    }
    assert_eq!(
        status_of(http.post(server.url("/v1/keys/tenant%2F7/permits"))).await,
        429
    );
    let cleared = http
        .delete(server.url("/v1/keys/tenant%2F7/limit"))
        .send()
        .await
        .unwrap();
    assert_eq!(
        body(cleared).await,
        json!({"key": "tenant/7", "limit": 1, "in_flight": 3})
    );
    let zero = http
        .put(server.url("/v1/keys/tenant%2F7/limit"))
        .json(&json!({"limit": 0}))
        .send()
        .await
        .unwrap();
    assert_eq!(body(zero).await["limit"], 1, "0 clears");
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

async fn bad_input_gets_a_clear_error_and_never_a_500<M: Make>() {
    let redis = M::redis();
    let server = start_api(&limits(2, 0), M::stores(&redis)).await;
    let http = Client::new();
    let long = "k".repeat(257);
    for path in [
        "/v1/keys//permits",
        "/v1/keys/a%01b/permits",
        &format!("/v1/keys/{long}/permits"),
        "/v1/keys/%FF/permits",
    ] {
        assert_error(
            http.post(server.url(path)).send().await.unwrap(),
            StatusCode::BAD_REQUEST,
            "invalid_key",
        )
        .await;
    }
    let url = server.url("/v1/keys/app/permits");
    for bad in [
        "{bad",
        "[]",
        "{\"weight\": 0}",
        "{\"weight\": -1}",
        "{\"lease_ms\": 0}",
        "{\"lease_ms\": 99999999999}",
        "{\"id\": \"\"}",
        "{\"unknown\": 1}",
        "{\"id\": 5}",
    ] {
        let response = http.post(&url).body(bad).send().await.unwrap();
        assert_error(response, StatusCode::BAD_REQUEST, "invalid_request").await;
    }
    let heavy = http
        .post(&url)
        .json(&json!({"weight": 3}))
        .send()
        .await
        .unwrap();
    assert_error(heavy, StatusCode::BAD_REQUEST, "weight_exceeds_limit").await;
    let limit = http
        .put(server.url("/v1/keys/app/limit"))
        .body("{\"limit\": \"x\"}")
        .send()
        .await
        .unwrap();
    assert_error(limit, StatusCode::BAD_REQUEST, "invalid_request").await;
    let limit = http
        .put(server.url("/v1/keys/app/limit"))
        .send()
        .await
        .unwrap();
    assert_error(limit, StatusCode::BAD_REQUEST, "invalid_request").await;
    assert_error(
        http.get(server.url("/nope")).send().await.unwrap(),
        StatusCode::NOT_FOUND,
        "not_found",
    )
    .await;
    assert_error(
        http.patch(url.clone()).send().await.unwrap(),
        StatusCode::METHOD_NOT_ALLOWED,
        "method_not_allowed",
    )
    .await;
    // Odd bytes everywhere: any 4xx, never a 5xx.
    for body in [
        "",
        "null",
        "{}",
        "{\"id\": \"\\u0000\"}",
        "\u{feff}{}",
        "{\"weight\": 1e99}",
    ] {
        let status = status_of(http.post(&url).body(body)).await;
        assert!(
            status.is_success() || status.is_client_error(),
            "{body:?} -> {status}"
        );
    }
    // Nothing bad was admitted.
    assert!(body_in_flight(&http, &server.url("/v1/keys/app")).await <= 2);
}

async fn body_in_flight(http: &Client, url: &str) -> u64 {
    body(http.get(url).send().await.unwrap()).await["in_flight"]
        .as_u64()
        .unwrap()
}

async fn the_admin_token_guards_limit_changes<M: Make>() {
    let redis = M::redis();
    let args = Settings {
        admin_token: Some("s3cret".into()),
        ..limits(1, 0)
    };
    let server = start_api(&args, M::stores(&redis)).await;
    let http = Client::new();
    let url = server.url("/v1/keys/app/limit");
    assert_error(
        http.put(&url)
            .json(&json!({"limit": 5}))
            .send()
            .await
            .unwrap(),
        StatusCode::UNAUTHORIZED,
        "unauthorized",
    )
    .await;
    let wrong = http
        .put(&url)
        .bearer_auth("guess")
        .json(&json!({"limit": 5}))
        .send()
        .await
        .unwrap();
    assert_error(wrong, StatusCode::UNAUTHORIZED, "unauthorized").await;
    assert_error(
        http.delete(&url).send().await.unwrap(),
        StatusCode::UNAUTHORIZED,
        "unauthorized",
    )
    .await;
    let right = http
        .put(&url)
        .bearer_auth("s3cret")
        .json(&json!({"limit": 5}))
        .send()
        .await
        .unwrap();
    assert_eq!(right.status(), StatusCode::OK);
    // The scheme in any case (RFC 9110), with any spaces after it.
    for authorization in ["bearer s3cret", "BEARER   s3cret", "Bearer\ts3cret"] {
        let lower = http
            .put(&url)
            .header("authorization", authorization)
            .json(&json!({"limit": 5}))
            .send()
            .await
            .unwrap();
        assert_eq!(lower.status(), StatusCode::OK, "{authorization}");
    }
    for wrong in ["Basic s3cret", "s3cret", "Bearer s3cret2", "Bearers3cret"] {
        let refused = http
            .put(&url)
            .header("authorization", wrong)
            .json(&json!({"limit": 5}))
            .send()
            .await
            .unwrap();
        assert_eq!(refused.status(), StatusCode::UNAUTHORIZED, "{wrong}");
    }
    // Acquiring needs no token.
    assert_eq!(
        status_of(http.post(server.url("/v1/keys/app/permits"))).await,
        201
    );
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

async fn health_readiness_metrics_and_openapi<M: Make>() {
    let redis = M::redis();
    let server = start_api(&limits(1, 0), M::stores(&redis)).await;
    let http = Client::new();
    assert_eq!(status_of(http.get(server.url("/healthz"))).await, 200);
    assert_eq!(status_of(http.get(server.url("/readyz"))).await, 200);
    http.post(server.url("/v1/keys/m/permits"))
        .send()
        .await
        .unwrap();
    http.post(server.url("/v1/keys/m/permits"))
        .send()
        .await
        .unwrap();
    let metrics = get_text(&http, server.url("/metrics")).await;
    for line in [
        "inflight_admissions_total{result=\"admitted\"}",
        "inflight_admissions_total{result=\"rejected\"}",
        "inflight_store_duration_seconds_bucket{op=\"acquire\"",
        "inflight_leases_reclaimed_total",
        "inflight_leases_lost_total",
    ] {
        assert!(metrics.contains(line), "no {line} in\n{metrics}");
    }
    assert!(
        !metrics.contains("key=\"m\""),
        "no per-key labels unless asked for"
    );
    let openapi: Value = get_json(&http, server.url("/openapi.json")).await;
    assert_eq!(openapi["openapi"], "3.0.3");
    for path in [
        "/v1/keys/{key}/permits",
        "/v1/keys/{key}/permits/{id}",
        "/v1/keys/{key}",
        "/v1/keys/{key}/limit",
    ] {
        assert!(openapi["paths"][path].is_object(), "{path} documented");
    }
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
    limits_are_set_and_cleared,
    an_unlimited_key_is_admitted_and_its_permits_renew,
    bad_input_gets_a_clear_error_and_never_a_500,
    the_admin_token_guards_limit_changes,
    an_abandoned_lease_frees_its_slot,
    health_readiness_metrics_and_openapi,
);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_down_means_503_store_unavailable_under_fail_closed_and_not_ready() {
    let mut redis = TestRedis::start();
    let server = start_api(&limits(1, 0), common::redis_stores(&redis)).await;
    let http = Client::new();
    redis.stop();
    assert_error(
        http.post(server.url("/v1/keys/a/permits"))
            .send()
            .await
            .unwrap(),
        StatusCode::SERVICE_UNAVAILABLE,
        "store_unavailable",
    )
    .await;
    assert_error(
        http.get(server.url("/v1/keys/a")).send().await.unwrap(),
        StatusCode::SERVICE_UNAVAILABLE,
        "store_unavailable",
    )
    .await;
    assert_error(
        http.get(server.url("/readyz")).send().await.unwrap(),
        StatusCode::SERVICE_UNAVAILABLE,
        "store_unavailable",
    )
    .await;
    let metrics = get_text(&http, server.url("/metrics")).await;
    assert!(metrics.contains("inflight_admissions_total{result=\"error\"}"));
    redis.restart();
    let mut ready = false;
    for _ in 0..100 {
        if status_of(http.get(server.url("/readyz"))).await == 200 {
            ready = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(ready, "ready again once Redis is back");
    // Admissions skip the store for a moment after a failure, then try it again by themselves.
    let back = std::time::Instant::now();
    while status_of(http.post(server.url("/v1/keys/a/permits"))).await != 201 {
        assert!(
            back.elapsed() < Duration::from_secs(1),
            "admissions did not resume within 1 s"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn per_key_metric_labels_when_asked_for() {
    let args = Settings {
        metrics_per_key: true,
        ..limits(1, 0)
    };
    let server = start_api(&args, common::Memory::stores(&None)).await;
    let http = Client::new();
    http.post(server.url("/v1/keys/labelled-key/permits"))
        .send()
        .await
        .unwrap();
    let metrics = get_text(&http, server.url("/metrics")).await;
    assert!(metrics.contains("key=\"labelled-key\""), "{metrics}");
}
