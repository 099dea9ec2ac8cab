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
    let mut response = Response::new(Full::new(Bytes::from(body.to_string())));
    *response.status_mut() = status;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    response
}

/// The answer to a refused admission, with `Retry-After` (whole seconds, at least 1) when over the limit.
pub fn rejection(error: &AcquireError) -> Response<Full<Bytes>> {
    let (status, code, message) = describe(error);
    let mut response = error_response(status, code, &message);
    if let Some(after) = error.retry_after() {
        let secs = after.as_secs().max(1);
        response
            .headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from(secs));
    }
    response
}
