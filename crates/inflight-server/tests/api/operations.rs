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
        "/v1/keys/{key}/waiters/{ticket}",
    ] {
        assert!(openapi["paths"][path].is_object(), "{path} documented");
    }
}

/// The holders' routes as documented: the listing and its page, `?revoke=true`, the waiters' route,
/// the admin token they need, `holder` in both acquire bodies, and their error codes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_openapi_document_has_the_holder_routes() {
    let server = start_api(&limits(1, 0), common::Memory::stores(&None)).await;
    let openapi: Value = get_json(&Client::new(), server.url("/openapi.json")).await;
    let (paths, schemas) = (&openapi["paths"], &openapi["components"]["schemas"]);
    let admin = serde_json::json!([{"admin": []}]);
    let list = &paths["/v1/keys/{key}/permits"]["get"];
    let revoke_waiter = &paths["/v1/keys/{key}/waiters/{ticket}"]["delete"];
    for operation in [list, revoke_waiter] {
        assert_eq!(operation["security"], admin);
        assert!(operation["responses"]["401"].is_object());
    }
    assert_eq!(
        list["responses"]["200"]["content"]["application/json"]["schema"]["$ref"],
        "#/components/schemas/PermitPage"
    );
    assert!(list["responses"]["429"].is_object(), "too_many_listings");
    for field in ["key", "holders", "waiters", "unlisted", "cursor"] {
        assert!(
            schemas["PermitPage"]["properties"][field].is_object(),
            "{field}"
        );
    }
    let release = &paths["/v1/keys/{key}/permits/{id}"]["delete"];
    let parameters = release["parameters"].as_array().unwrap();
    assert!(parameters.iter().any(|p| p["name"] == "revoke"));
    assert!(release["responses"]["404"]["description"]
        .as_str()
        .unwrap()
        .starts_with("holder_not_found"));
    assert!(revoke_waiter["responses"]["404"]["description"]
        .as_str()
        .unwrap()
        .starts_with("waiter_not_found"));
    for (path, body) in [
        ("/v1/keys/{key}/permits", "AcquireRequest"),
        ("/v1/permits", "AcquireAllRequest"),
    ] {
        assert_eq!(schemas[body]["properties"]["holder"]["maxLength"], 128);
        let conflict = paths[path]["post"]["responses"]["409"]["description"].as_str();
        assert!(
            conflict.unwrap().contains("revoked:"),
            "{path}: 409 revoked"
        );
    }
    let codes = schemas["Error"]["properties"]["code"]["enum"]
        .as_array()
        .unwrap();
    for code in ["holder_not_found", "waiter_not_found", "revoked"] {
        assert!(codes.contains(&Value::from(code)), "{code}");
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
