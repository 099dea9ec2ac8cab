//! Quotas over HTTP: balances (`PUT|GET /v1/quotas/{key}`, `POST .../top-up`) and reservations held by
//! remote callers (`POST .../reservations`, `PUT .../reservations/{id}` to extend, `POST
//! .../reservations/{id}/commit`, `DELETE .../reservations/{id}` to refund); and the `"quota"` of an
//! acquire body.
//!
//! A funding applies once per `Idempotency-Key` header (per key, for a day): the same request again
//! is answered as the first time, with `Idempotent-Replayed: true`, and another request under it is
//! 422. Without the header, each request has a key of its own: the store's re-sends apply once, a
//! client's retries do not.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::{BytesRejection, PathRejection};
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::routing::{post, put};
use axum::{Json, Router};
use inflight::quota::{
    Balance, DetachedReservation, Extension, Fund, Funding, IdempotencyKey, Settle, Settlement,
    MAX_RESERVATION_TTL,
};
use inflight::PermitId;
use serde::{Deserialize, Serialize};

use super::input::{body, check_name, checked_key, checked_key_and_id, idempotency_key, millis};
use crate::app::{quota_error, App, Charge};
use crate::error::ApiError;

pub(super) fn routes() -> Router<Arc<App>> {
    Router::new()
        .route("/v1/quotas/{key}", put(set_balance).get(balance))
        .route("/v1/quotas/{key}/top-up", post(top_up))
        .route("/v1/quotas/{key}/reservations", post(reserve))
        .route(
            "/v1/quotas/{key}/reservations/{id}",
            put(extend).delete(settle::<false>),
        )
        .route(
            "/v1/quotas/{key}/reservations/{id}/commit",
            post(settle::<true>),
        )
}

/// `"quota": {"key", "amount"}` in an acquire body.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct QuotaBody {
    key: String,
    #[serde(default = "one")]
    amount: u64,
}

fn one() -> u64 {
    1
}

/// The charge an acquire body asks for, checked.
pub(super) fn charge(quota: Option<QuotaBody>) -> Result<Option<Charge>, ApiError> {
    let Some(QuotaBody { key, amount }) = quota else {
        return Ok(None);
    };
    check_name(&key).map_err(ApiError::invalid_key)?;
    if amount == 0 {
        return Err(ApiError::invalid_request(
            "quota.amount must be at least 1.",
        ));
    }
    Ok(Some(Charge { key, amount }))
}

/// A permit's release query, `?outcome=success|failure&token=N` (both optional): how its reservation
/// settles (refunded by default), and the token of the admission released (0 when not given).
pub(super) fn release_query(uri: &Uri) -> Result<(Settle, u64), ApiError> {
    let query = uri.query().unwrap_or_default();
    let (mut settle, mut token) = (Settle::Refund, 0);
    for pair in query.split('&').filter(|pair| !pair.is_empty()) {
        match pair.split_once('=') {
            Some(("outcome", "success")) => settle = Settle::Commit,
            Some(("outcome", "failure")) => settle = Settle::Refund,
            Some(("token", n)) => {
                token = n.parse().map_err(|_| {
                    ApiError::invalid_request(
                        "token must be a whole number (the admission's token).",
                    )
                })?;
            }
            _ => {
                return Err(ApiError::invalid_request(
                    "The query may name ?outcome=success or ?outcome=failure, and &token=N.",
                ))
            }
        }
    }
    Ok((settle, token))
}

/// A key's balance, as the balance and settlement routes answer it (`balance: null`: unmetered).
#[derive(Debug, Serialize)]
struct QuotaJson {
    key: String,
    balance: Option<u64>,
    reserved: u64,
}

fn quota_json(key: String, balance: Option<Balance>) -> Json<QuotaJson> {
    Json(QuotaJson {
        key,
        balance: balance.map(|b| b.balance),
        reserved: balance.map_or(0, |b| b.reserved),
    })
}

/// A reservation, as `POST .../reservations` and an acquire body's 201 carry it (nulls: unmetered).
#[derive(Debug, Serialize)]
pub(super) struct ReservationJson {
    id: String,
    key: String,
    amount: u64,
    balance: Option<u64>,
    expires_at_ms: Option<u64>,
}

pub(super) fn reservation_json(reservation: &DetachedReservation) -> ReservationJson {
    ReservationJson {
        id: reservation.id.to_string(),
        key: reservation.key.to_string(),
        amount: reservation.amount,
        balance: reservation.balance.map(|b| b.balance),
        expires_at_ms: (reservation.expires_at_ms > 0).then_some(reservation.expires_at_ms),
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct BalanceBody {
    balance: u64,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct TopUpBody {
    amount: u64,
}

/// A reservation extended, as `PUT .../reservations/{id}` answers it (nulls: the key is unmetered).
#[derive(Debug, Serialize)]
struct ExtendedJson {
    id: String,
    #[serde(flatten)]
    quota: QuotaJson,
    expires_at_ms: Option<u64>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct ExtendBody {
    ttl_ms: Option<u64>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ReserveBody {
    #[serde(default = "one")]
    amount: u64,
    ttl_ms: Option<u64>,
}

impl Default for ReserveBody {
    fn default() -> Self {
        Self {
            amount: 1,
            ttl_ms: None,
        }
    }
}

fn required<T: serde::de::DeserializeOwned>(
    bytes: Result<Bytes, BytesRejection>,
    shape: &str,
) -> Result<T, ApiError> {
    let bytes = bytes.map_err(|e| ApiError::unreadable_body(&e))?;
    serde_json::from_slice(&bytes)
        .map_err(|e| ApiError::invalid_request(format!("Expected {shape}: {e}")))
}

/// Funds `key` once per the request's `Idempotency-Key` (none: a key of this request's own).
async fn fund(
    app: &App,
    headers: &HeaderMap,
    key: String,
    fund: Fund,
) -> Result<Response, ApiError> {
    let once = idempotency_key(headers)?.unwrap_or_else(IdempotencyKey::generate);
    let funded = app
        .timed("quota", app.quota.fund_with(&key, fund, &once))
        .await;
    match funded.map_err(|error| quota_error(&key, error))? {
        Funding::Applied(balance) => Ok(quota_json(key, Some(balance)).into_response()),
        Funding::Repeated(balance) => {
            let replayed = [("idempotent-replayed", "true")];
            Ok((replayed, quota_json(key, Some(balance))).into_response())
        }
        Funding::KeyReused => Err(ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "idempotency_key_reused",
            "This Idempotency-Key was used for another request on this key: use a new one.",
        )
        .naming(key)),
    }
}

async fn set_balance(
    State(app): State<Arc<App>>,
    headers: HeaderMap,
    path: Result<Path<String>, PathRejection>,
    bytes: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    app.tokens.require_admin(&headers)?;
    let key = checked_key(path)?;
    let request: BalanceBody = required(bytes, "{\"balance\": N} with N >= 0")?;
    fund(&app, &headers, key, Fund::Set(request.balance)).await
}

async fn top_up(
    State(app): State<Arc<App>>,
    headers: HeaderMap,
    path: Result<Path<String>, PathRejection>,
    bytes: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    app.tokens.require_admin(&headers)?;
    let key = checked_key(path)?;
    let request: TopUpBody = required(bytes, "{\"amount\": N} with N >= 1")?;
    fund(&app, &headers, key, Fund::Add(request.amount)).await
}

async fn balance(
    State(app): State<Arc<App>>,
    path: Result<Path<String>, PathRejection>,
) -> Result<Json<QuotaJson>, ApiError> {
    let key = checked_key(path)?;
    let balance = app.timed("quota", app.quota.balance(&key)).await?;
    Ok(quota_json(key, balance))
}

async fn reserve(
    State(app): State<Arc<App>>,
    path: Result<Path<String>, PathRejection>,
    bytes: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let key = checked_key(path)?;
    let request: ReserveBody = body(bytes)?;
    let ttl = millis("ttl_ms", request.ttl_ms, MAX_RESERVATION_TTL)?;
    let reserved = app.quota.reserve_with(&key, request.amount, None, ttl);
    let reservation = app
        .timed("quota", reserved)
        .await
        .map_err(|error| quota_error(&key, error))?;
    let body = reservation_json(&reservation.detach());
    Ok((StatusCode::CREATED, Json(body)).into_response())
}

/// Moves an open reservation's deadline to its ttl (`ttl_ms`, default the quota's) from now.
async fn extend(
    State(app): State<Arc<App>>,
    path: Result<Path<(String, String)>, PathRejection>,
    bytes: Result<Bytes, BytesRejection>,
) -> Result<Json<ExtendedJson>, ApiError> {
    let (key, id) = checked_key_and_id(path)?;
    let request: ExtendBody = body(bytes)?;
    let permit_id = PermitId::from(id.as_str());
    let extended = app.quota.extend(
        &key,
        &permit_id,
        millis("ttl_ms", request.ttl_ms, MAX_RESERVATION_TTL)?,
    );
    let extension = app
        .timed("quota", extended)
        .await
        .map_err(|error| quota_error(&key, error))?;
    let answer = |balance: Option<Balance>, expires_at_ms| {
        let Json(quota) = quota_json(key, balance);
        Json(ExtendedJson {
            id,
            quota,
            expires_at_ms,
        })
    };
    match extension {
        Extension::Extended {
            expires_at_ms,
            balance,
        } => Ok(answer(Some(balance), Some(expires_at_ms))),
        // An unmetered key holds nothing: nothing to extend, nothing missing.
        Extension::NotOpen(None) => Ok(answer(None, None)),
        Extension::NotOpen(Some(_)) => Err(reservation_not_found()),
    }
}

fn reservation_not_found() -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        "reservation_not_found",
        "No such open reservation: it expired (and was refunded), or was settled the other way.",
    )
}

/// A reservation committed (`POST .../commit`, `COMMIT`) or refunded (`DELETE`).
async fn settle<const COMMIT: bool>(
    State(app): State<Arc<App>>,
    path: Result<Path<(String, String)>, PathRejection>,
) -> Result<Json<QuotaJson>, ApiError> {
    let (key, id) = checked_key_and_id(path)?;
    let settle = if COMMIT {
        Settle::Commit
    } else {
        Settle::Refund
    };
    match app.settle(&key, &PermitId::from(id), settle).await? {
        Settlement::Settled(balance) | Settlement::Already(balance) => {
            Ok(quota_json(key, Some(balance)))
        }
        // An unmetered key holds nothing: nothing to settle, nothing missing.
        Settlement::NotFound(None) => Ok(quota_json(key, None)),
        Settlement::NotFound(Some(_)) => Err(reservation_not_found()),
    }
}
