//! Building the upstream request: the target URI, hop-by-hop headers removed, X-Forwarded-* added.

use axum::extract::Request;
use bytes::Bytes;
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::uri::{PathAndQuery, Uri};

use super::Peer;
use crate::error::ApiError;

/// Headers that describe one connection, not the message: never forwarded (RFC 9110 7.6.1).
static HOP_BY_HOP: [HeaderName; 8] = [
    header::CONNECTION,
    HeaderName::from_static("keep-alive"),
    header::PROXY_AUTHENTICATE,
    header::PROXY_AUTHORIZATION,
    header::TE,
    header::TRAILER,
    header::TRANSFER_ENCODING,
    header::UPGRADE,
];

// Constants, so that the names are checked when compiling rather than on every request.
pub(super) const X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");
const X_FORWARDED_HOST: HeaderName = HeaderName::from_static("x-forwarded-host");
const X_FORWARDED_PROTO: HeaderName = HeaderName::from_static("x-forwarded-proto");
const X_REAL_IP: HeaderName = HeaderName::from_static("x-real-ip");
const INFLIGHT_TOKEN: HeaderName = HeaderName::from_static("inflight-token");

/// `Inflight-Token`: the admission's fencing token, in place of any the client sent; none for a request
/// that holds no slot (`token` 0).
pub(super) fn set_token(headers: &mut HeaderMap, token: u64) {
    headers.remove(INFLIGHT_TOKEN);
    if token > 0 {
        headers.insert(INFLIGHT_TOKEN, HeaderValue::from(token));
    }
}

/// Removes hop-by-hop headers, including those the Connection header names. A message with
/// `Transfer-Encoding` loses its `Content-Length` too (RFC 9112 6.3: the encoding decides the length, so
/// the other would be a wrong one once the body is framed anew).
pub(super) fn strip_hop_by_hop(headers: &mut HeaderMap) {
    if headers.contains_key(header::TRANSFER_ENCODING) {
        headers.remove(header::CONTENT_LENGTH);
    }
    // The names present, looked up once each: most messages have none or one (`Connection`). An option
    // that names no header of the message, as `close` and `keep-alive` mostly do not, needs no name made.
    let mut gone: Vec<HeaderName> = Vec::new();
    for name in headers.keys() {
        if HOP_BY_HOP.contains(name) {
            gone.push(name.clone());
        }
    }
    for value in headers.get_all(header::CONNECTION) {
        for option in value.to_str().unwrap_or_default().split(',') {
            let option = option.trim();
            if !option.is_empty() && headers.contains_key(option) {
                gone.extend(HeaderName::from_bytes(option.as_bytes()).ok());
            }
        }
    }
    for name in &gone {
        headers.remove(name);
    }
}

/// Where requests go: the upstream's base path and Host header, worked out once.
pub(super) struct Target {
    /// The base URL's path without its trailing `/` (empty for none).
    base_path: String,
    /// The upstream's authority, as the Host header sent to it.
    host: Option<HeaderValue>,
    /// Whether the client's `X-Forwarded-For` (and `Forwarded`, `X-Real-IP`) are kept and appended to;
    /// otherwise they are replaced by what this proxy saw.
    trust_forwarded: bool,
}

impl Target {
    /// The target of `base` (`http://host[:port][/base]`).
    pub(super) fn new(base: &Uri, trust_forwarded: bool) -> Self {
        Self {
            trust_forwarded,
            base_path: base.path().trim_end_matches('/').to_owned(),
            host: base
                .authority()
                .and_then(|authority| HeaderValue::from_str(authority.as_str()).ok()),
        }
    }

    /// The request as the upstream gets it.
    pub(super) fn to_upstream<B>(
        &self,
        request: Request<B>,
        client: &Peer,
    ) -> Result<Request<B>, ApiError> {
        let (mut parts, body) = request.into_parts();
        strip_hop_by_hop(&mut parts.headers);
        // Origin-form (`/path?query`): the upstream's authority goes in the Host header.
        let tail = parts.uri.path_and_query();
        let path = match (self.base_path.as_str(), tail) {
            ("", Some(tail)) if tail.as_str().starts_with('/') => tail.clone(),
            (base_path, tail) => {
                let tail = tail.map_or("/", PathAndQuery::as_str);
                format!("{base_path}{tail}")
                    .parse()
                    .map_err(|_| ApiError::invalid_request("Unusable request path."))?
            }
        };
        // The host the client asked for: its Host header, or in HTTP/2 (which has none) the authority.
        let authority = parts.uri.authority().cloned();
        parts.uri = Uri::from(path);
        let original_host = match &self.host {
            Some(host) => parts.headers.insert(header::HOST, host.clone()),
            None => parts.headers.get(header::HOST).cloned(),
        }
        .or_else(|| HeaderValue::from_str(authority?.as_str()).ok());
        if let Some(host) = original_host {
            parts.headers.insert(X_FORWARDED_HOST, host);
        }
        let forwarded_for = match self.trust_forwarded {
            true => match parts
                .headers
                .get(X_FORWARDED_FOR)
                .and_then(|v| v.to_str().ok())
            {
                // The string's buffer becomes the value's, without a copy.
                Some(earlier) => {
                    let ip = client.ip.to_str().unwrap_or_default();
                    HeaderValue::from_maybe_shared(Bytes::from(format!("{earlier}, {ip}"))).ok()
                }
                None => Some(client.ip.clone()),
            },
            // A client on the public edge says what it likes about where it comes from: none of it goes
            // on, so that the upstream's logs and limits by address see the address this proxy saw
            // (inserting X-Forwarded-For below replaces every value the client sent).
            false => {
                parts.headers.remove(X_REAL_IP);
                parts.headers.remove(header::FORWARDED);
                Some(client.ip.clone())
            }
        };
        if let Some(value) = forwarded_for {
            parts.headers.insert(X_FORWARDED_FOR, value);
        }
        // The scheme of the client's connection: the listener marks requests that came over TLS.
        let proto = match parts.extensions.get::<http::uri::Scheme>() {
            Some(scheme) if *scheme == http::uri::Scheme::HTTPS => "https",
            _ => "http",
        };
        parts
            .headers
            .insert(X_FORWARDED_PROTO, HeaderValue::from_static(proto));
        parts.version = http::Version::HTTP_11;
        Ok(Request::from_parts(parts, body))
    }
}

#[cfg(test)]
mod tests {
    use axum::body::Body;

    use super::*;

    /// The request to `uri` with `headers` from 10.0.0.7, as sent to the upstream `base`.
    fn sent(base: &str, trust_forwarded: bool, uri: &str, headers: &[(&str, &str)]) -> Request {
        let mut builder = http::Request::builder().uri(uri);
        for (name, value) in headers {
            builder = builder.header(*name, *value);
        }
        let request = builder.body(Body::empty()).unwrap();
        let client = Peer::new("10.0.0.7:5000".parse().unwrap());
        let base: Uri = base.parse().unwrap();
        let target = Target::new(&base, trust_forwarded);
        target.to_upstream(request, &client).unwrap()
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
            let sent = sent(base, false, path, &[("host", "front")]);
            assert_eq!(sent.uri().to_string(), expected, "{base} {path}");
            assert_eq!(sent.headers()["host"], "up:81");
            assert_eq!(sent.headers()["x-forwarded-host"], "front");
        }
    }

    #[test]
    fn without_a_host_header_the_forwarded_host_is_the_authority() {
        let sent = sent("http://up:81", false, "http://front:8080/v1/chat", &[]);
        assert_eq!(sent.uri().to_string(), "/v1/chat");
        assert_eq!(sent.headers()["host"], "up:81");
        assert_eq!(sent.headers()["x-forwarded-host"], "front:8080");
    }

    #[test]
    fn forwarded_for_is_appended_and_hop_by_hop_headers_go() {
        let headers = [
            ("x-forwarded-for", "192.0.2.1"),
            ("connection", "keep-alive, X-Drop-Me"),
            ("x-drop-me", "1"),
            ("keep-alive", "timeout=5"),
            ("te", "trailers"),
            ("x-kept", "1"),
        ];
        let sent = sent("http://up", true, "/", &headers);
        let headers = sent.headers();
        assert_eq!(headers["x-forwarded-for"], "192.0.2.1, 10.0.0.7");
        assert_eq!(headers["x-forwarded-proto"], "http");
        assert_eq!(headers["x-kept"], "1");
        for gone in ["connection", "x-drop-me", "keep-alive", "te"] {
            assert!(!headers.contains_key(gone), "{gone} was forwarded");
        }
    }

    #[test]
    fn an_untrusted_clients_forwarding_headers_are_replaced() {
        let claimed = [
            ("x-forwarded-for", "203.0.113.9"),
            ("x-real-ip", "203.0.113.9"),
            ("forwarded", "for=203.0.113.9"),
        ];
        let replaced = sent("http://up", false, "/", &claimed);
        let headers = replaced.headers();
        assert_eq!(
            headers["x-forwarded-for"], "10.0.0.7",
            "replaced, not appended to"
        );
        assert!(!headers.contains_key("x-real-ip"));
        assert!(!headers.contains_key("forwarded"));
        let trusted = sent("http://up", true, "/", &claimed);
        assert_eq!(
            trusted.headers()["x-forwarded-for"],
            "203.0.113.9, 10.0.0.7"
        );
        assert_eq!(trusted.headers()["x-real-ip"], "203.0.113.9");
    }

    /// The names of `headers` (appended in order) that stripping leaves.
    fn left_after_stripping(headers: &[(&'static str, &'static str)]) -> Vec<String> {
        let mut map = HeaderMap::new();
        for (name, value) in headers {
            map.append(*name, HeaderValue::from_static(value));
        }
        strip_hop_by_hop(&mut map);
        map.keys().map(|name| name.as_str().to_owned()).collect()
    }

    #[test]
    fn every_option_the_connection_header_names_goes_in_any_case() {
        let left = left_after_stripping(&[
            ("connection", "Keep-Alive, CLOSE,x-a"),
            ("connection", "X-B"),
            ("keep-alive", "1"),
            ("close", "1"),
            ("x-a", "1"),
            ("x-b", "1"),
            ("x-kept", "1"),
        ]);
        assert_eq!(left, ["x-kept"]);
    }

    #[test]
    fn a_lone_keep_alive_goes_with_its_connection_header() {
        let left = left_after_stripping(&[
            ("connection", "Keep-Alive"),
            ("keep-alive", "timeout=5"),
            ("x-kept", "1"),
        ]);
        assert_eq!(left, ["x-kept"]);
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
