//! A worker's proxy: a request admitted (and charged), forwarded over the pool, and its response
//! streamed back under the permit.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::response::{IntoResponse, Response};
use http::{Request, StatusCode, Uri};
use inflight::{Permit, Reservation};
use inflight_tower::rejection::INFLIGHT_LIMIT;

use super::sources::Source;
use super::templates::{KeyTemplates, OnMissingKey, Unformed, MAX_KEYS};
use super::{access, body, headers, lost, paths, pool, OnRevoke, Peer, Upstream};
use crate::app::{App, Charge};
use crate::error::ApiError;
use crate::incoming::RequestBody;
use crate::metrics::ProxyResult;

const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// The proxy of one worker: its limiter, its upstream and its pool of connections to it.
pub struct Proxy {
    app: Arc<App>,
    upstream: Upstream,
    target: headers::Target,
    pool: pool::Pool,
}

impl Proxy {
    /// A proxy to `upstream` over `app`, with a pool of upstream connections of its own.
    pub fn new(app: Arc<App>, upstream: Upstream) -> Self {
        let mut address = http::uri::Parts::default();
        address.scheme = upstream.base.scheme().cloned();
        address.authority = upstream.base.authority().cloned();
        address.path_and_query = Some(http::uri::PathAndQuery::from_static("/"));
        // The settings accept only http://host[:port][/base], so these parts always make a URI.
        let address = Uri::from_parts(address).expect("an http URI with an authority");
        Self {
            app,
            target: headers::Target::new(&upstream.base, upstream.trust_forwarded),
            pool: pool::Pool::new(address, CONNECT_TIMEOUT),
            upstream,
        }
    }

    /// The response to `request`, which came from `client`. (A block rather than an `async fn`, here
    /// and in `forward_checked`: an async fn's future keeps its arguments twice, and hyper moves every
    /// request's future whole, every byte copied.)
    #[allow(clippy::manual_async_fn)]
    pub fn forward(
        self: Arc<Self>,
        request: Request<RequestBody>,
        client: Peer,
    ) -> impl Future<Output = Response> {
        async move {
            let mut access =
                access::Access::new(&request, &self.app.metrics, self.upstream.access_log);
            match forward_checked(&self, &client, request, &mut access).await {
                Ok((parts, body, result)) => {
                    let line = access.answered(&self.app.metrics, parts.status, result, None);
                    Response::from_parts(parts, Body::new(body.logged(line)))
                }
                Err(error) => {
                    let result = match error.status() {
                        StatusCode::TOO_MANY_REQUESTS => ProxyResult::Refused,
                        _ => ProxyResult::Error,
                    };
                    let metrics = &self.app.metrics;
                    drop(access.answered(metrics, error.status(), result, Some(error.code())));
                    error.into_response()
                }
            }
        }
    }
}

/// The upstream's response, on its way to the client: its head, its body and what became of the request.
#[allow(clippy::manual_async_fn)] // (see Proxy::forward)
fn forward_checked<'a>(
    proxy: &'a Proxy,
    client: &'a Peer,
    request: Request<RequestBody>,
    access: &'a mut access::Access,
) -> impl Future<Output = Result<(http::response::Parts, body::ProxyBody, ProxyResult), ApiError>> + 'a
{
    async move {
        let app = &proxy.app;
        // A reverse proxy forwards requests for its upstream's resources: it opens no tunnels (CONNECT) and
        // echoes nothing back along the way (TRACE).
        if matches!(
            *request.method(),
            http::Method::CONNECT | http::Method::TRACE
        ) {
            return Err(ApiError::new(
                StatusCode::METHOD_NOT_ALLOWED,
                "method_not_allowed",
                "The proxy does not forward CONNECT or TRACE.",
            ));
        }
        let (permit, reservation) = admit(proxy, &request, client, access).await?.unzip();
        let reservation = reservation.flatten();
        // Counted only when it holds a slot (an unlimited key's permit holds nothing), as the API counts.
        let proxying = permit
            .as_ref()
            .is_some_and(Permit::is_counted)
            .then(|| app.metrics.proxying());
        let result = match proxying {
            Some(_) => ProxyResult::Admitted,
            None => ProxyResult::Unlimited,
        };
        let mut upstream_request = proxy.target.to_upstream(request, client)?;
        if proxy.upstream.forward_token {
            let token = permit.as_ref().map_or(0, Permit::token);
            headers::set_token(upstream_request.headers_mut(), token);
        }
        // From here on the permit is held by `held`: a permit that can be lost ends the request when it is
        // (`--on-revoke end`), heard while the request waits.
        let ends = proxy.upstream.on_revoke == OnRevoke::End;
        let queued = permit.as_ref().and_then(|permit| app.queued_limit(permit));
        let mut held = lost::Held::new(permit, ends, || access.class());
        let sent = proxy.pool.send(upstream_request);
        let started = std::time::Instant::now();
        // On every early return below, the permit, its reservation and `proxying` are dropped: the slot is
        // released, and counted, and the charge refunded.
        let answered = {
            let answered = tokio::time::timeout(proxy.upstream.timeout, sent);
            tokio::pin!(answered);
            std::future::poll_fn(|cx| held.poll_unless_lost(answered.as_mut(), cx)).await
        };
        let answered = answered.ok_or_else(lost::revoked)?;
        let response = match answered {
            Err(_) => {
                return Err(ApiError::new(
                    StatusCode::GATEWAY_TIMEOUT,
                    "upstream_timeout",
                    "The upstream did not answer in time.",
                ))
            }
            // The client stopped sending the body being forwarded: the client's fault, not the upstream's.
            Ok(Err(error)) if crate::incoming::body_timeout(&error).is_some() => {
                return Err(ApiError::unreadable_body(&error));
            }
            Ok(Err(error)) => {
                tracing::warn!(%error, "upstream request failed");
                return Err(ApiError::new(
                    StatusCode::BAD_GATEWAY,
                    "upstream_unavailable",
                    "The upstream could not be reached.",
                ));
            }
            Ok(Ok(response)) => response,
        };
        app.metrics.upstream_latency(started.elapsed());
        let (mut parts, body) = response.into_parts();
        headers::strip_hop_by_hop(&mut parts.headers);
        if let Some(queued) = queued {
            // Admitted after a wait: the limit it waited on, named as on a 429.
            parts.headers.insert(INFLIGHT_LIMIT, queued);
        }
        // An upstream error is not charged (the reservation is dropped: refunded).
        let reservation = reservation.filter(|_| !parts.status.is_server_error());
        // The body holds the permit: released when the body ends, fails or is dropped; and the charge:
        // committed when the body was sent to its end, refunded otherwise.
        let body = body::ProxyBody::new(body, held, app.cut.subscribe(), proxying, reservation);
        Ok((parts, body, result))
    }
}

/// The permit `request` is forwarded under, and its charge to `--quota-key` (none when committed at
/// admission); None when it is not limited (`--limit-path`, `--on-missing-key pass`).
async fn admit(
    proxy: &Proxy,
    request: &Request<RequestBody>,
    client: &Peer,
    access: &mut access::Access,
) -> Result<Option<(Permit, Option<Reservation>)>, ApiError> {
    let upstream = &proxy.upstream;
    let quota_uses_path = upstream
        .quota_key
        .as_ref()
        .is_some_and(KeyTemplates::uses_path);
    let canonical = if upstream.keys.uses_path()
        || quota_uses_path
        || upstream.queue.uses_path()
        || upstream.holder.uses_path()
        || !upstream.limit_paths.is_empty()
    {
        paths::canonical(request.uri().path()).map_err(ApiError::invalid_request)?
    } else {
        String::new()
    };
    // A block of its own: the future does not carry what the templates read across its awaits.
    let (options, keys, quota_key) = {
        let source = Source {
            headers: request.headers(),
            path: &canonical,
            peer: client,
            trust_forwarded: upstream.trust_forwarded,
        };
        // Checked on every request, limited or not, waiting or not: a bad value is refused alike whatever
        // the key's load.
        let options = inflight::AcquireOptions::new();
        let options = upstream.queue.options(&source, options)?;
        if !upstream.limit_paths.is_empty() && !upstream.limit_paths.covers(&canonical) {
            return Ok(None);
        }
        let formed = upstream.keys.form(&source).and_then(|keys| {
            let quota = match &upstream.quota_key {
                Some(template) => template.form(&source)?.pop(),
                None => None,
            };
            Ok((keys, quota))
        });
        let (keys, quota_key) = match formed {
            Ok(formed) => formed,
            Err(Unformed::Missing(_)) if upstream.on_missing_key == OnMissingKey::Pass => {
                return Ok(None)
            }
            Err(Unformed::Missing(why)) => {
                return Err(ApiError::new(StatusCode::BAD_REQUEST, "missing_key", why))
            }
            Err(Unformed::Invalid(why)) => return Err(ApiError::invalid_key(&why)),
        };
        access.keys(&keys, &proxy.app.limiter.policy(), &proxy.app.metrics);
        // Labelled only once limited (a bad label counted in its key's class), before any charge.
        let options = upstream.holder.options(&source, options)?;
        (options, keys, quota_key)
    };
    // The keys as the limiter takes them, without a second allocation (there are at most MAX_KEYS).
    let mut names = [""; MAX_KEYS];
    for (name, key) in names.iter_mut().zip(&keys) {
        *name = key;
    }
    let names = &names[..keys.len()];
    let app = &proxy.app;
    // (Most proxied requests are charged nothing: no future to make and poll for them.)
    let reservation = match quota_key {
        Some(key) => app.reserve(Some(&Charge { key, amount: 1 }), None).await?,
        None => None,
    };
    let (permit, reservation) = app
        .acquire_all_charged(names, options, upstream.max_wait, reservation)
        .await?;
    let reservation = match reservation {
        Some(reservation) if app.quota.settles_on_release(&reservation) => Some(reservation),
        Some(reservation) => {
            app.timed("quota", app.quota.hand_over(reservation)).await?;
            None
        }
        None => None,
    };
    Ok(Some((permit, reservation)))
}
