//! API errors: always `{"code": "...", "message": "...", "status": N}` with a stable code; a refused
//! admission also names the refusing key, and on a 429 its class (and over the limit the limit and the
//! count in flight), said again in the `Inflight-Limit` header (`inflight_tower::rejection`).

use axum::body::Body;
use axum::response::{IntoResponse, Response};
use http::StatusCode;
use inflight::{AcquireError, StoreError};
use inflight_tower::rejection;

/// An error answer of the API.
#[derive(Debug)]
pub struct ApiError {
    status: StatusCode,
    code: &'static str,
    message: String,
    /// The refused admission, when that is what this is (for `Retry-After`).
    acquire: Option<AcquireError>,
    /// The key that refused the admission, when there was one to name, and its class when known.
    key: Option<Box<str>>,
    class: Option<Box<str>>,
    /// Whole seconds for `Retry-After`, when the refusal says when to try again.
    retry_after: Option<u32>,
}

impl ApiError {
    /// An error with this status, code and message.
    pub fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        Self {
            status,
            code,
            message: message.into(),
            acquire: None,
            key: None,
            class: None,
            retry_after: None,
        }
    }

    /// 400 `invalid_key`.
    pub fn invalid_key(why: &str) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "invalid_key", why)
    }

    /// 400 `invalid_request`.
    pub fn invalid_request(why: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "invalid_request", why)
    }

    /// A body that could not be read: 408 `body_timeout` when the client stopped sending it, else 400
    /// `invalid_request`.
    pub fn unreadable_body(error: &(dyn std::error::Error + 'static)) -> Self {
        match crate::incoming::body_timeout(error) {
            Some(timeout) => Self::new(
                StatusCode::REQUEST_TIMEOUT,
                "body_timeout",
                timeout.to_string(),
            ),
            None => Self::invalid_request(format!("Unreadable body: {error}")),
        }
    }

    /// 429 `too_many_listings`, with `Retry-After: 1`: `max` listings of busy keys are in progress in
    /// this process already.
    pub fn too_many_listings(max: usize) -> Self {
        let message = format!(
            "{max} listings of busy keys are in progress on this server, the most at once: try again in a second."
        );
        Self {
            retry_after: Some(1),
            ..Self::new(StatusCode::TOO_MANY_REQUESTS, "too_many_listings", message)
        }
    }

    /// 401 `unauthorized`: `why` names the token needed.
    pub fn unauthorized(why: impl Into<String>) -> Self {
        Self::new(StatusCode::UNAUTHORIZED, "unauthorized", why)
    }

    /// 404 `not_found`.
    pub fn not_found() -> Self {
        Self::new(StatusCode::NOT_FOUND, "not_found", "No such resource.")
    }

    /// The error, naming in its body the key it is about (`"key"`).
    pub fn naming(mut self, key: impl Into<String>) -> Self {
        self.key = Some(key.into().into_boxed_str());
        self
    }

    /// The HTTP status.
    pub fn status(&self) -> StatusCode {
        self.status
    }

    /// The stable code.
    pub fn code(&self) -> &'static str {
        self.code
    }
}

impl From<AcquireError> for ApiError {
    fn from(error: AcquireError) -> Self {
        let (status, code, message) = rejection::describe(&error);
        Self {
            acquire: Some(error),
            ..Self::new(status, code, message)
        }
    }
}

impl ApiError {
    /// A refusal by `key`, whose class is `class` (`Policy::class_of`): its answer names both, and over
    /// the limit the limit too (not for a store failure, which no key caused).
    pub fn refused(key: &str, class: &str, error: AcquireError) -> Self {
        let named = !matches!(error, AcquireError::Store(_));
        Self {
            key: named.then(|| key.into()),
            class: named.then(|| class.into()),
            ..Self::from(error)
        }
    }
}

impl From<StoreError> for ApiError {
    fn from(error: StoreError) -> Self {
        let (status, code, message) = match error {
            StoreError::TooManyOverrides { max } => (
                StatusCode::CONFLICT,
                "too_many_overrides",
                format!("{max} keys have an override already, the most allowed: clear one first."),
            ),
            StoreError::TooManyReservations { max } => (
                StatusCode::TOO_MANY_REQUESTS,
                "too_many_reservations",
                format!(
                    "{max} reservations of this key are open, the most allowed: settle one first."
                ),
            ),
            StoreError::IdInUse => (
                StatusCode::CONFLICT,
                "permit_id_in_use",
                "The id names a held permit on other keys: release it first, or use another id."
                    .to_string(),
            ),
            StoreError::TooManyQuotas { max } => (
                StatusCode::CONFLICT,
                "too_many_quotas",
                format!("{max} keys have a balance already, the most allowed."),
            ),
            // 400 unsupported, or 503 store_unavailable, as a refused admission is answered.
            error => {
                if !matches!(error, StoreError::Unsupported(_)) {
                    tracing::warn!(%error, "store error");
                }
                rejection::describe(&AcquireError::Store(error))
            }
        };
        Self::new(status, code, message)
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut response = match (&self.acquire, &self.key) {
            (Some(error), key) => {
                let refusing = key.as_deref().zip(self.class.as_deref());
                let refusing = refusing.map(|(key, class)| rejection::Refusing { key, class });
                rejection::rejection(error, refusing)
            }
            (None, None) => rejection::error_response(self.status, self.code, &self.message),
            (None, Some(key)) => {
                let body = serde_json::json!({
                    "code": self.code,
                    "message": self.message,
                    "status": self.status.as_u16(),
                    "key": key,
                });
                rejection::json_response(self.status, &body)
            }
        };
        if let Some(seconds) = self.retry_after {
            response
                .headers_mut()
                .insert(http::header::RETRY_AFTER, seconds.into());
        }
        response.map(Body::new)
    }
}
