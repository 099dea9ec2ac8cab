//! What the limiter does when the store cannot answer: a configured [`FailurePolicy`], and a short
//! circuit breaker so that an outage costs one failed round trip per interval, not one per request.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use crate::clock::millis;

/// How long after a transient store failure admissions skip the store and apply the policy directly.
pub(crate) const RETRY_STORE_AFTER: Duration = Duration::from_millis(200);

/// What to do with an admission when the store is unavailable (a transient [`crate::StoreError`]).
///
/// Whatever the policy, the limiter goes back to the store by itself: at most
/// 200 ms after a failure, the next admission asks the store again.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum FailurePolicy {
    /// Refuse: [`crate::AcquireError::Store`] (HTTP 503 `store_unavailable`). Never over the limit.
    #[default]
    FailClosed,
    /// Admit everything, uncounted: availability over the limit.
    FailOpen,
    /// Until the store is back, admit under a cap per key counted in this process alone (N processes: N caps).
    FailOpenLocal {
        /// The per-process, per-key cap while the store is away (> 0).
        limit: u32,
    },
}

/// Remembers a recent store failure.
#[derive(Debug, Default)]
pub(crate) struct Breaker {
    /// Until when (limiter clock, ms) to skip the store; 0 = closed.
    open_until_ms: AtomicU64,
    /// Never trips ([`crate::LimiterBuilder::store_breaker`]).
    off: bool,
}

impl Breaker {
    /// Reads the clock only when the breaker has tripped at some point: admissions pay one load.
    pub(crate) fn is_open(&self, now_ms: impl FnOnce() -> u64) -> bool {
        match self.open_until_ms.load(Ordering::Relaxed) {
            0 => false,
            until => now_ms() < until,
        }
    }

    pub(crate) fn trip(&self, now_ms: u64) {
        if self.off {
            return;
        }
        self.open_until_ms.store(
            now_ms.saturating_add(millis(RETRY_STORE_AFTER)),
            Ordering::Relaxed,
        );
    }

    /// A breaker that never trips when `off`.
    pub(crate) fn new(off: bool) -> Self {
        Self {
            open_until_ms: AtomicU64::new(0),
            off,
        }
    }

    pub(crate) fn reset(&self) {
        if self.open_until_ms.load(Ordering::Relaxed) != 0 {
            self.open_until_ms.store(0, Ordering::Relaxed);
        }
    }
}
