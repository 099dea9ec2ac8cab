//! What operators read: health, readiness, metrics (per key when asked for) and the OpenAPI
//! document.

use inflight_server::Settings;
use reqwest::Client;
use serde_json::Value;

use crate::common;
use crate::common::{get_json, get_text, limits, start_api, status_of, Make};
use crate::per_store;

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

per_store!(health_readiness_metrics_and_openapi,);

/// `GET /`, what a browser asks first, is an index whose every link answers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_root_is_an_index_of_what_answers_here() {
    let server = start_api(&limits(1, 0), common::Memory::stores(&None)).await;
    let http = Client::new();
    let index = http.get(server.url("/")).send().await.unwrap();
    assert_eq!(index.status(), 200);
    assert!(index.headers()["content-type"]
        .to_str()
        .unwrap()
        .starts_with("text/html"));
    let page = index.text().await.unwrap();
    let links: Vec<&str> = page
        .split("href=\"")
        .skip(1)
        .filter_map(|rest| rest.split('"').next())
        .collect();
    assert_eq!(
        links,
        ["status", "metrics", "openapi.json", "healthz", "readyz"]
    );
    for link in links {
        let status = status_of(http.get(server.url(&format!("/{link}")))).await;
        assert_eq!(status, 200, "{link}");
    }
}
