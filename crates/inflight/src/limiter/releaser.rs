//! [`Releaser`]: every release that runs in the background (of dropped permits, of admissions given up
//! while the store decided, of releases cut short), retried while the store is away, until the lease
//! would have ended anyway (the store then reclaims it by itself). One task per limiter.
//!
//! A release is started where it is asked for, before that call returns (an in-process store finishes it
//! there; the Redis store has queued it for its next batch), so that a later admission of the same id
//! from this process reaches the store after it. Only what is left to wait for goes to the task.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use futures_util::stream::{FuturesUnordered, StreamExt};
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;

use crate::error::StoreError;
use crate::id::PermitId;
use crate::permit::BoxFuture;
use crate::store::{Keys, Store};

/// Releases waiting for the store at once; past this, dropped permits are left to their leases.
const MAX_PENDING: usize = 65_536;
/// The first wait before a failed release is tried again; it doubles up to [`MAX_RETRY_DELAY`].
const FIRST_RETRY_DELAY: Duration = Duration::from_millis(20);
const MAX_RETRY_DELAY: Duration = Duration::from_secs(2);

/// Starts releases and hands what is left of them to the limiter's release task.
pub(super) struct Releaser<S> {
    /// Shared with the task: cloned into every release started here.
    store: Arc<S>,
    queue: mpsc::UnboundedSender<Job>,
    pending: Arc<AtomicUsize>,
}

impl<S: Store> Clone for Releaser<S> {
    fn clone(&self) -> Self {
        Self {
            store: self.store.clone(),
            queue: self.queue.clone(),
            pending: self.pending.clone(),
        }
    }
}

enum Job {
    Release {
        /// The first try, already started; `None` when it failed and a retry is due.
        started: Option<BoxFuture<'static, Result<bool, StoreError>>>,
        keys: Keys,
        id: PermitId,
        give_up: Instant,
    },
    /// Answered once every release queued before it has ended.
    Flush(oneshot::Sender<()>),
}

impl<S: Store> Releaser<S> {
    /// Starts the task on the current runtime; it ends once every handle is gone and its releases are done.
    pub(super) fn start(store: S) -> Self {
        let store = Arc::new(store);
        let (queue, jobs) = mpsc::unbounded_channel();
        let pending = Arc::new(AtomicUsize::new(0));
        tokio::spawn(run(store.clone(), jobs, pending.clone()));
        Self {
            store,
            queue,
            pending,
        }
    }

    /// Releases the lease `id` of `keys`: started now, finished in the background.
    pub(super) fn release(&self, keys: Keys, id: PermitId, lease_ms: u64) {
        if self.pending.fetch_add(1, Ordering::AcqRel) >= MAX_PENDING {
            self.pending.fetch_sub(1, Ordering::AcqRel);
            tracing::warn!(key = %keys[0], %id, "too many releases pending; leaving this one to its lease");
            return;
        }
        let (store, k, i) = (self.store.clone(), keys.clone(), id.clone());
        let mut started: BoxFuture<'static, _> =
            Box::pin(async move { store.release(&k, &i).await });
        // Polled once here, so that the store has it before this returns; the task polls it again with a
        // waker of its own.
        let started = match started
            .as_mut()
            .poll(&mut Context::from_waker(Waker::noop()))
        {
            Poll::Pending => Some(started),
            Poll::Ready(Err(error)) if error.is_transient() => None,
            Poll::Ready(outcome) => {
                self.pending.fetch_sub(1, Ordering::AcqRel);
                if let Err(error) = outcome {
                    tracing::warn!(%error, key = %keys[0], %id, "release failed; the lease will expire");
                }
                return;
            }
        };
        let give_up = Instant::now() + Duration::from_millis(lease_ms);
        let job = Job::Release {
            started,
            keys,
            id,
            give_up,
        };
        if self.queue.send(job).is_err() {
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
    store: Arc<S>,
    mut jobs: mpsc::UnboundedReceiver<Job>,
    pending: Arc<AtomicUsize>,
) {
    let mut running = FuturesUnordered::new();
    // The releases still running, by the order they came in, and the flushes waiting for those before them.
    let (mut open, mut flushes, mut next) = (BTreeSet::new(), Vec::<(u64, _)>::new(), 0u64);
    loop {
        tokio::select! {
            job = jobs.recv() => match job {
                Some(Job::Release { started, keys, id, give_up }) => {
                    running.push(finish(&*store, started, keys, id, give_up, next));
                    open.insert(next);
                    next += 1;
                }
                Some(Job::Flush(done)) => flushes.push((next, done)),
                None => break,
            },
            Some(seq) = running.next(), if !running.is_empty() => {
                open.remove(&seq);
                pending.fetch_sub(1, Ordering::AcqRel);
            }
        }
        let oldest = open.first().copied().unwrap_or(u64::MAX);
        let ready: Vec<_>;
        (ready, flushes) = flushes
            .into_iter()
            .partition(|(before, _)| *before <= oldest);
        for (_, done) in ready {
            let _ = done.send(());
        }
    }
    while running.next().await.is_some() {}
}

/// One release: its first try awaited, then tried again after transient failures while its lease lasts.
async fn finish<S: Store>(
    store: &S,
    started: Option<BoxFuture<'static, Result<bool, StoreError>>>,
    keys: Keys,
    id: PermitId,
    give_up: Instant,
    seq: u64,
) -> u64 {
    let mut delay = FIRST_RETRY_DELAY;
    let mut outcome = match started {
        Some(started) => started.await,
        None => Err(StoreError::Unavailable("the first try failed".into())),
    };
    loop {
        match outcome {
            Ok(_) => return seq,
            Err(error) if error.is_transient() && Instant::now() + delay < give_up => {
                tracing::debug!(%error, key = %keys[0], "release failed; retrying");
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(MAX_RETRY_DELAY);
            }
            Err(error) => {
                tracing::warn!(%error, key = %keys[0], %id, "release failed; the lease will expire");
                return seq;
            }
        }
        outcome = store.release(&keys, &id).await;
    }
}

/// A release (or an admission) not yet answered by the store: while `armed`, dropping it releases the
/// lease in the background.
pub(super) struct Unfinished<S: Store> {
    releaser: Releaser<S>,
    pub(super) keys: Keys,
    pub(super) id: PermitId,
    lease_ms: u64,
    pub(super) armed: bool,
}

impl<S: Store> Unfinished<S> {
    pub(super) fn new(releaser: &Releaser<S>, keys: Keys, id: PermitId, lease_ms: u64) -> Self {
        Self {
            releaser: releaser.clone(),
            keys,
            id,
            lease_ms,
            armed: true,
        }
    }
}

impl<S: Store> Drop for Unfinished<S> {
    fn drop(&mut self) {
        if self.armed {
            self.releaser
                .release(self.keys.clone(), self.id.clone(), self.lease_ms);
        }
    }
}
