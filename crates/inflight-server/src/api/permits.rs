//! Permits: acquired on one key (`POST /v1/keys/{key}/permits`) or on several (`POST /v1/permits`);
//! renewed and released by one handler each, by their key and id (`PUT|DELETE .../permits/{id}`) or by
//! their id alone (`PUT|DELETE /v1/permits/{id}`).

use std::collections::HashSet;
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::{BytesRejection, PathRejection};
use axum::extract::{Path, State};
use axum::http::{HeaderMap, HeaderName, HeaderValue, StatusCode, Uri};
use axum::response::{AppendHeaders, IntoResponse, Response};
use axum::Json;
use inflight::store::{Grant, IndexOp};
use inflight::{Lease, Limit, Permit, PermitId, Renewal, Store, StoreError};
use inflight_tower::rejection::INFLIGHT_LIMIT;
use serde::{Deserialize, Serialize};

use super::input::{
    body, check_name, checked_key, holder, lease, options, queue, remote, wait, PermitPath,
};
use super::limits::KeyJson;
use super::quotas::{self, release_query, QuotaBody, ReservationJson};
use crate::app::App;
use crate::error::ApiError;

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct AcquireBody {
    id: Option<String>,
    weight: Option<u32>,
    lease_ms: Option<u64>,
    wait_ms: Option<u64>,
    /// While waiting: the priority level (higher first) and the flow (served in turn with others).
    priority: Option<u8>,
    flow: Option<String>,
    flow_weight: Option<u32>,
    quota: Option<QuotaBody>,
    /// A label listed with the permit (`GET /v1/keys/{key}/permits`).
    holder: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RenewBody {
    lease_ms: Option<u64>,
    /// The token of the admission renewed (absent: whichever lease the id holds).
    token: Option<u64>,
}

/// A permit, as `POST .../permits` and `PUT .../permits/{id}` answer it.
#[derive(Debug, Serialize)]
pub(super) struct PermitJson {
    id: String,
    key: String,
    weight: u32,
    limit: Option<u32>,
    in_flight: u32,
    lease_expires_at_ms: Option<u64>,
    /// The admission's fencing token (0: nothing held, an unlimited key).
    token: u64,
    /// Its reservation, when the acquire body charged a quota.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) reservation: Option<ReservationJson>,
}

pub(super) fn permit_json(lease: Lease) -> PermitJson {
    let held = Held::from(&lease);
    one_json(lease.id.to_string(), lease.key.to_string(), held)
}

fn one_json(id: String, key: String, held: Held) -> PermitJson {
    PermitJson {
        id,
        key,
        weight: held.weight,
        limit: held.first.0,
        in_flight: held.first.1,
        lease_expires_at_ms: held.lease_expires_at_ms,
        token: held.token,
        reservation: None,
    }
}

/// `POST /v1/keys/{key}/permits`; with a `"quota"`, reserved under the permit's id (so that its release
/// settles it) and refunded on a refusal before the answer.
pub(super) async fn acquire(
    State(app): State<Arc<App>>,
    path: Result<Path<String>, PathRejection>,
    bytes: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let key = checked_key(path)?;
    let request: AcquireBody = body(bytes)?;
    let charge = quotas::charge(request.quota)?;
    let id = request
        .id
        .or_else(|| charge.as_ref().map(|_| PermitId::generate().to_string()));
    let options = options(id.clone(), request.weight, request.lease_ms)?;
    let options = queue(
        holder(options, request.holder)?,
        (request.priority, request.flow, request.flow_weight),
        &app.priorities,
    )?;
    let reservation = app.reserve(charge.as_ref(), id.map(PermitId::from)).await?;
    let admission = app.acquire(&key, options, wait(request.wait_ms)?).await;
    let charged = app.charged(reservation, admission).await;
    let (permit, reservation) = charged.map_err(|error| app.refusal(&key, error))?;
    let queued = queued_header(&app, &permit);
    let mut json = None;
    if let (Some(reservation), Some(charge)) = (reservation, &charge) {
        if app.quota.settles_on_release(&reservation) {
            let lease = lease(request.lease_ms)?.unwrap_or(app.limiter.lease());
            let keys = [Arc::from(key.as_str())];
            let recorded = app
                .quota
                .record_lent(&keys, permit.id(), lease, &charge.key);
            app.timed("record", recorded).await?;
        }
        let handed = app.timed("quota", app.quota.hand_over(reservation)).await?;
        json = Some(quotas::reservation_json(&handed));
    }
    // The caller holds the lease from here: it renews or releases it over HTTP.
    let mut body = permit_json(app.lend(permit));
    body.reservation = json;
    Ok((StatusCode::CREATED, queued, Json(body)).into_response())
}

/// `Inflight-Limit` naming the key a permit queued on ([`App::queued_limit`]).
fn queued_header(app: &App, permit: &Permit) -> AppendHeaders<Option<(HeaderName, HeaderValue)>> {
    AppendHeaders(
        app.queued_limit(permit)
            .map(|value| (INFLIGHT_LIMIT, value)),
    )
}

/// `409 permit_id_in_use` when a given id names a recorded permit on other keys: admitting it on these
/// would take over the leases the two share, and its record (renewals and releases by id) would leave
/// the others held. The store checks again as it records (`StoreError::IdInUse`).
async fn id_free(app: &App, id: Option<&str>, keys: &[Arc<str>]) -> Result<(), ApiError> {
    let Some(id) = id.map(PermitId::from) else {
        return Ok(());
    };
    let recorded = app.limiter.store().index(&id, IndexOp::Get);
    match app.timed("record", recorded).await? {
        Some(recorded) if *recorded.keys != *keys => Err(StoreError::IdInUse.into()),
        _ => Ok(()),
    }
}

fn permit_not_found() -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        "permit_not_found",
        "No such permit: it was released, or its lease ended. Acquire a new one.",
    )
}

/// `PUT` of a lent permit: renewed, and answered as it was acquired (its key's figures, or its keys').
pub(super) async fn renew<P: PermitPath>(
    State(app): State<Arc<App>>,
    path: Result<Path<P>, PathRejection>,
    bytes: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let (id, key) = P::checked(path)?;
    let request: RenewBody = body(bytes)?;
    let length = lease(request.lease_ms)?;
    let remote = remote(id, key.as_deref(), request.token.unwrap_or(0));
    let (keys, held) = match app.renew(&remote, length).await? {
        Some((keys, Renewal::Renewed(grant) | Renewal::Readded(grant))) => {
            (keys, Held::from(grant))
        }
        // An unlimited key's permits are never recorded: there is nothing to renew, and nothing lost.
        Some((keys, Renewal::Lost)) if key.is_some() => {
            let status = app.timed("status", app.limiter.status(&keys[0])).await?;
            if status.limit != Limit::Unlimited {
                return Err(permit_not_found());
            }
            (keys, Held::new(1, status.limit, status.in_flight, 0, 0))
        }
        _ => return Err(permit_not_found()),
    };
    let id = remote.id.to_string();
    Ok(match key {
        Some(key) => Json(one_json(id, key, held)).into_response(),
        None => Json(permit_all_json(&app, id, &keys, held).await).into_response(),
    })
}

/// `DELETE` of a lent permit: released, and its reservation settled as `?outcome=` says; 204 also when
/// it was released already. With `?revoke=true` (an admin's, on a key's route), any holder's lease is
/// revoked instead ([`super::holders::revoke`]).
pub(super) async fn release<P: PermitPath>(
    State(app): State<Arc<App>>,
    path: Result<Path<P>, PathRejection>,
    headers: HeaderMap,
    uri: Uri,
) -> Result<StatusCode, ApiError> {
    let (id, key) = P::checked(path)?;
    if uri.query() == Some("revoke=true") {
        let Some(key) = key else {
            return Err(ApiError::invalid_request(
                "Revoke on the key's route: DELETE /v1/keys/{key}/permits/{id}?revoke=true.",
            ));
        };
        return super::holders::revoke(&app, &headers, &key, &id).await;
    }
    let (settle, token) = release_query(&uri)?;
    app.release(&remote(id, key.as_deref(), token), settle)
        .await?;
    Ok(StatusCode::NO_CONTENT)
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct AcquireAllBody {
    keys: Vec<String>,
    id: Option<String>,
    weight: Option<u32>,
    lease_ms: Option<u64>,
    wait_ms: Option<u64>,
    priority: Option<u8>,
    flow: Option<String>,
    flow_weight: Option<u32>,
    quota: Option<QuotaBody>,
    holder: Option<String>,
}

/// A permit on several keys, as `POST /v1/permits` and `PUT /v1/permits/{id}` answer it.
#[derive(Debug, Serialize)]
pub(super) struct PermitAllJson {
    id: String,
    keys: Vec<KeyJson>,
    weight: u32,
    lease_expires_at_ms: Option<u64>,
    /// The admission's fencing token (0: nothing held, every key unlimited).
    token: u64,
    /// Its reservation, when the acquire body charged a quota.
    #[serde(skip_serializing_if = "Option::is_none")]
    reservation: Option<ReservationJson>,
}

const MAX_KEYS: usize = 16;

pub(super) async fn acquire_all(
    State(app): State<Arc<App>>,
    bytes: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let bytes = bytes.map_err(|e| ApiError::unreadable_body(&e))?;
    let request: AcquireAllBody = serde_json::from_slice(&bytes).map_err(|e| {
        ApiError::invalid_request(format!("Expected {{\"keys\": [\"key\", ...]}}: {e}"))
    })?;
    // Repeated keys count once; the order given is kept (the first key's figures lead the answer).
    let mut seen = HashSet::new();
    let mut keys: Vec<Arc<str>> = Vec::new();
    for key in &request.keys {
        check_name(key).map_err(ApiError::invalid_key)?;
        if seen.insert(key.as_str()) {
            keys.push(Arc::from(key.as_str()));
        }
    }
    if keys.is_empty() {
        return Err(ApiError::invalid_request(
            "keys must name at least one key.",
        ));
    }
    if keys.len() > MAX_KEYS {
        return Err(ApiError::invalid_request("keys may name at most 16 keys."));
    }
    let lease = lease(request.lease_ms)?.unwrap_or(app.limiter.lease());
    let charge = quotas::charge(request.quota)?;
    id_free(&app, request.id.as_deref(), &keys).await?;
    // A reservation goes under the permit's id, so that releasing the permit settles it.
    let id = request
        .id
        .or_else(|| charge.as_ref().map(|_| PermitId::generate().to_string()));
    let options = options(id.clone(), request.weight, request.lease_ms)?;
    let options = queue(
        holder(options, request.holder)?,
        (request.priority, request.flow, request.flow_weight),
        &app.priorities,
    )?;
    let reservation = app.reserve(charge.as_ref(), id.map(PermitId::from)).await?;
    let names: Vec<&str> = keys.iter().map(|key| &**key).collect();
    let (permit, reservation) = app
        .acquire_all_charged(&names, options, wait(request.wait_ms)?, reservation)
        .await?;
    let queued = queued_header(&app, &permit);
    let lent = match (&reservation, &charge) {
        (Some(reservation), Some(charge)) if app.quota.settles_on_release(reservation) => {
            let lent = app.lend(permit);
            let recorded = app.quota.record_lent(&keys, &lent.id, lease, &charge.key);
            let recorded = app.timed("record", recorded).await;
            if let Err(error) = recorded {
                app.release_unanswered(&keys, &lent).await;
                return Err(error.into());
            }
            lent
        }
        _ => app.lend_all(permit, &keys, lease).await?,
    };
    let reservation = match reservation {
        Some(reservation) => match app.timed("quota", app.quota.hand_over(reservation)).await {
            Ok(handed) => Some(quotas::reservation_json(&handed)),
            Err(error) => {
                // Not committed at admission: the client gets no permit to renew, nor a charge.
                app.release_unanswered(&keys, &lent).await;
                return Err(error.into());
            }
        },
        None => None,
    };
    let held = Held::from(&lent);
    let mut body = permit_all_json(&app, lent.id.to_string(), &keys, held).await;
    body.reservation = reservation;
    Ok((StatusCode::CREATED, queued, Json(body)).into_response())
}

/// What the store answered of a permit: its weight, its first key's limit and in-flight count, its
/// lease's end (none: nothing held) and its token.
struct Held {
    weight: u32,
    first: (Option<u32>, u32),
    lease_expires_at_ms: Option<u64>,
    token: u64,
}

impl Held {
    /// The store's figures (`expires_at_ms` 0: nothing held).
    fn new(weight: u32, limit: Limit, in_flight: u32, expires_at_ms: u64, token: u64) -> Self {
        Self {
            weight,
            first: (limit.get(), in_flight),
            lease_expires_at_ms: (expires_at_ms > 0).then_some(expires_at_ms),
            token,
        }
    }
}

impl From<&Lease> for Held {
    fn from(l: &Lease) -> Self {
        Self::new(l.weight, l.limit, l.in_flight, l.expires_at_ms, l.token)
    }
}

impl From<Grant> for Held {
    fn from(g: Grant) -> Self {
        Self::new(g.weight, g.limit, g.in_flight, g.expires_at_ms, g.token)
    }
}

/// The answer's figures: the first key's as the store gave them, the others' read now (for a permit
/// that holds nothing, or a key whose store is away: its class's limit, nothing in flight).
async fn permit_all_json(app: &App, id: String, keys: &[Arc<str>], held: Held) -> PermitAllJson {
    let Held {
        weight,
        first,
        lease_expires_at_ms,
        token,
    } = held;
    // A permit that holds nothing (no lease) is on keys that are all unlimited: nothing to read.
    let held = lease_expires_at_ms.is_some();
    let others = futures_util::future::join_all(keys[1..].iter().map(|key| async move {
        let status = match held {
            true => app.timed("status", app.limiter.status(key)).await.ok(),
            false => None,
        };
        let (limit, in_flight) = match status {
            Some(status) => (status.limit.get(), status.in_flight),
            None => (app.limiter.limits(key).resolve(None).get(), 0),
        };
        KeyJson {
            key: key.to_string(),
            limit,
            in_flight,
        }
    }))
    .await;
    let first = KeyJson {
        key: keys[0].to_string(),
        limit: first.0,
        in_flight: first.1,
    };
    PermitAllJson {
        id,
        keys: std::iter::once(first).chain(others).collect(),
        weight,
        lease_expires_at_ms,
        token,
        reservation: None,
    }
}
