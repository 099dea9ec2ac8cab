//! [`Settler`]: the one owner of what dropped objects leave for the store to settle (a dropped permit's
//! release, a dropped reservation's refund or commit). One task per limiter.
//!
//! Each settlement is started where it is asked for, before that call returns (an in-process store
//! finishes it there; the Redis store has queued it for its next batch), so that a later admission of
//! the same id from this process reaches the store after it; only what is left to wait for goes to the
//! task. Where no Tokio runtime runs (a plain thread), the task starts it. A transient failure is tried
//! again, with a growing delay, until the settlement's deadline: past it the store settles by itself
//! (a lease expires, a reservation is refunded). [`Settler::flush`] waits for them at shutdown.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use futures_util::stream::{FuturesUnordered, StreamExt};
use tokio::sync::mpsc;
use tokio::time::Instant;

use crate::error::StoreError;
use crate::id::PermitId;
use crate::permit::BoxFuture;

/// Settlements waiting for the store at once; past this, what is dropped is left to the store's deadlines.
const MAX_PENDING: usize = 65_536;
/// The first wait before a failed settlement is tried again; it doubles up to [`MAX_RETRY_DELAY`].
const FIRST_RETRY_DELAY: Duration = Duration::from_millis(20);
const MAX_RETRY_DELAY: Duration = Duration::from_secs(2);

/// One try of a settlement: a store write that may be sent again (every one is idempotent by id).
pub(crate) type Attempt = Box<dyn Fn() -> BoxFuture<'static, Result<(), StoreError>> + Send>;

/// What is settled, for the logs: its kind, its (first) key and its id.
pub(crate) struct Deferred {
    pub(crate) what: &'static str,
    pub(crate) key: Arc<str>,
    pub(crate) id: PermitId,
    /// Past this, the store settles it by itself: tries stop.
    pub(crate) within: Duration,
    pub(crate) attempt: Attempt,
}

/// Starts settlements and hands what is left of them to the limiter's settlement task. Clones share it.
#[derive(Clone)]
pub(crate) struct Settler {
    queue: mpsc::UnboundedSender<Job>,
    pending: Arc<AtomicUsize>,
}

/// A settlement for the task; `started`: its first try (`None` where no runtime ran to start it).
struct Job {
    started: Option<BoxFuture<'static, Result<(), StoreError>>>,
    deferred: Deferred,
    give_up: Instant,
}

impl Settler {
    /// Starts the task on the current runtime; it ends once every handle is gone and its work is done.
    pub(crate) fn start() -> Self {
        let (queue, jobs) = mpsc::unbounded_channel();
        let pending = Arc::new(AtomicUsize::new(0));
        tokio::spawn(run(jobs, pending.clone()));
        Self { queue, pending }
    }

    /// Settles in the background: started now (see the module's docs), finished by the task.
    pub(crate) fn settle(&self, deferred: Deferred) {
        if self.pending.fetch_add(1, Ordering::AcqRel) >= MAX_PENDING {
            self.pending.fetch_sub(1, Ordering::AcqRel);
            let Deferred { what, key, id, .. } = deferred;
            tracing::warn!(%key, %id, what, "too many settlements pending; leaving this one to the store's deadline");
            return;
        }
        let mut started = None;
        if tokio::runtime::Handle::try_current().is_ok() {
            let mut first = (deferred.attempt)();
            // Polled once here, so that the store has it before this returns; the task polls it again
            // with a waker of its own.
            match first.as_mut().poll(&mut Context::from_waker(Waker::noop())) {
                Poll::Pending => started = Some(first),
                Poll::Ready(Err(error)) if error.is_transient() => {
                    started = Some(Box::pin(std::future::ready(Err(error))));
                }
                Poll::Ready(outcome) => {
                    self.pending.fetch_sub(1, Ordering::AcqRel);
                    if let Err(error) = outcome {
                        let Deferred { what, key, id, .. } = deferred;
                        tracing::warn!(%error, %key, %id, what, "not settled; the store's deadline will");
                    }
                    return;
                }
            }
        }
        let give_up = Instant::now() + deferred.within;
        let job = Job {
            started,
            deferred,
            give_up,
        };
        if self.queue.send(job).is_err() {
            self.pending.fetch_sub(1, Ordering::AcqRel);
        }
    }

    /// Waits, up to `within`, until no settlement is left to finish; false if some still were.
    pub(crate) async fn flush(&self, within: Duration) -> bool {
        let drained = async {
            while self.pending.load(Ordering::Acquire) > 0 {
                tokio::time::sleep(FIRST_RETRY_DELAY).await;
            }
        };
        tokio::time::timeout(within, drained).await.is_ok()
    }
}

async fn run(mut jobs: mpsc::UnboundedReceiver<Job>, pending: Arc<AtomicUsize>) {
    let mut running = FuturesUnordered::new();
    loop {
        tokio::select! {
            job = jobs.recv() => match job {
                Some(job) => running.push(finish(job)),
                None => break,
            },
            Some(()) = running.next(), if !running.is_empty() => {
                pending.fetch_sub(1, Ordering::AcqRel);
            }
        }
    }
    while running.next().await.is_some() {
        pending.fetch_sub(1, Ordering::AcqRel);
    }
}

/// One settlement: its first try awaited, then tried again after transient failures until its deadline.
async fn finish(job: Job) {
    let Job {
        started,
        deferred,
        give_up,
    } = job;
    let Deferred {
        what,
        key,
        id,
        attempt,
        ..
    } = deferred;
    let mut delay = FIRST_RETRY_DELAY;
    let mut outcome = match started {
        Some(started) => started.await,
        None => attempt().await,
    };
    loop {
        match outcome {
            Ok(()) => return,
            Err(error) if error.is_transient() && Instant::now() + delay < give_up => {
                tracing::debug!(%error, %key, what, "not settled; retrying");
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(MAX_RETRY_DELAY);
            }
            Err(error) => {
                tracing::warn!(%error, %key, %id, what, "not settled; the store's deadline will");
                return;
            }
        }
        outcome = attempt().await;
    }
}

/// A store write not yet answered: while armed, dropping it hands its settlement to the [`Settler`].
pub(crate) struct Unsettled {
    settler: Settler,
    deferred: Option<Deferred>,
}

impl Unsettled {
    pub(crate) fn new(settler: &Settler, deferred: Deferred, armed: bool) -> Self {
        Self {
            settler: settler.clone(),
            deferred: armed.then_some(deferred),
        }
    }

    /// Dropping it settles nothing any more, unless `still` says otherwise.
    pub(crate) fn disarm_unless(&mut self, still: bool) {
        if !still {
            self.deferred = None;
        }
    }
}

impl Drop for Unsettled {
    fn drop(&mut self) {
        if let Some(deferred) = self.deferred.take() {
            self.settler.settle(deferred);
        }
    }
}
