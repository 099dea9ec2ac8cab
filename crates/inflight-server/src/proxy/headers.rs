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

#[cfg(test)]
mod tests {
    use super::*;

    fn request(uri: &str, headers: &[(&str, &str)]) -> Request {
        let mut builder = http::Request::builder().uri(uri);
        for (name, value) in headers {
            builder = builder.header(*name, *value);
        }
        builder.body(Body::empty()).unwrap()
    }

    fn client() -> SocketAddr {
        "10.0.0.7:5000".parse().unwrap()
    }

    #[test]
    fn the_target_is_origin_form_under_the_base_path() {
        let cases = [
            ("http://up:81", "/v1/chat?x=1", "/v1/chat?x=1"),
            ("http://up:81/", "/v1/chat", "/v1/chat"),
            ("http://up:81/api", "/v1/chat?x=1", "/api/v1/chat?x=1"),
            ("http://up:81/api/", "/", "/api/"),
        ];
        for (base, path, expected) in cases {
            let base: Uri = base.parse().unwrap();
            let sent = to_upstream(request(path, &[("host", "front")]), &base, client()).unwrap();
            assert_eq!(sent.uri().to_string(), expected, "{base} {path}");
            assert_eq!(sent.headers()["host"], "up:81");
            assert_eq!(sent.headers()["x-forwarded-host"], "front");
        }
    }

    #[test]
    fn forwarded_for_is_appended_and_hop_by_hop_headers_go() {
        let base: Uri = "http://up".parse().unwrap();
        let sent = to_upstream(
            request(
                "/",
                &[
                    ("x-forwarded-for", "192.0.2.1"),
                    ("connection", "keep-alive, X-Drop-Me"),
                    ("x-drop-me", "1"),
                    ("keep-alive", "timeout=5"),
                    ("te", "trailers"),
                    ("x-kept", "1"),
                ],
            ),
            &base,
            client(),
        )
        .unwrap();
        let headers = sent.headers();
        assert_eq!(headers["x-forwarded-for"], "192.0.2.1, 10.0.0.7");
        assert_eq!(headers["x-forwarded-proto"], "http");
        assert_eq!(headers["x-kept"], "1");
        for gone in ["connection", "x-drop-me", "keep-alive", "te"] {
            assert!(!headers.contains_key(gone), "{gone} was forwarded");
        }
    }

    #[test]
    fn a_message_without_hop_by_hop_headers_is_left_as_it_is() {
        let mut headers = HeaderMap::new();
        headers.insert("content-type", HeaderValue::from_static("text/plain"));
        headers.append("x-multi", HeaderValue::from_static("a"));
        headers.append("x-multi", HeaderValue::from_static("b"));
        let before = headers.clone();
        strip_hop_by_hop(&mut headers);
        assert_eq!(headers, before);
    }
}
