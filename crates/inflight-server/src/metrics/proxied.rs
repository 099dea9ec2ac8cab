//! The labels of `inflight_proxy_requests_total`: what became of a request, and the class of its key.

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
