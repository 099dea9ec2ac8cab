//! A key's holders and waiters (`GET /v1/keys/{key}/permits?cursor=`), and revoking one (`DELETE
//! /v1/keys/{key}/permits/{id}?revoke=true`, `DELETE /v1/keys/{key}/waiters/{ticket}`): an admin's
//! routes when an admin token is set, since a holder's id and token are enough to release its permit.

use std::sync::Arc;

use axum::extract::rejection::PathRejection;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::Json;
use inflight::store::{Holder, PermitPage, Waiter};
use inflight::{PermitId, StoreError};
use serde::Serialize;

use super::input::{check_name, checked_key, checked_key_and_id, query};
use crate::app::App;
use crate::error::ApiError;

/// One page of a key's holders and waiters.
#[derive(Debug, Serialize)]
struct PermitsJson {
    key: String,
    holders: Vec<HolderJson>,
    waiters: Vec<WaiterJson>,
    /// Slots held by permits of this server's own in-process store, which have no lease to list.
    #[serde(skip_serializing_if = "is_zero")]
    unlisted: u32,
    /// Where the next page starts (`?cursor=`); `null` on the last page.
    cursor: Option<String>,
}

#[derive(Debug, Serialize)]
struct HolderJson {
    id: String,
    token: u64,
    weight: u32,
    admitted_at_ms: u64,
    lease_expires_at_ms: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    holder: Option<String>,
}

#[derive(Debug, Serialize)]
struct WaiterJson {
    ticket: String,
    priority: u8,
    /// `null`: the flow of waiters that name none.
    flow: Option<String>,
    weight: u32,
    waiting_since_ms: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    holder: Option<String>,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

impl PermitsJson {
    fn new(key: String, page: PermitPage) -> Self {
        let holder = |h: Holder| HolderJson {
            id: h.id.to_string(),
            token: h.token,
            weight: h.weight,
            admitted_at_ms: h.admitted_at_ms,
            lease_expires_at_ms: h.lease_expires_at_ms,
            holder: h.holder.map(|label| label.to_string()),
        };
        let waiter = |w: Waiter| WaiterJson {
            ticket: w.ticket.to_string(),
            priority: w.priority,
            flow: Some(w.flow.to_string()).filter(|flow| !flow.is_empty()),
            weight: w.weight,
            waiting_since_ms: w.waiting_since_ms,
            holder: w.holder.map(|label| label.to_string()),
        };
        Self {
            key,
            holders: page.holders.into_iter().map(holder).collect(),
            waiters: page.waiters.into_iter().map(waiter).collect(),
            unlisted: page.unlisted,
            cursor: page.cursor,
        }
    }
}

/// `GET /v1/keys/{key}/permits`: one page, under a place of the process's cap on listings.
pub(super) async fn list(
    State(app): State<Arc<App>>,
    path: Result<Path<String>, PathRejection>,
    headers: HeaderMap,
    uri: Uri,
) -> Result<Response, ApiError> {
    app.tokens
        .require_admin_to(&headers, "Listing a key's holders")?;
    let key = checked_key(path)?;
    let mut cursor = None;
    for (name, value) in query(&uri)? {
        match name.as_str() {
            "cursor" if value.len() <= 600 && !value.chars().any(char::is_control) => {
                cursor = Some(value)
            }
            "cursor" => return Err(ApiError::invalid_request("Not a cursor of this listing.")),
            other => {
                return Err(ApiError::invalid_request(format!(
                    "Unknown query parameter {other:?}: this route takes cursor."
                )))
            }
        }
    }
    let place = app
        .listings
        .try_enter()
        .ok_or_else(|| ApiError::too_many_listings(app.listings.max()))?;
    let listed = app.limiter.permits(&key, cursor.as_deref());
    let page = app
        .timed("permits", listed)
        .await
        .map_err(|error| match error {
            // A cursor the store did not write (another store's, or made up): the caller's mistake.
            StoreError::Rejected(_) if cursor.is_some() => {
                ApiError::invalid_request("Not a cursor of this listing.")
            }
            error => error.into(),
        })?;
    let answer = Json(PermitsJson::new(key, page)).into_response();
    drop(place);
    Ok(answer)
}

/// Revokes a holder's lease (from [`super::permits::release`]): 204 when it was held, 404 when not.
pub(super) async fn revoke(
    app: &App,
    headers: &HeaderMap,
    key: &str,
    id: &PermitId,
) -> Result<StatusCode, ApiError> {
    app.tokens.require_admin_to(headers, "Revoking a holder")?;
    let revoked = app.timed("revoke", app.limiter.revoke(key, id)).await?;
    if !revoked {
        return Err(not_found(
            "holder_not_found",
            "No such holder on this key: it was released, or its lease ended.",
        ));
    }
    app.metrics.returned(key, &id.to_string());
    app.metrics
        .revoked(app.limiter.policy().class_of(key), "holder");
    tracing::info!(key, id = %id, "holder revoked");
    Ok(StatusCode::NO_CONTENT)
}

/// `DELETE /v1/keys/{key}/waiters/{ticket}`: 204 when the ticket was in the queue, 404 when not.
pub(super) async fn revoke_waiter(
    State(app): State<Arc<App>>,
    path: Result<Path<(String, String)>, PathRejection>,
    headers: HeaderMap,
) -> Result<StatusCode, ApiError> {
    app.tokens.require_admin_to(&headers, "Revoking a waiter")?;
    let (key, ticket) = checked_key_and_id(path)?;
    check_name(&ticket).map_err(ApiError::invalid_request)?;
    let revoked = app.limiter.revoke_waiter(&key, &ticket);
    if !app.timed("revoke", revoked).await? {
        return Err(not_found(
            "waiter_not_found",
            "No such waiter on this key: it was admitted, or it gave up.",
        ));
    }
    app.metrics
        .revoked(app.limiter.policy().class_of(&key), "waiter");
    tracing::info!(key, ticket, "waiter revoked");
    Ok(StatusCode::NO_CONTENT)
}

fn not_found(code: &'static str, why: &str) -> ApiError {
    ApiError::new(StatusCode::NOT_FOUND, code, why)
}
