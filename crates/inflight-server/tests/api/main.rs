//! The HTTP limiter API against a real HTTP client, on the memory and the Redis store: every row of the
//! API table and every error code.
//!
//! By theme: permits (permits.rs), fencing tokens (fencing.rs), limits and the admin token (limits.rs),
//! a key's holders and waiters listed and revoked (holders.rs), errors (errors.rs), and
//! health, readiness, metrics and the OpenAPI document (operations.rs).
#![allow(missing_docs)]

#[path = "../common/mod.rs"]
mod common;
mod errors;
mod fencing;
mod holders;
mod limits;
mod operations;
mod permits;

use reqwest::StatusCode;
use serde_json::Value;

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
