//! Who may use which route: the bearer tokens a server's routes need, and how a request's token is read
//! and compared.

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use http::{header, HeaderMap, HeaderValue};

use crate::error::ApiError;

/// The bearer tokens of a server's routes.
#[derive(Clone, Debug, Default)]
pub struct Tokens {
    /// The token that changing limits requires, if any.
    pub admin: Option<String>,
    /// The token that every /v1 route requires, if any (the admin token also passes).
    pub api: Option<String>,
}

impl Tokens {
    /// True when `authorization` carries the admin token (or none is configured).
    pub fn is_admin(&self, authorization: Option<&HeaderValue>) -> bool {
        self.admin
            .as_ref()
            .is_none_or(|token| bears(authorization, token))
    }

    /// True when `authorization` may use the /v1 routes: the API token or the admin token (or no API
    /// token is configured).
    pub fn is_api_user(&self, authorization: Option<&HeaderValue>) -> bool {
        let bears_any =
            |token: &Option<String>| token.as_ref().is_some_and(|t| bears(authorization, t));
        self.api.is_none() || bears_any(&self.api) || bears_any(&self.admin)
    }

    /// The routes that change limits and balances: 401 without the admin token (when one is set).
    pub fn require_admin(&self, headers: &HeaderMap) -> Result<(), ApiError> {
        self.require_admin_to(headers, "Changing limits")
    }

    /// A route only an admin may use (`doing` says what it does): 401 without the admin token (when one
    /// is set).
    pub fn require_admin_to(&self, headers: &HeaderMap, doing: &str) -> Result<(), ApiError> {
        if self.is_admin(headers.get(header::AUTHORIZATION)) {
            Ok(())
        } else {
            Err(ApiError::unauthorized(format!(
                "{doing} needs the admin token: Authorization: Bearer TOKEN."
            )))
        }
    }

    /// True when the status page may be shown: it needs the admin token, else the API token (or, without
    /// either, nothing), carried by `authorization` or given as `token` (the page's `?token=`).
    pub fn may_see_status(&self, authorization: Option<&HeaderValue>, token: Option<&str>) -> bool {
        let Some(needed) = self.admin.as_deref().or(self.api.as_deref()) else {
            return true;
        };
        bears(authorization, needed)
            || token.is_some_and(|token| constant_time_eq(token.as_bytes(), needed.as_bytes()))
    }
}

/// Every /v1 route, when an API token is set: 401 without it (or the admin token).
pub async fn require_api_user(
    State(tokens): State<Tokens>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    if tokens.is_api_user(request.headers().get(header::AUTHORIZATION)) {
        return next.run(request).await;
    }
    ApiError::unauthorized("This route needs the API token: Authorization: Bearer TOKEN.")
        .into_response()
}

/// True when `authorization` is `Bearer TOKEN` with this token: the scheme in any case (RFC 9110 11.1),
/// spaces or tabs between, the token compared in constant time.
fn bears(authorization: Option<&HeaderValue>, token: &str) -> bool {
    let given = authorization
        .and_then(|v| v.to_str().ok())
        .and_then(bearer_token)
        .unwrap_or_default();
    constant_time_eq(given.as_bytes(), token.as_bytes())
}

/// The token of an `Authorization` value `Bearer TOKEN` (RFC 9110 11.1, RFC 6750 2.1), read as an
/// upstream would (Dify splits on any whitespace): the scheme, in any case, is the first run of
/// non-whitespace; the token the rest, trimmed of spaces and tabs. `None` for another scheme or no token.
pub fn bearer_token(value: &str) -> Option<&str> {
    let (scheme, token) = value.trim_matches([' ', '\t']).split_once([' ', '\t'])?;
    let token = token.trim_matches([' ', '\t']);
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then_some(token)
}

/// Compares without an early exit, so the time taken says nothing about where a guess went wrong.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}
