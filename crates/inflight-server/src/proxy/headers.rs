//! Building the upstream request: the target URI, hop-by-hop headers removed, X-Forwarded-* added.

use std::net::SocketAddr;

use axum::body::Body;
use axum::extract::Request;
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::uri::{PathAndQuery, Uri};
use http::StatusCode;

use crate::error::ApiError;

/// Headers that describe one connection, not the message: never forwarded (RFC 9110 7.6.1).
const HOP_BY_HOP: [HeaderName; 8] = [
    header::CONNECTION,
    HeaderName::from_static("keep-alive"),
    header::PROXY_AUTHENTICATE,
    header::PROXY_AUTHORIZATION,
    header::TE,
    header::TRAILER,
    header::TRANSFER_ENCODING,
    header::UPGRADE,
];

/// Removes hop-by-hop headers, including those the Connection header names.
pub(super) fn strip_hop_by_hop(headers: &mut HeaderMap) {
    let named: Vec<HeaderName> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|name| HeaderName::from_bytes(name.trim().as_bytes()).ok())
        .collect();
    for name in named.iter().chain(HOP_BY_HOP.iter()) {
        headers.remove(name);
    }
}

/// The request as the upstream gets it.
pub(super) fn to_upstream(
    request: Request,
    base: &Uri,
    client: SocketAddr,
) -> Result<Request<Body>, ApiError> {
    let (mut parts, body) = request.into_parts();
    let original_host = parts.headers.get(header::HOST).cloned();
    strip_hop_by_hop(&mut parts.headers);
    let tail = parts.uri.path_and_query().map_or("/", PathAndQuery::as_str);
    let base_path = base.path().trim_end_matches('/');
    let path = format!("{base_path}{tail}");
    // Origin-form (`/path?query`): the upstream's authority goes in the Host header.
    let path: PathAndQuery = path.parse().map_err(|_| {
        ApiError::new(
            StatusCode::BAD_REQUEST,
            "invalid_request",
            "Unusable request path.",
        )
    })?;
    parts.uri = Uri::from(path);
    if let Some(authority) = base.authority() {
        if let Ok(host) = HeaderValue::from_str(authority.as_str()) {
            parts.headers.insert(header::HOST, host);
        }
    }
    if let Some(host) = original_host {
        parts
            .headers
            .insert(HeaderName::from_static("x-forwarded-host"), host);
    }
    let forwarded_for = match parts
        .headers
        .get("x-forwarded-for")
        .and_then(|v| v.to_str().ok())
    {
        Some(earlier) => format!("{earlier}, {}", client.ip()),
        None => client.ip().to_string(),
    };
    if let Ok(value) = HeaderValue::from_str(&forwarded_for) {
        parts
            .headers
            .insert(HeaderName::from_static("x-forwarded-for"), value);
    }
    parts.headers.insert(
        HeaderName::from_static("x-forwarded-proto"),
        HeaderValue::from_static("http"),
    );
    parts.version = http::Version::HTTP_11;
    Ok(Request::from_parts(parts, body))
}
