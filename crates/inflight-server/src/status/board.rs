//! One worker's status board: what the pages show and who may see them, their watchers, and the last
//! minute of the worker's counters.

use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use inflight::{AnyStore, Limiter};
use tokio::sync::{watch, Notify, Semaphore};

use super::ring::Ring;
use crate::auth::Tokens;
use crate::metrics::Metrics;

/// The most pages that may watch one worker's events at once.
pub const MAX_CLIENTS: usize = 32;

/// One worker's status page: what it shows (read from the worker's limiter and the server's metrics),
/// who may see it, its watchers, the last minute of its counters.
pub struct Board {
    pub(super) limiter: Limiter<AnyStore>,
    pub(super) metrics: Metrics,
    pub(super) tokens: Tokens,
    pub(super) clients: Arc<Semaphore>,
    /// How long one watcher's stream lasts (`--status-stream-lifetime`).
    pub(super) stream_lifetime: Duration,
    ring: Mutex<Ring>,
    /// The JSON the pages show now ("" before the first).
    pub(super) snapshot: watch::Sender<Arc<str>>,
    /// A new page: publish at once rather than at the next second.
    pub(super) wake: Arc<Notify>,
    pub(super) started: AtomicBool,
}

impl Board {
    /// The board of a worker with this limiter, the server's metrics, these tokens, and streams that
    /// last `stream_lifetime` each.
    pub fn new(
        limiter: Limiter<AnyStore>,
        metrics: Metrics,
        tokens: Tokens,
        stream_lifetime: Duration,
    ) -> Self {
        Self {
            limiter,
            metrics,
            tokens,
            clients: Arc::new(Semaphore::new(MAX_CLIENTS)),
            stream_lifetime,
            ring: Mutex::default(),
            snapshot: watch::Sender::new(Arc::from("")),
            wake: Arc::default(),
            started: AtomicBool::new(false),
        }
    }

    /// How many pages watch the events now.
    pub fn clients(&self) -> usize {
        MAX_CLIENTS - self.clients.available_permits()
    }

    /// The JSON the pages are shown now (empty before the first update).
    pub fn snapshot(&self) -> Arc<str> {
        self.snapshot.borrow().clone()
    }

    pub(super) fn ring(&self) -> MutexGuard<'_, Ring> {
        self.ring.lock().unwrap_or_else(PoisonError::into_inner)
    }
}
