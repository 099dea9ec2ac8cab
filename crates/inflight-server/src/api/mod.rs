//! The HTTP limiter API, for workers in any language. The interface is a contract: see `openapi.json`.

use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::rejection::{BytesRejection, PathRejection};
use axum::extract::{Path, State};
use axum::http::{header, HeaderMap, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post, put};
use axum::{Json, Router};
use inflight::{AcquireOptions, Lease, Limit, PermitId, Renewal, Store};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::app::{check_name, App};
use crate::config::MAX_LEASE;
use crate::error::ApiError;

mod keys;

pub use keys::{query, BusyJson, DEFAULT_LIMIT};
mod permits;
mod quotas;

/// The OpenAPI document of this API.
pub const OPENAPI: &str = include_str!("../../openapi.json");

/// The API's routes over `app`.
pub fn router(app: Arc<App>) -> Router {
    let v1 = Router::new()
        .route("/v1/keys/{key}/permits", post(acquire))
        .route("/v1/keys/{key}/permits/{id}", put(renew).delete(release))
        .route("/v1/permits", post(permits::acquire_all))
        .route(
            "/v1/permits/{id}",
            put(permits::renew_recorded).delete(permits::release_recorded),
        )
        .route("/v1/keys", get(keys::list))
        .route("/v1/keys/{key}", get(status))
        .route("/v1/keys/{key}/limit", put(set_limit).delete(clear_limit))
        .merge(quotas::routes())
        .route_layer(axum::middleware::from_fn_with_state(
            app.clone(),
            require_api_user,
        ));
    Router::new()
        .merge(v1)
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .route("/openapi.json", get(openapi))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .with_state(app)
}

/// What a connection past `serve`'s connection cap is answered (see `--max-connections`): health,
/// readiness and metrics; anything else `503 too_many_connections`.
pub fn health_router(app: Arc<App>) -> Router {
    Router::new()
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .fallback(too_many_connections)
        .with_state(app)
}

async fn too_many_connections() -> ApiError {
    ApiError::new(
        StatusCode::SERVICE_UNAVAILABLE,
        "too_many_connections",
        "The server holds as many connections as it may (--max-connections): retry shortly.",
    )
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct AcquireBody {
    id: Option<String>,
    weight: Option<u32>,
    lease_ms: Option<u64>,
    wait_ms: Option<u64>,
    quota: Option<quotas::QuotaBody>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RenewBody {
    lease_ms: Option<u64>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct LimitBody {
    limit: u32,
}

/// A permit, as `POST .../permits` and `PUT .../permits/{id}` answer it.
#[derive(Debug, Serialize)]
struct PermitJson {
    id: String,
    key: String,
    weight: u32,
    limit: Option<u32>,
    in_flight: u32,
    lease_expires_at_ms: Option<u64>,
    /// Its reservation, when the acquire body charged a quota.
    #[serde(skip_serializing_if = "Option::is_none")]
    reservation: Option<quotas::ReservationJson>,
}

/// A key, as `GET /v1/keys/{key}` and the limit routes answer it.
#[derive(Debug, Serialize)]
struct KeyJson {
    key: String,
    limit: Option<u32>,
    in_flight: u32,
}

/// A key from the path: non-empty, at most 256 bytes, no control characters.
fn checked_key(path: Result<Path<String>, PathRejection>) -> Result<String, ApiError> {
    let Path(key) = path.map_err(|_| ApiError::invalid_key("The key is not valid UTF-8."))?;
    check_name(&key).map_err(ApiError::invalid_key)?;
    Ok(key)
}

/// The key and the id of a `.../{key}/.../{id}` path, checked.
fn checked_key_and_id(
    path: Result<Path<(String, String)>, PathRejection>,
) -> Result<(String, String), ApiError> {
    let Path((key, id)) =
        path.map_err(|_| ApiError::invalid_key("The key or id is not valid UTF-8."))?;
    check_name(&key).map_err(ApiError::invalid_key)?;
    check_name(&id).map_err(ApiError::invalid_request)?;
    Ok((key, id))
}

/// A JSON body; an empty body is the defaults.
fn body<T: DeserializeOwned + Default>(
    bytes: Result<Bytes, BytesRejection>,
) -> Result<T, ApiError> {
    let bytes = bytes.map_err(|e| ApiError::unreadable_body(&e))?;
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Ok(T::default());
    }
    serde_json::from_slice(&bytes)
        .map_err(|e| ApiError::invalid_request(format!("Malformed JSON body: {e}")))
}

fn lease(lease_ms: Option<u64>) -> Result<Option<Duration>, ApiError> {
    match lease_ms {
        None => Ok(None),
        Some(ms) if ms == 0 || Duration::from_millis(ms) > MAX_LEASE => Err(
            ApiError::invalid_request("lease_ms must be between 1 and 86400000."),
        ),
        Some(ms) => Ok(Some(Duration::from_millis(ms))),
    }
}

/// The longest an acquire body may ask to wait for a slot (`wait_ms`), as `--max-wait` at most.
pub const MAX_WAIT: Duration = Duration::from_secs(300);

/// How long an acquire may wait (`wait_ms`; none: not at all).
fn wait(wait_ms: Option<u64>) -> Result<Duration, ApiError> {
    let wait = Duration::from_millis(wait_ms.unwrap_or(0));
    if wait > MAX_WAIT {
        return Err(ApiError::invalid_request(
            "wait_ms must be between 0 and 300000.",
        ));
    }
    Ok(wait)
}

fn permit_json(lease: Lease) -> PermitJson {
    PermitJson {
        id: lease.id.to_string(),
        key: lease.key.to_string(),
        weight: lease.weight,
        limit: lease.limit.get(),
        in_flight: lease.in_flight,
        lease_expires_at_ms: (lease.expires_at_ms > 0).then_some(lease.expires_at_ms),
        reservation: None,
    }
}

async fn acquire(
    State(app): State<Arc<App>>,
    path: Result<Path<String>, PathRejection>,
    bytes: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let key = checked_key(path)?;
    let mut request: AcquireBody = body(bytes)?;
    let Some(charge) = quotas::charge(request.quota.take())? else {
        let options = options(request.id, request.weight, request.lease_ms)?;
        let permit = app.acquire(&key, options, wait(request.wait_ms)?).await?;
        // The caller holds the lease from here: it renews or releases it over HTTP.
        return Ok((StatusCode::CREATED, Json(permit_json(app.lend(permit)))).into_response());
    };
    quotas::acquire_charged(&app, key, request, charge).await
}

/// The options of an acquire body.
fn options(
    id: Option<String>,
    weight: Option<u32>,
    lease_ms: Option<u64>,
) -> Result<AcquireOptions, ApiError> {
    let mut options = AcquireOptions::new();
    if let Some(id) = id {
        check_name(&id).map_err(ApiError::invalid_request)?;
        options = options.id(id);
    }
    if let Some(weight) = weight {
        if weight == 0 {
            return Err(ApiError::invalid_request("weight must be at least 1."));
        }
        options = options.weight(weight);
    }
    if let Some(lease) = lease(lease_ms)? {
        options = options.lease(lease);
    }
    Ok(options)
}

fn permit_not_found() -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        "permit_not_found",
        "No such permit: it was released, or its lease ended. Acquire a new one.",
    )
}

async fn renew(
    State(app): State<Arc<App>>,
    path: Result<Path<(String, String)>, PathRejection>,
    bytes: Result<Bytes, BytesRejection>,
) -> Result<Json<PermitJson>, ApiError> {
    let (key, id) = checked_key_and_id(path)?;
    let request: RenewBody = body(bytes)?;
    let lease = lease(request.lease_ms)?;
    let id = PermitId::from(id);
    match app.renew(&key, &id, lease).await? {
        Renewal::Renewed(grant) | Renewal::Readded(grant) => Ok(Json(PermitJson {
            id: id.to_string(),
            key,
            weight: grant.weight,
            limit: grant.limit.get(),
            in_flight: grant.in_flight,
            lease_expires_at_ms: Some(grant.expires_at_ms),
            reservation: None,
        })),
        Renewal::Lost => {
            // An unlimited key's permits are never recorded: there is nothing to renew, and nothing lost.
            let status = app.timed("status", app.limiter.status(&key)).await?;
            if status.limit == Limit::Unlimited {
                return Ok(Json(PermitJson {
                    id: id.to_string(),
                    key,
                    weight: 1,
                    limit: None,
                    in_flight: status.in_flight,
                    lease_expires_at_ms: None,
                    reservation: None,
                }));
            }
            Err(permit_not_found())
        }
    }
}

async fn release(
    State(app): State<Arc<App>>,
    path: Result<Path<(String, String)>, PathRejection>,
    uri: Uri,
) -> Result<StatusCode, ApiError> {
    let (key, id) = checked_key_and_id(path)?;
    let settle = quotas::outcome(&uri)?;
    let id = PermitId::from(id);
    app.release_settled(&key, &id, settle).await?;
    Ok(StatusCode::NO_CONTENT)
}

fn key_json(key: String, status: inflight::KeyStatus) -> Json<KeyJson> {
    Json(KeyJson {
        key,
        limit: status.limit.get(),
        in_flight: status.in_flight,
    })
}

async fn status(
    State(app): State<Arc<App>>,
    path: Result<Path<String>, PathRejection>,
) -> Result<Json<KeyJson>, ApiError> {
    let key = checked_key(path)?;
    let status = app.timed("status", app.limiter.status(&key)).await?;
    Ok(key_json(key, status))
}

/// Every /v1 route, when an API token is set: 401 without it (or the admin token).
async fn require_api_user(
    State(app): State<Arc<App>>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    if app.is_api_user(request.headers().get(header::AUTHORIZATION)) {
        return next.run(request).await;
    }
    ApiError::new(
        StatusCode::UNAUTHORIZED,
        "unauthorized",
        "This route needs the API token: Authorization: Bearer TOKEN.",
    )
    .into_response()
}

fn require_admin(app: &App, headers: &HeaderMap) -> Result<(), ApiError> {
    if app.is_admin(headers.get(header::AUTHORIZATION)) {
        Ok(())
    } else {
        Err(ApiError::new(
            StatusCode::UNAUTHORIZED,
            "unauthorized",
            "Changing limits needs the admin token: Authorization: Bearer TOKEN.",
        ))
    }
}

async fn set_limit(
    State(app): State<Arc<App>>,
    headers: HeaderMap,
    path: Result<Path<String>, PathRejection>,
    bytes: Result<Bytes, BytesRejection>,
) -> Result<Json<KeyJson>, ApiError> {
    require_admin(&app, &headers)?;
    let key = checked_key(path)?;
    let bytes = bytes.map_err(|e| ApiError::unreadable_body(&e))?;
    let request: LimitBody = serde_json::from_slice(&bytes).map_err(|e| {
        ApiError::invalid_request(format!("Expected {{\"limit\": N}} with N >= 0: {e}"))
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

async fn clear_limit(
    State(app): State<Arc<App>>,
    headers: HeaderMap,
    path: Result<Path<String>, PathRejection>,
) -> Result<Json<KeyJson>, ApiError> {
    require_admin(&app, &headers)?;
    let key = checked_key(path)?;
    let status = app
        .timed("set_limit", app.limiter.clear_limit(&key))
        .await?;
    Ok(key_json(key, status))
}

async fn healthz() -> Json<serde_json::Value> {
    Json(serde_json::json!({ "status": "ok" }))
}

async fn readyz(State(app): State<Arc<App>>) -> Response {
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

async fn metrics(State(app): State<Arc<App>>) -> Response {
    let text = crate::metrics::scrape(&app).await;
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], text).into_response()
}

async fn openapi() -> Response {
    ([(header::CONTENT_TYPE, "application/json")], OPENAPI).into_response()
}

/// Unknown routes; a key route with an empty key is a bad key rather than an unknown route.
async fn not_found(uri: Uri) -> ApiError {
    let path = uri.path();
    if path == "/v1/keys/" || path.starts_with("/v1/keys//") {
        return ApiError::invalid_key("Keys may not be empty.");
    }
    ApiError::not_found()
}

async fn method_not_allowed() -> ApiError {
    ApiError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        "method_not_allowed",
        "This route does not take that method.",
    )
}
