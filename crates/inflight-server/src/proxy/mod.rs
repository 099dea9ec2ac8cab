//! The reverse proxy: admits each request under the value of its key header, forwards it to the
//! upstream, and holds the permit until the response body has been sent or the client has gone away.
//! Bodies stream both ways unbuffered (server-sent events included). The API answers under `/_inflight/`.

mod body;
mod headers;
mod upstream;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::response::{IntoResponse, Response};
use http::{HeaderName, HeaderValue, Request, StatusCode, Uri};
use hyper::body::Incoming;
use inflight::Store;

use crate::app::{check_name, App};
use crate::error::ApiError;

/// Where and how to forward.
#[derive(Clone, Debug)]
pub struct Upstream {
    /// The upstream's base URL (`http://host:port[/base]`).
    pub base: Uri,
    /// The header whose value is the key.
    pub key_header: HeaderName,
    /// How long a request may take upstream until its response headers (connecting and sending it included).
    pub timeout: Duration,
}

/// The client at the other end of a connection: its address, and its IP address written out once per
/// connection for the `X-Forwarded-For` of each of its requests.
#[derive(Clone, Debug)]
pub struct Peer {
    /// The client's address.
    pub addr: SocketAddr,
    /// The client's IP address, as text.
    pub ip: HeaderValue,
}

impl Peer {
    /// The peer at `addr`.
    pub fn new(addr: SocketAddr) -> Self {
        let ip = HeaderValue::from_maybe_shared(bytes::Bytes::from(addr.ip().to_string()))
            .expect("an IP address is a valid header value");
        Self { addr, ip }
    }
}

/// How long making a connection to the upstream may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// The proxy of one worker: its limiter, its upstream and its pool of connections to it.
pub struct Proxy<S: Store> {
    app: Arc<App<S>>,
    upstream: Upstream,
    target: headers::Target,
    pool: upstream::Pool,
}

impl<S: Store> Proxy<S> {
    /// A proxy to `upstream` over `app`, with a pool of upstream connections of its own.
    pub fn new(app: Arc<App<S>>, upstream: Upstream) -> Self {
        let mut address = http::uri::Parts::default();
        address.scheme = upstream.base.scheme().cloned();
        address.authority = upstream.base.authority().cloned();
        address.path_and_query = Some(http::uri::PathAndQuery::from_static("/"));
        // The settings accept only http://host[:port][/base], so these parts always make a URI.
        let address = Uri::from_parts(address).expect("an http URI with an authority");
        Self {
            app,
            target: headers::Target::new(&upstream.base),
            pool: upstream::Pool::new(address, CONNECT_TIMEOUT),
            upstream,
        }
    }

    /// The response to `request`, which came from `client`.
    pub async fn forward(self: Arc<Self>, request: Request<Incoming>, client: Peer) -> Response {
        match forward_checked(&self, &client, request).await {
            Ok(response) => response,
            Err(error) => error.into_response(),
        }
    }
}

async fn forward_checked<S: Store>(
    proxy: &Proxy<S>,
    client: &Peer,
    request: Request<Incoming>,
) -> Result<Response, ApiError> {
    let app = &proxy.app;
    let key = match request.headers().get(&proxy.upstream.key_header) {
        None => {
            return Err(ApiError::new(
                StatusCode::BAD_REQUEST,
                "missing_key",
                format!("The request has no {} header.", proxy.upstream.key_header),
            ))
        }
        Some(value) => key_of(value)?,
    };
    let permit = app.acquire(&key, inflight::AcquireOptions::new()).await?;
    // Counted only when it holds a slot (an unlimited key's permit holds nothing), as the API counts.
    let held = permit.is_counted().then(|| app.metrics.hold());
    let upstream_request = proxy.target.to_upstream(request, client)?;
    let sent = proxy.pool.send(upstream_request);
    // On every early return below, the permit and `held` are dropped: the slot is released, and counted.
    let response = match tokio::time::timeout(proxy.upstream.timeout, sent).await {
        Err(_) => {
            return Err(ApiError::new(
                StatusCode::GATEWAY_TIMEOUT,
                "upstream_timeout",
                "The upstream did not answer in time.",
            ))
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
    let (mut parts, body) = response.into_parts();
    headers::strip_hop_by_hop(&mut parts.headers);
    // The body holds the permit: released when the body ends, fails or is dropped.
    let body = body::ProxyBody::new(body, permit, app.cut.subscribe(), held);
    Ok(Response::from_parts(parts, Body::new(body)))
}

fn key_of(value: &HeaderValue) -> Result<String, ApiError> {
    let key = value
        .to_str()
        .map_err(|_| ApiError::invalid_key("The key header is not visible ASCII."))?;
    check_name(key).map_err(ApiError::invalid_key)?;
    Ok(key.to_owned())
}
