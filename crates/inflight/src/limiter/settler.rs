//! [`Settler`]: the one owner of what dropped objects leave to settle (a permit's release, a
//! reservation's refund or commit), one task per limiter. Each settlement is started where it is asked
//! for, inside the limiter's runtime, before that call returns, so that a later admission of the same id
//! from this process reaches the store after it; the task finishes it, trying again after transient
//! failures until its deadline (past it the store settles by itself). [`Settler::flush`] waits at shutdown.

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
    /// The limiter's runtime: a settlement asked for off it (a plain thread) is started inside it.
    runtime: tokio::runtime::Handle,
}

/// A settlement for the task, and its first try, already started.
struct Job {
    started: BoxFuture<'static, Result<(), StoreError>>,
    deferred: Deferred,
    give_up: Instant,
}

impl Settler {
    /// Starts the task on the current runtime; it ends once every handle is gone and its work is done.
    pub(crate) fn start() -> Self {
        let (queue, jobs) = mpsc::unbounded_channel();
        let pending = Arc::new(AtomicUsize::new(0));
        let runtime = tokio::runtime::Handle::current();
        runtime.spawn(run(jobs, pending.clone()));
        Self {
            queue,
            pending,
            runtime,
        }
    }

    /// Settles in the background: started now (see the module's docs), finished by the task.
    pub(crate) fn settle(&self, deferred: Deferred) {
        // Closed: the limiter's runtime is gone (a try would find no timers); the store's deadline will.
        if self.queue.is_closed() {
            return;
        }
        if self.pending.fetch_add(1, Ordering::AcqRel) >= MAX_PENDING {
            self.pending.fetch_sub(1, Ordering::AcqRel);
            let Deferred { what, key, id, .. } = deferred;
            tracing::warn!(%key, %id, what, "too many settlements pending; leaving this one to the store's deadline");
            return;
        }
        // Off every runtime (a plain thread), inside the limiter's: the first try is still started here.
        let _inside = tokio::runtime::Handle::try_current()
            .is_err()
            .then(|| self.runtime.enter());
        let mut started = (deferred.attempt)();
        // Polled once here, so that the store has it before this returns; the task polls it again with a
        // waker of its own.
        match started
            .as_mut()
            .poll(&mut Context::from_waker(Waker::noop()))
        {
            Poll::Pending => {}
            Poll::Ready(Err(error)) if error.is_transient() => {
                started = Box::pin(std::future::ready(Err(error)));
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
    let mut outcome = started.await;
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
    pub(crate) fn new(settler: &Settler, deferred: Option<Deferred>) -> Self {
        Self {
            settler: settler.clone(),
            deferred,
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
