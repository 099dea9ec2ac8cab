//! What every handler shares: the limiter, the admin token, the metrics.

use std::time::Instant;

use inflight::{Limiter, Store};

use crate::metrics::Metrics;

/// The state of a server.
pub struct App<S: Store> {
    /// The limiter every request goes through.
    pub limiter: Limiter<S>,
    /// The bearer token that changing limits requires, if any.
    pub admin_token: Option<String>,
    /// The process's metrics.
    pub metrics: Metrics,
    /// Set when the shutdown grace period is over: responses still streaming end then.
    pub cut: tokio::sync::watch::Sender<bool>,
}

impl<S: Store> App<S> {
    /// Runs a store operation and records its latency under `op`.
    pub async fn timed<T>(
        &self,
        op: &'static str,
        work: impl std::future::Future<Output = T>,
    ) -> T {
        let started = Instant::now();
        let out = work.await;
        self.metrics.store_latency(op, started.elapsed());
        out
    }

    /// True when `authorization` carries the admin token (or none is configured).
    pub fn is_admin(&self, authorization: Option<&http::HeaderValue>) -> bool {
        let Some(token) = &self.admin_token else {
            return true;
        };
        let given = authorization
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .unwrap_or_default();
        constant_time_eq(given.as_bytes(), token.as_bytes())
    }
}

/// Longest key and id, in bytes.
const MAX_NAME: usize = 256;

/// Checks a key or a permit id, wherever it comes from (a path, a body, the proxy's key header): non-empty,
/// at most 256 bytes, no control characters.
pub fn check_name(name: &str) -> Result<(), &'static str> {
    if name.is_empty() {
        Err("Keys and ids may not be empty.")
    } else if name.len() > MAX_NAME {
        Err("Keys and ids are at most 256 bytes.")
    } else if name.chars().any(char::is_control) {
        Err("Keys and ids may not contain control characters.")
    } else {
        Ok(())
    }
}

/// Compares without an early exit, so the time taken says nothing about where a guess went wrong.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}
