//! API errors: always `{"code": "...", "message": "...", "status": N}` with a stable code, and `"key"` when
//! one key of a multi-key admission refused it.

use axum::body::Body;
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use http::StatusCode;
use http_body_util::Full;
use inflight::{AcquireError, KeyRefused, StoreError};
use inflight_tower::rejection;

/// An error answer of the API.
#[derive(Debug)]
pub struct ApiError {
    status: StatusCode,
    code: &'static str,
    message: String,
    /// The refused admission, when that is what this is (for `Retry-After`).
    acquire: Option<AcquireError>,
    /// The key that refused the admission, when there was one to name.
    key: Option<String>,
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
    pub fn unauthorized(why: &str) -> Self {
        Self::new(StatusCode::UNAUTHORIZED, "unauthorized", why)
    }

    /// 404 `not_found`.
    pub fn not_found() -> Self {
        Self::new(StatusCode::NOT_FOUND, "not_found", "No such resource.")
    }

    /// The error, naming in its body the key it is about (`"key"`).
    pub fn naming(mut self, key: impl Into<String>) -> Self {
        self.key = Some(key.into());
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

/// A refusal of one of several keys names it (not for a store failure, which no key caused).
impl From<KeyRefused> for ApiError {
    fn from(refused: KeyRefused) -> Self {
        let key = (!matches!(refused.error, AcquireError::Store(_))).then_some(refused.key);
        Self {
            key,
            ..Self::from(refused.error)
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
        let mut response = match &self.acquire {
            Some(error) => rejection::rejection(error),
            None => rejection::error_response(self.status, self.code, &self.message),
        };
        if let Some(key) = &self.key {
            let body = serde_json::json!({
                "code": self.code,
                "message": self.message,
                "status": self.status.as_u16(),
                "key": key,
            });
            *response.body_mut() = Full::new(Bytes::from(body.to_string()));
        }
        if let Some(seconds) = self.retry_after {
            response
                .headers_mut()
                .insert(http::header::RETRY_AFTER, seconds.into());
        }
        response.map(Body::new)
    }
}
