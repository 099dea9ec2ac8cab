//! Quotas over HTTP against a real client, on the memory and the Redis store: balances and reservations
//! held by remote callers (quota_permits.rs: charges taken with permits).
#![allow(missing_docs)]

mod common;

use common::{get_json, get_text, limits, start_api, Make};
use inflight_server::Settings;
use reqwest::{Client, StatusCode};
use serde_json::{json, Value};

async fn send(request: reqwest::RequestBuilder) -> (StatusCode, Value) {
    let response = request.send().await.unwrap();
    let status = response.status();
    (status, response.json().await.unwrap_or(Value::Null))
}

/// (balance, reserved) as `GET /v1/quotas/{key}` answers them.
async fn figures(http: &Client, base: &str, key: &str) -> (Value, u64) {
    let body = get_json(http, format!("{base}/v1/quotas/{key}")).await;
    assert_eq!(body["key"], key);
    (body["balance"].clone(), body["reserved"].as_u64().unwrap())
}

fn code(body: &Value) -> &str {
    body["code"].as_str().unwrap_or_default()
}

async fn balances_are_set_topped_up_and_read<M: Make>() {
    let redis = M::redis();
    let settings = Settings {
        admin_token: Some("s3cret".into()),
        ..limits(1, 0)
    };
    let server = start_api(&settings, M::stores(&redis)).await;
    let http = Client::new();
    let url = server.url("/v1/quotas/tenant:t1");
    let top_up = format!("{url}/top-up");
    assert_eq!(
        figures(&http, &server.base, "tenant:t1").await,
        (Value::Null, 0),
        "unmetered"
    );

    let (status, body) = send(http.put(&url).json(&json!({"balance": 3}))).await;
    assert_eq!(
        (status, code(&body)),
        (StatusCode::UNAUTHORIZED, "unauthorized")
    );
    let (status, body) = send(http.post(&top_up).json(&json!({"amount": 3}))).await;
    assert_eq!(
        (status, code(&body)),
        (StatusCode::UNAUTHORIZED, "unauthorized")
    );
    let (status, body) = send(
        http.put(&url)
            .bearer_auth("s3cret")
            .json(&json!({"balance": 3})),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        body,
        json!({"key": "tenant:t1", "balance": 3, "reserved": 0})
    );
    let admin = |request: reqwest::RequestBuilder| request.bearer_auth("s3cret");
    let (status, body) = send(admin(http.post(&top_up)).json(&json!({"amount": 2}))).await;
    assert_eq!(
        (status, body["balance"].as_u64()),
        (StatusCode::OK, Some(5))
    );
    assert_eq!(
        figures(&http, &server.base, "tenant:t1").await,
        (json!(5), 0)
    );

    for (request, bad) in [
        (
            admin(http.put(&url)).json(&json!({"balance": -1})),
            "invalid_request",
        ),
        (
            admin(http.put(&url)).json(&json!({"limit": 1})),
            "invalid_request",
        ),
        (
            admin(http.put(&url)).json(&json!({"balance": 10_u64.pow(15) + 1})),
            "invalid_request",
        ),
        (
            admin(http.post(&top_up)).json(&json!({"amount": 0})),
            "invalid_request",
        ),
        (
            admin(http.post(&top_up)).json(&json!({"amount": 10_u64.pow(15)})),
            "invalid_request",
        ),
        (admin(http.post(&top_up)), "invalid_request"),
        (
            admin(http.put(server.url("/v1/quotas/a%09b"))).json(&json!({"balance": 1})),
            "invalid_key",
        ),
    ] {
        let (status, body) = send(request).await;
        assert_eq!(
            (status, code(&body)),
            (StatusCode::BAD_REQUEST, bad),
            "{body}"
        );
    }
    assert_eq!(
        figures(&http, &server.base, "tenant:t1").await,
        (json!(5), 0),
        "unchanged"
    );
}

async fn reservations_are_committed_or_refunded_once<M: Make>() {
    let redis = M::redis();
    let server = start_api(&limits(1, 0), M::stores(&redis)).await;
    let http = Client::new();
    let base = server.base.clone();
    let set = json!({"balance": 5});
    assert_eq!(
        send(http.put(server.url("/v1/quotas/t1")).json(&set))
            .await
            .0,
        StatusCode::OK
    );
    let reservations = server.url("/v1/quotas/t1/reservations");

    let (status, spent) = send(http.post(&reservations).json(&json!({"amount": 2}))).await;
    assert_eq!(status, StatusCode::CREATED, "{spent}");
    assert_eq!(
        (spent["key"].as_str(), spent["amount"].as_u64()),
        (Some("t1"), Some(2))
    );
    assert_eq!(spent["balance"], 3);
    assert!(spent["expires_at_ms"].as_u64().unwrap() > 1_700_000_000_000);
    assert_eq!(figures(&http, &base, "t1").await, (json!(3), 2));
    let one = format!("{reservations}/{}", spent["id"].as_str().unwrap());
    let (status, body) = send(http.post(format!("{one}/commit"))).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body, json!({"key": "t1", "balance": 3, "reserved": 0}));
    let (status, _) = send(http.post(format!("{one}/commit"))).await;
    assert_eq!(status, StatusCode::OK, "a retried commit");
    let (status, body) = send(http.delete(&one)).await;
    assert_eq!(
        (status, code(&body)),
        (StatusCode::NOT_FOUND, "reservation_not_found")
    );

    let (status, back) = send(http.post(&reservations)).await;
    assert_eq!(
        (status, back["amount"].as_u64()),
        (StatusCode::CREATED, Some(1)),
        "amount 1 by default"
    );
    let one = format!("{reservations}/{}", back["id"].as_str().unwrap());
    let (status, body) = send(http.delete(&one)).await;
    assert_eq!(
        (status, body["balance"].as_u64()),
        (StatusCode::OK, Some(3))
    );
    assert_eq!(
        send(http.delete(&one)).await.0,
        StatusCode::OK,
        "a retried refund"
    );
    let (status, body) = send(http.post(format!("{one}/commit"))).await;
    assert_eq!(
        (status, code(&body)),
        (StatusCode::NOT_FOUND, "reservation_not_found")
    );
    let (status, body) = send(http.post(format!("{reservations}/never/commit"))).await;
    assert_eq!(
        (status, code(&body)),
        (StatusCode::NOT_FOUND, "reservation_not_found")
    );

    let (status, body) = send(http.post(&reservations).json(&json!({"amount": 4}))).await;
    assert_eq!(
        (status, code(&body)),
        (StatusCode::TOO_MANY_REQUESTS, "quota_exhausted")
    );
    assert_eq!(body["key"], "t1");
    for bad in [
        json!({"amount": 0}),
        json!({"ttl_ms": 0}),
        json!({"ttl_ms": 86_400_001}),
        json!({"id": "x"}),
    ] {
        let (status, body) = send(http.post(&reservations).json(&bad)).await;
        assert_eq!(
            (status, code(&body)),
            (StatusCode::BAD_REQUEST, "invalid_request"),
            "{bad}"
        );
    }
    assert_eq!(figures(&http, &base, "t1").await, (json!(3), 0));

    // Not settled within its ttl: refunded by the store (on the next touch of the key).
    let (_, short) = send(http.post(&reservations).json(&json!({"ttl_ms": 100}))).await;
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    assert_eq!(figures(&http, &base, "t1").await, (json!(3), 0), "refunded");
    let late = format!("{reservations}/{}/commit", short["id"].as_str().unwrap());
    assert_eq!(send(http.post(late)).await.0, StatusCode::NOT_FOUND);

    // An unmetered key: nothing held, nothing to settle, nothing missing.
    let (status, free) = send(http.post(server.url("/v1/quotas/free/reservations"))).await;
    assert_eq!(status, StatusCode::CREATED);
    assert_eq!(
        (free["balance"].clone(), free["expires_at_ms"].clone()),
        (Value::Null, Value::Null)
    );
    let commit = server.url(&format!(
        "/v1/quotas/free/reservations/{}/commit",
        free["id"].as_str().unwrap()
    ));
    let (status, body) = send(http.post(commit)).await;
    assert_eq!(
        (status, body["balance"].clone()),
        (StatusCode::OK, Value::Null)
    );

    let metrics = get_text(&http, server.url("/metrics")).await;
    for outcome in ["committed", "refunded", "expired"] {
        let line = format!("inflight_reservations_total{{outcome=\"{outcome}\"}}");
        assert!(metrics.contains(&line), "no {line} in\n{metrics}");
    }
}

/// A reservation held by a remote caller is extended with `PUT .../reservations/{id}`: its deadline
/// moves to its ttl from now, so work may outlast the ttl it was taken with; one settled or expired is
/// `404 reservation_not_found`, and bad input is `400`.
async fn a_reservation_is_extended_while_its_holder_works<M: Make>() {
    let redis = M::redis();
    let server = start_api(&limits(1, 0), M::stores(&redis)).await;
    let (http, base) = (Client::new(), server.base.clone());
    let set = json!({"balance": 5});
    send(http.put(server.url("/v1/quotas/t1")).json(&set)).await;
    let reservations = server.url("/v1/quotas/t1/reservations");
    let short = json!({"ttl_ms": 500});
    let (status, held) = send(http.post(&reservations).json(&short)).await;
    assert_eq!(status, StatusCode::CREATED, "{held}");
    let one = format!("{reservations}/{}", held["id"].as_str().unwrap());
    let mut deadline = held["expires_at_ms"].as_u64().unwrap();
    // Over two ttls of work, extended every 100 ms (by 500 ms, then by the default ttl).
    for n in 0..13 {
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        let request = if n < 12 {
            http.put(&one).json(&short)
        } else {
            http.put(&one)
        };
        let (status, body) = send(request).await;
        assert_eq!(status, StatusCode::OK, "{body}");
        assert_eq!(
            (body["key"].as_str(), body["reserved"].as_u64()),
            (Some("t1"), Some(1))
        );
        let moved = body["expires_at_ms"].as_u64().unwrap();
        assert!(moved > deadline, "{body}");
        deadline = moved;
    }
    assert!(
        deadline > held["expires_at_ms"].as_u64().unwrap() + 60_000,
        "the default ttl is the server's --quota-ttl (1 h)"
    );
    assert_eq!(
        figures(&http, &base, "t1").await,
        (json!(4), 1),
        "still held"
    );
    for bad in [
        json!({"ttl_ms": 0}),
        json!({"ttl_ms": 86_400_001}),
        json!({"amount": 1}),
    ] {
        let (status, body) = send(http.put(&one).json(&bad)).await;
        assert_eq!(
            (status, code(&body)),
            (StatusCode::BAD_REQUEST, "invalid_request"),
            "{bad}"
        );
    }
    let (status, _) = send(http.post(format!("{one}/commit"))).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        figures(&http, &base, "t1").await,
        (json!(4), 0),
        "committed"
    );
    // Settled, never made: nothing to extend.
    for gone in [one.clone(), format!("{reservations}/never")] {
        let (status, body) = send(http.put(&gone)).await;
        assert_eq!(
            (status, code(&body)),
            (StatusCode::NOT_FOUND, "reservation_not_found"),
            "{gone}"
        );
    }
    // Expired: refunded, and not extended after.
    let (_, left) = send(http.post(&reservations).json(&json!({"ttl_ms": 100}))).await;
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    let late = format!("{reservations}/{}", left["id"].as_str().unwrap());
    assert_eq!(send(http.put(&late)).await.0, StatusCode::NOT_FOUND);
    assert_eq!(figures(&http, &base, "t1").await, (json!(4), 0), "refunded");
    // An unmetered key holds nothing: nothing to extend, nothing missing.
    let (status, body) = send(http.put(server.url("/v1/quotas/free/reservations/any"))).await;
    assert_eq!(
        (status, body["balance"].clone()),
        (StatusCode::OK, Value::Null)
    );
}

per_store!(
    balances_are_set_topped_up_and_read,
    reservations_are_committed_or_refunded_once,
    a_reservation_is_extended_while_its_holder_works,
);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_openapi_document_has_the_quota_routes() {
    let server = start_api(&limits(1, 0), common::Memory::stores(&None)).await;
    let openapi = get_json(&Client::new(), server.url("/openapi.json")).await;
    for path in [
        "/v1/quotas/{key}",
        "/v1/quotas/{key}/top-up",
        "/v1/quotas/{key}/reservations",
        "/v1/quotas/{key}/reservations/{id}",
        "/v1/quotas/{key}/reservations/{id}/commit",
    ] {
        assert!(openapi["paths"][path].is_object(), "{path} documented");
    }
}

#[test]
fn the_quota_settings_are_read_from_flags_and_the_file_and_checked() {
    use inflight_server::config::{Layered, QuotaCommit};
    use std::io::Write;
    let defaults = Settings::from_flags(["inflight"]).unwrap();
    assert_eq!(defaults.quota.quota_commit, QuotaCommit::OnSuccess);
    assert_eq!(
        defaults.quota.quota_ttl,
        std::time::Duration::from_secs(3600)
    );
    let flags = [
        "inflight",
        "--quota-commit",
        "on_admission",
        "--quota-ttl",
        "90s",
    ];
    let set = Settings::from_flags(flags).unwrap();
    assert_eq!(set.quota.quota_commit, QuotaCommit::OnAdmission);
    assert_eq!(set.quota.quota_ttl, std::time::Duration::from_secs(90));
    let mut toml = tempfile::Builder::new().suffix(".toml").tempfile().unwrap();
    writeln!(toml, "quota_commit = \"on_admission\"\nquota_ttl = \"2m\"").unwrap();
    let path = toml.path().to_str().unwrap();
    let from_file = Settings::from_flags(["inflight", "--config", path]).unwrap();
    assert_eq!(from_file.quota.quota_commit, QuotaCommit::OnAdmission);
    assert_eq!(
        from_file.quota.quota_ttl,
        std::time::Duration::from_secs(120)
    );
    let bad = Settings::from_flags(["inflight", "--quota-commit", "sometimes"]).unwrap_err();
    assert!(bad.to_string().contains("sometimes"), "{bad}");
    let bad = Settings::from_flags(["inflight", "--quota-ttl", "25h"]).unwrap_err();
    assert_eq!(bad.setting, "quota_ttl");
}

/// With `--metrics-balances`, /metrics sums the last balances seen per class of keys.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn balances_per_class_are_exported_on_request() {
    use inflight_server::config::Layered;
    let flags = [
        "inflight",
        "--metrics-balances",
        "true",
        "--limit",
        "metered:*=5",
    ];
    let mut settings = Settings::from_flags(flags).unwrap();
    settings.workers = Some(1);
    let server = start_api(&settings, common::Memory::stores(&None)).await;
    let http = Client::new();
    for (key, balance) in [("metered:a", 10), ("metered:b", 5), ("other:c", 7)] {
        let url = server.url(&format!("/v1/quotas/{key}"));
        let (status, _) = send(http.put(url).json(&json!({"balance": balance}))).await;
        assert_eq!(status, StatusCode::OK);
    }
    let reservations = server.url("/v1/quotas/metered:a/reservations");
    let (status, _) = send(http.post(reservations).json(&json!({"amount": 4}))).await;
    assert_eq!(status, StatusCode::CREATED);
    let metrics = get_text(&http, server.url("/metrics")).await;
    for line in [
        "inflight_quota_balance{class=\"metered:*\"} 11",
        "inflight_quota_reserved{class=\"metered:*\"} 4",
        "inflight_quota_balance{class=\"default\"} 7",
    ] {
        assert!(
            metrics.lines().any(|l| l == line),
            "no {line} in\n{metrics}"
        );
    }
    // Off by default.
    assert!(!Settings::from_flags(["inflight"]).unwrap().metrics_balances);
}
