//! The labels of `inflight_proxy_requests_total`: what became of a request, and the class of its key.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock, PoisonError};

use http::StatusCode;

/// What became of a request the proxy answered, for `inflight_proxy_requests_total` and the access log.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProxyResult {
    /// Forwarded under a permit that held a slot; the upstream answered.
    Admitted,
    /// Forwarded without holding a slot (an unlimited key, a path outside `--limit-path`, keys not
    /// formed under `--on-missing-key pass`); the upstream answered.
    Unlimited,
    /// Refused by the proxy with 429: the limit reached (after any wait), or the quota exhausted.
    Refused,
    /// Answered by the proxy itself otherwise: a bad or missing key, the store unavailable, the
    /// upstream unreachable or too slow.
    Error,
}

impl ProxyResult {
    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Admitted => "admitted",
            Self::Unlimited => "unlimited",
            Self::Refused => "refused",
            Self::Error => "error",
        }
    }
}

/// `2xx` and the like.
pub(super) fn status_class(status: StatusCode) -> &'static str {
    match status.as_u16() / 100 {
        1 => "1xx",
        2 => "2xx",
        3 => "3xx",
        4 => "4xx",
        _ => "5xx",
    }
}

/// The label values of `status_class` (by the status's first digit, 1 to 5) and of `result`.
const STATUS_CLASSES: usize = 5;
const RESULTS: [ProxyResult; 4] = [
    ProxyResult::Admitted,
    ProxyResult::Unlimited,
    ProxyResult::Refused,
    ProxyResult::Error,
];

/// A class's series of `inflight_proxy_requests_total` without a `key` label, each registered when first
/// counted (so that /metrics shows only those counted, as the macro would), then counted through its handle
/// (no labels built, no registry looked up per request).
pub struct ProxiedClass {
    name: Box<str>,
    counters: [[OnceLock<metrics::Counter>; RESULTS.len()]; STATUS_CLASSES],
    /// Its series of `inflight_proxy_streams_revoked_total`.
    revoked: OnceLock<metrics::Counter>,
}

impl ProxiedClass {
    fn new(name: &str) -> Arc<Self> {
        Arc::new(Self {
            name: name.into(),
            counters: Default::default(),
            revoked: OnceLock::new(),
        })
    }

    /// Counts a request of this class that the proxy ended because its permit was lost (revoked).
    pub fn revoked(&self) {
        self.revoked
            .get_or_init(|| {
                metrics::counter!("inflight_proxy_streams_revoked_total", "class" => self.name.to_string())
            })
            .increment(1);
    }

    /// The class, as labels and access lines show it.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The counter of a request answered `status` with `result`.
    pub(super) fn counter(&self, status: StatusCode, result: ProxyResult) -> &metrics::Counter {
        let digit = usize::from(status.as_u16() / 100).clamp(1, STATUS_CLASSES);
        let at = RESULTS.iter().position(|r| *r == result).unwrap_or(0);
        self.counters[digit - 1][at].get_or_init(|| {
            metrics::counter!(
                "inflight_proxy_requests_total",
                "status_class" => status_class(status), "class" => self.name.to_string(),
                "result" => result.as_str()
            )
        })
    }
}

/// The classes met so far, each with its series; shared by a server's workers.
pub(super) struct ProxiedClasses {
    /// `none`: no key formed.
    pub(super) none: Arc<ProxiedClass>,
    by_name: Mutex<HashMap<Box<str>, Arc<ProxiedClass>>>,
}

impl Default for ProxiedClasses {
    fn default() -> Self {
        Self {
            none: ProxiedClass::new("none"),
            by_name: Mutex::default(),
        }
    }
}

impl ProxiedClasses {
    /// The series of `class` (a `[[limits]]` pattern, or `default`: as many as the policy has rules).
    pub(super) fn get(&self, class: &str) -> Arc<ProxiedClass> {
        let mut by_name = self.by_name.lock().unwrap_or_else(PoisonError::into_inner);
        match by_name.get(class) {
            Some(found) => found.clone(),
            None => by_name
                .entry(class.into())
                .or_insert_with(|| ProxiedClass::new(class))
                .clone(),
        }
    }
}
