//! [`Releaser`]: every release that runs in the background (of dropped permits, of admissions given up
//! while the store decided, of releases cut short), retried while the store is away, until the lease
//! would have ended anyway (the store then reclaims it by itself). One task per limiter.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures_util::stream::{FuturesUnordered, StreamExt};
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;

use crate::id::PermitId;
use crate::store::{Keys, Store};

/// Releases waiting for the store at once; past this, dropped permits are left to their leases.
const MAX_PENDING: usize = 65_536;
/// The first wait before a failed release is tried again; it doubles up to [`MAX_RETRY_DELAY`].
const FIRST_RETRY_DELAY: Duration = Duration::from_millis(20);
const MAX_RETRY_DELAY: Duration = Duration::from_secs(2);

/// The way into the limiter's release task.
#[derive(Clone)]
pub(super) struct Releaser {
    queue: mpsc::UnboundedSender<Job>,
    pending: Arc<AtomicUsize>,
}

enum Job {
    Release {
        keys: Keys,
        id: PermitId,
        give_up: Instant,
    },
    /// Answered once every release queued before it has ended.
    Flush(oneshot::Sender<()>),
}

impl Releaser {
    /// Starts the task on the current runtime; it ends once every handle is gone and its releases are done.
    pub(super) fn start<S: Store>(store: S) -> Self {
        let (queue, jobs) = mpsc::unbounded_channel();
        let pending = Arc::new(AtomicUsize::new(0));
        tokio::spawn(run(store, jobs, pending.clone()));
        Self { queue, pending }
    }

    /// Releases the lease `id` of `keys` in the background.
    pub(super) fn release(&self, keys: Keys, id: PermitId, lease_ms: u64) {
        if self.pending.fetch_add(1, Ordering::AcqRel) >= MAX_PENDING {
            self.pending.fetch_sub(1, Ordering::AcqRel);
            tracing::warn!(key = %keys[0], %id, "too many releases pending; leaving this one to its lease");
            return;
        }
        let give_up = Instant::now() + Duration::from_millis(lease_ms);
        if self.queue.send(Job::Release { keys, id, give_up }).is_err() {
            self.pending.fetch_sub(1, Ordering::AcqRel);
        }
    }

    /// Waits, up to `within`, until the releases queued so far have ended; false if they had not.
    pub(super) async fn flush(&self, within: Duration) -> bool {
        let (done, flushed) = oneshot::channel();
        if self.queue.send(Job::Flush(done)).is_err() {
            return true;
        }
        matches!(tokio::time::timeout(within, flushed).await, Ok(Ok(())))
    }
}

async fn run<S: Store>(
    store: S,
    mut jobs: mpsc::UnboundedReceiver<Job>,
    pending: Arc<AtomicUsize>,
) {
    let mut running = FuturesUnordered::new();
    let mut flushes = Vec::new();
    loop {
        tokio::select! {
            job = jobs.recv() => match job {
                Some(Job::Release { keys, id, give_up }) => running.push(release(&store, keys, id, give_up)),
                Some(Job::Flush(done)) => flushes.push(done),
                None => break,
            },
            Some(()) = running.next(), if !running.is_empty() => {
                pending.fetch_sub(1, Ordering::AcqRel);
            }
        }
        if running.is_empty() {
            for done in flushes.drain(..) {
                let _ = done.send(());
            }
        }
    }
    while running.next().await.is_some() {}
}

/// One release, tried again after transient failures while its lease lasts.
async fn release<S: Store>(store: &S, keys: Keys, id: PermitId, give_up: Instant) {
    let mut delay = FIRST_RETRY_DELAY;
    loop {
        match store.release(&keys, &id).await {
            Ok(_) => return,
            Err(error) if error.is_transient() && Instant::now() + delay < give_up => {
                tracing::debug!(%error, key = %keys[0], "release failed; retrying");
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(MAX_RETRY_DELAY);
            }
            Err(error) => {
                tracing::warn!(%error, key = %keys[0], %id, "release failed; the lease will expire");
                return;
            }
        }
    }
}

/// A release (or an admission) not yet answered by the store: while `armed`, dropping it releases the
/// lease in the background.
pub(super) struct Unfinished {
    releaser: Releaser,
    pub(super) keys: Keys,
    pub(super) id: PermitId,
    lease_ms: u64,
    pub(super) armed: bool,
}

impl Unfinished {
    pub(super) fn new(releaser: &Releaser, keys: Keys, id: PermitId, lease_ms: u64) -> Self {
        Self {
            releaser: releaser.clone(),
            keys,
            id,
            lease_ms,
            armed: true,
        }
    }
}

impl Drop for Unfinished {
    fn drop(&mut self) {
        if self.armed {
            self.releaser
                .release(self.keys.clone(), self.id.clone(), self.lease_ms);
        }
    }
}
