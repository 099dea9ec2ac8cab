//! The routes outside /v1: health, readiness, metrics and the OpenAPI document; and the answers to
//! unknown routes, to methods a route does not take, and past the connection cap.

use std::sync::Arc;

use axum::extract::State;
use axum::http::{header, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::Json;
use inflight::Store;

use crate::app::App;
use crate::error::ApiError;

const OPENAPI: &str = include_str!("../../openapi.json");

pub(super) async fn too_many_connections() -> ApiError {
    ApiError::new(
        StatusCode::SERVICE_UNAVAILABLE,
        "too_many_connections",
        "The server holds as many connections as it may (--max-connections): retry shortly.",
    )
}

pub(super) async fn healthz() -> Json<serde_json::Value> {
    Json(serde_json::json!({ "status": "ok" }))
}

pub(super) async fn readyz(State(app): State<Arc<App>>) -> Response {
    match app.limiter.store().maintain().await {
        Ok(()) => Json(serde_json::json!({ "status": "ready" })).into_response(),
        Err(_) => ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "store_unavailable",
            "The limiter's store is unreachable.",
        )
        .into_response(),
    }
}

pub(super) async fn metrics(State(app): State<Arc<App>>) -> Response {
    let text = app.metrics.scrape(&app.limiter, app.quota.stats()).await;
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], text).into_response()
}

pub(super) async fn openapi() -> Response {
    ([(header::CONTENT_TYPE, "application/json")], OPENAPI).into_response()
}

/// Unknown routes; a key route with an empty key is a bad key rather than an unknown route.
/// `GET /`, the first thing a newcomer's browser asks for: a short index of what answers here. Its links
/// are relative, so that they hold under `/_inflight/` too.
pub(super) async fn index() -> Response {
    const INDEX: &str = "<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
        <title>inflight</title></head><body><h1>inflight</h1><ul>\
        <li><a href=\"status\">status</a>: the busy keys, live</li>\
        <li><a href=\"metrics\">metrics</a>: Prometheus</li>\
        <li><a href=\"openapi.json\">openapi.json</a>: the HTTP API</li>\
        <li><a href=\"healthz\">healthz</a>, <a href=\"readyz\">readyz</a>: health and readiness</li>\
        </ul></body></html>\n";
    ([(header::CONTENT_TYPE, "text/html; charset=utf-8")], INDEX).into_response()
}

pub(super) async fn not_found(uri: Uri) -> ApiError {
    let path = uri.path();
    if path == "/v1/keys/" || path.starts_with("/v1/keys//") {
        return ApiError::invalid_key("Keys may not be empty.");
    }
    ApiError::not_found()
}

pub(super) async fn method_not_allowed() -> ApiError {
    ApiError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        "method_not_allowed",
        "This route does not take that method.",
    )
}
