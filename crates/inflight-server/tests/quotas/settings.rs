//! The quota routes in the OpenAPI document, and the quota settings read and checked.

use inflight_server::Settings;
use reqwest::Client;

use crate::common;
use crate::common::{get_json, limits, start_api, Make};

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
    let once = &openapi["components"]["parameters"]["IdempotencyKey"];
    assert_eq!(once["name"], "Idempotency-Key");
    let reference = serde_json::json!({"$ref": "#/components/parameters/IdempotencyKey"});
    for (path, method) in [
        ("/v1/quotas/{key}", "put"),
        ("/v1/quotas/{key}/top-up", "post"),
    ] {
        let operation = &openapi["paths"][path][method];
        let parameters = operation["parameters"].as_array().unwrap();
        assert!(parameters.contains(&reference), "{path} takes one");
        assert!(operation["responses"]["422"].is_object(), "{path}: 422");
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
