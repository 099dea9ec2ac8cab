//! A key: `GET /v1/keys/{key}` (its limit, what it has in flight) and its override, `PUT|DELETE
//! /v1/keys/{key}/limit`.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::{BytesRejection, PathRejection};
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::Json;
use serde::{Deserialize, Serialize};

use super::input::checked_key;
use crate::app::App;
use crate::error::ApiError;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct LimitBody {
    limit: u32,
}

/// A key, as `GET /v1/keys/{key}` and the limit routes answer it.
#[derive(Debug, Serialize)]
pub(super) struct KeyJson {
    pub(super) key: String,
    pub(super) limit: Option<u32>,
    pub(super) in_flight: u32,
}

fn key_json(key: String, status: inflight::KeyStatus) -> Json<KeyJson> {
    Json(KeyJson {
        key,
        limit: status.limit.get(),
        in_flight: status.in_flight,
    })
}

pub(super) async fn status(
    State(app): State<Arc<App>>,
    path: Result<Path<String>, PathRejection>,
) -> Result<Json<KeyJson>, ApiError> {
    let key = checked_key(path)?;
    let status = app.timed("status", app.limiter.status(&key)).await?;
    Ok(key_json(key, status))
}

pub(super) async fn set_limit(
    State(app): State<Arc<App>>,
    headers: HeaderMap,
    path: Result<Path<String>, PathRejection>,
    bytes: Result<Bytes, BytesRejection>,
) -> Result<Json<KeyJson>, ApiError> {
    app.tokens.require_admin(&headers)?;
    let key = checked_key(path)?;
    let bytes = bytes.map_err(|e| ApiError::unreadable_body(&e))?;
    let request: LimitBody = serde_json::from_slice(&bytes).map_err(|e| {
        ApiError::invalid_request(format!(
            "Expected {{\"limit\": N}} with 0 <= N <= {}: {e}",
            u32::MAX
        ))
    })?;
    // Clearing (0) is always allowed, so that overrides set before the setting can go.
    if request.limit > 0
        && app.overrides_for_classes_only
        && app.limiter.policy().rule_for(&key).is_none()
    {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            "override_not_allowed",
            "This key matches no --limit class, and overrides are allowed on those only \
             (--overrides-for-classes-only).",
        ));
    }
    let status = app
        .timed("set_limit", app.limiter.set_limit(&key, request.limit))
        .await?;
    Ok(key_json(key, status))
}

pub(super) async fn clear_limit(
    State(app): State<Arc<App>>,
    headers: HeaderMap,
    path: Result<Path<String>, PathRejection>,
) -> Result<Json<KeyJson>, ApiError> {
    app.tokens.require_admin(&headers)?;
    let key = checked_key(path)?;
    let status = app
        .timed("set_limit", app.limiter.clear_limit(&key))
        .await?;
    Ok(key_json(key, status))
}
