//! The answers to a refused admission, the same wherever inflight answers HTTP:
//! `{"code": "...", "message": "...", "status": N}`, and `Retry-After` on 429.

use bytes::Bytes;
use http::{header, HeaderValue, Response, StatusCode};
use http_body_util::Full;
use inflight::{AcquireError, StoreError};

/// The status, stable code and message for a refused admission.
pub fn describe(error: &AcquireError) -> (StatusCode, &'static str, String) {
    match error {
        AcquireError::Full { limit, .. } => (
            StatusCode::TOO_MANY_REQUESTS,
            "too_many_requests",
            format!("Too many requests in flight: the limit is {limit}. Please try again later."),
        ),
        AcquireError::WeightExceedsLimit { weight, limit } => (
            StatusCode::BAD_REQUEST,
            "weight_exceeds_limit",
            format!("A weight of {weight} can never fit under the limit of {limit}."),
        ),
        AcquireError::Revoked => (
            StatusCode::CONFLICT,
            "revoked",
            "An admin revoked this request's place in the queue.".to_owned(),
        ),
        AcquireError::Invalid(why) => (
            StatusCode::BAD_REQUEST,
            "invalid_request",
            (*why).to_owned(),
        ),
        AcquireError::Store(StoreError::Unsupported(why)) => (
            StatusCode::BAD_REQUEST,
            "unsupported",
            format!("The store cannot do this: {why}."),
        ),
        AcquireError::Store(StoreError::TooManyWaiters { max }) => (
            StatusCode::TOO_MANY_REQUESTS,
            "too_many_waiters",
            format!("The key's queue is at its bound ({max} waiters); please try again later."),
        ),
        AcquireError::Store(_) => (
            StatusCode::SERVICE_UNAVAILABLE,
            "store_unavailable",
            "The limiter's store is unavailable; please try again shortly.".to_owned(),
        ),
        _ => (
            StatusCode::SERVICE_UNAVAILABLE,
            "unavailable",
            error.to_string(),
        ),
    }
}

/// A JSON error answer: `{"code", "message", "status"}`.
pub fn error_response(status: StatusCode, code: &str, message: &str) -> Response<Full<Bytes>> {
    let body = serde_json::json!({ "code": code, "message": message, "status": status.as_u16() });
    json_response(status, &body)
}

/// A JSON answer of `status` with this body (an error object with fields of its own).
pub fn json_response(status: StatusCode, body: &serde_json::Value) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from(body.to_string())));
    *response.status_mut() = status;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    response
}

/// The key that refused an admission and its class (its rule's pattern, `inflight::Policy::class_of`),
/// as a refusal's answer names them.
#[derive(Clone, Copy, Debug)]
pub struct Refusing<'a> {
    /// The key.
    pub key: &'a str,
    /// Its class.
    pub class: &'a str,
}

/// The answer to a refused admission, with `Retry-After` (whole seconds, at least 1) when over the limit.
/// Naming the refusing key (`refusing`), its body has `"key"`, and a 429 also `"class"` (and, over the
/// limit, `"limit"` and `"in_flight"`), said again in the header
/// `Inflight-Limit: key="app:a1"; class="app:*"; limit=5; in_flight=5`.
pub fn rejection(error: &AcquireError, refusing: Option<Refusing<'_>>) -> Response<Full<Bytes>> {
    let (status, code, message) = describe(error);
    let mut body =
        serde_json::json!({ "code": code, "message": message, "status": status.as_u16() });
    let mut named = None;
    if let Some(Refusing { key, class }) = refusing {
        body["key"] = key.into();
        if status == StatusCode::TOO_MANY_REQUESTS {
            body["class"] = class.into();
            let figures = match error {
                AcquireError::Full { limit, in_flight } => Some((*limit, *in_flight)),
                _ => None,
            };
            if let Some((limit, in_flight)) = figures {
                (body["limit"], body["in_flight"]) = (limit.into(), in_flight.into());
            }
            named = limit_header(Refusing { key, class }, figures);
        }
    }
    let mut response = json_response(status, &body);
    if let Some(value) = named {
        response.headers_mut().insert(INFLIGHT_LIMIT, value);
    }
    if let Some(after) = error.retry_after() {
        let secs = after.as_secs().max(1);
        response
            .headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from(secs));
    }
    response
}

/// The header naming the limit that refused a request, or that an admitted one queued on.
pub const INFLIGHT_LIMIT: header::HeaderName = header::HeaderName::from_static("inflight-limit");

/// [`INFLIGHT_LIMIT`]'s value: `key="app:a1"; class="app:*"` and, when known, `; limit=5; in_flight=5`
/// (RFC 9651 parameters). On a 429, the refusing key's; on the answer to a request that waited in a
/// key's queue before it was admitted ([`inflight::Permit::queued_on`]), that key's, with its figures
/// at admission.
pub fn limit_header(limit: Refusing<'_>, figures: Option<(u32, u32)>) -> Option<HeaderValue> {
    let mut header = format!(
        "key={}; class={}",
        sf_string(limit.key),
        sf_string(limit.class)
    );
    if let Some((limit, in_flight)) = figures {
        header.push_str(&format!("; limit={limit}; in_flight={in_flight}"));
    }
    HeaderValue::try_from(header).ok()
}

/// `text` as a structured field's string (RFC 9651): `"..."` with `\` and `"` escaped; with a character
/// outside printable ASCII, a Display String, `%"..."`, its UTF-8 bytes outside printable ASCII and `%`
/// and `"` written `%xx`.
fn sf_string(text: &str) -> String {
    let printable = |b: u8| (0x20..0x7f).contains(&b);
    if text.bytes().all(printable) {
        return format!("\"{}\"", text.replace('\\', "\\\\").replace('"', "\\\""));
    }
    let mut out = String::from("%\"");
    for b in text.bytes() {
        if printable(b) && b != b'%' && b != b'"' {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02x}"));
        }
    }
    out.push('"');
    out
}

#[cfg(test)]
mod tests {
    use super::sf_string;

    #[test]
    fn keys_are_written_as_structured_field_strings() {
        assert_eq!(sf_string("app:a1"), r#""app:a1""#);
        assert_eq!(sf_string(r#"a"b\c"#), r#""a\"b\\c""#);
        assert_eq!(sf_string("café%"), r#"%"caf%c3%a9%25""#);
    }
}
