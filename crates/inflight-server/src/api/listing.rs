//! `GET /v1/keys?prefix=&limit=100`: the keys with permits in flight, busiest first (bounded work: see
//! [`inflight::BusyKeys`]), at most [`crate::app::MAX_LISTINGS`] at once in a process (one more is
//! `429 too_many_listings`).

use std::sync::Arc;

use axum::extract::State;
use axum::http::Uri;
use axum::response::{IntoResponse, Response};
use axum::Json;
use inflight::Busiest;
use serde::Serialize;

use super::input::query;
use crate::app::App;
use crate::error::ApiError;

/// How many keys a listing answers with unless `limit` says otherwise.
const DEFAULT_LIMIT: usize = 100;

/// The listing.
#[derive(Debug, Serialize)]
pub struct BusyJson {
    keys: Vec<BusyKeyJson>,
    truncated: bool,
}

/// One busy key: its limit (`null`: unlimited), how many are in flight, and this worker's waiters on it
/// when there are any.
#[derive(Debug, Serialize)]
struct BusyKeyJson {
    key: String,
    limit: Option<u32>,
    in_flight: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    waiters: Option<usize>,
    /// Those waiters by priority level and flow, when there are any.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    queued: Vec<QueuedJson>,
}

/// This worker's waiters on a key at one priority level in one flow.
#[derive(Debug, Serialize)]
struct QueuedJson {
    priority: u8,
    /// `null`: the flow of waiters that name none.
    flow: Option<String>,
    waiters: usize,
}

impl From<Busiest> for BusyJson {
    fn from(busy: Busiest) -> Self {
        Self {
            keys: busy
                .keys
                .into_iter()
                .map(|b| BusyKeyJson {
                    key: b.key.to_string(),
                    limit: b.limit.get(),
                    in_flight: b.in_flight,
                    waiters: (b.waiters > 0).then_some(b.waiters),
                    queued: b
                        .queued
                        .into_iter()
                        .map(|q| QueuedJson {
                            priority: q.priority,
                            flow: q.flow.map(|flow| flow.to_string()),
                            waiters: q.waiters,
                        })
                        .collect(),
                })
                .collect(),
            truncated: busy.truncated,
        }
    }
}

/// Lists under a place of the process's cap, kept until the answer is written out.
pub(super) async fn list(State(app): State<Arc<App>>, uri: Uri) -> Result<Response, ApiError> {
    let (prefix, limit) = listing(&uri)?;
    let place = app
        .listings
        .try_enter()
        .ok_or_else(|| ApiError::too_many_listings(app.listings.max()))?;
    let busy = app.limiter.busy(&prefix, limit).await?;
    let answer = Json(BusyJson::from(busy)).into_response();
    drop(place);
    Ok(answer)
}

/// The `prefix` (default empty: every key) and `limit` (1 to [`inflight::store::MAX_BUSY`]) of a listing.
fn listing(uri: &Uri) -> Result<(String, usize), ApiError> {
    let (mut prefix, mut limit) = (String::new(), DEFAULT_LIMIT);
    for (name, value) in query(uri)? {
        match name.as_str() {
            "prefix" if value.len() <= 256 && !value.chars().any(char::is_control) => {
                prefix = value
            }
            "prefix" => {
                return Err(ApiError::invalid_request(
                    "prefix is at most 256 bytes, without control characters.",
                ))
            }
            "limit" => {
                limit = value
                    .parse()
                    .ok()
                    .filter(|n| (1..=inflight::store::MAX_BUSY).contains(n))
                    .ok_or_else(|| {
                        ApiError::invalid_request("limit must be a number from 1 to 1000.")
                    })?;
            }
            other => {
                return Err(ApiError::invalid_request(format!(
                    "Unknown query parameter {other:?}: this route takes prefix and limit."
                )))
            }
        }
    }
    Ok((prefix, limit))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parsed(query: &str) -> Result<(String, usize), &'static str> {
        let uri: Uri = format!("/v1/keys{query}").parse().unwrap();
        listing(&uri).map_err(|e| e.code())
    }

    #[test]
    fn a_listing_takes_a_prefix_and_a_bounded_limit() {
        assert_eq!(parsed(""), Ok((String::new(), 100)));
        assert_eq!(
            parsed("?prefix=app%3A%2A+x&limit=7"),
            Ok(("app:* x".into(), 7))
        );
        assert_eq!(parsed("?limit=1000&prefix="), Ok((String::new(), 1000)));
        for bad in [
            "?limit=0",
            "?limit=1001",
            "?limit=x",
            "?limit=",
            "?other=1",
            "?prefix=%0A",
            "?prefix=%FF",
        ] {
            assert_eq!(parsed(bad), Err("invalid_request"), "{bad}");
        }
    }
}
