//! Balances set, topped up and read, and exported per class on request.

use inflight_server::Settings;
use reqwest::{Client, StatusCode};
use serde_json::{json, Value};

use crate::common;
use crate::common::{get_text, limits, start_api, Make};
use crate::per_store;
use crate::{code, figures, send};

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

per_store!(balances_are_set_topped_up_and_read,);
