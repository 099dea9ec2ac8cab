//! Quotas over HTTP against a real client, on the memory and the Redis store: balances and reservations
//! held by remote callers (quota_permits.rs: charges taken with permits).
//!
//! By theme: balances (balances.rs), fundings that apply once per `Idempotency-Key` (idempotency.rs),
//! reservations (reservations.rs), and the quota routes in the OpenAPI document and the quota settings
//! (settings.rs).
#![allow(missing_docs)]

mod balances;
#[path = "../common/mod.rs"]
mod common;
mod idempotency;
mod reservations;
mod settings;

use reqwest::{Client, StatusCode};
use serde_json::Value;

use common::get_json;

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
