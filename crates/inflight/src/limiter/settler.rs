//! [`Settler`]: the one owner of what dropped objects leave for the store to settle: the release of a
//! dropped permit's lease (or of an admission given up while the store decided, or of a release cut
//! short), and the refund or commit of a dropped reservation. One task per limiter.
//!
//! Each settlement is started where it is asked for, before that call returns (an in-process store
//! finishes it there; the Redis store has queued it for its next batch), so that a later admission of
//! the same id from this process reaches the store after it; only what is left to wait for goes to the
//! task. Where no Tokio runtime runs (a plain thread), the task starts it. A transient failure is tried
//! again, with a growing delay, until the settlement's deadline: past it the store settles by itself
//! (a lease expires, a reservation is refunded). [`Settler::flush`] waits for them at shutdown.

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

enum Job {
    Settle {
        /// The first try, already started; `None` when it failed (a retry is due) or was not started.
        started: Option<BoxFuture<'static, Result<(), StoreError>>>,
        tried: bool,
        settlement: Deferred,
        give_up: Instant,
    },
    /// Answered once every settlement queued before it has ended.
    Flush(oneshot::Sender<()>),
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
    pub(crate) fn settle(&self, settlement: Deferred) {
        self.settle_started(settlement, None);
    }

    /// [`Settler::settle`], whose first try `started` is already on its way (a caller went away before
    /// its answer).
    pub(crate) fn settle_started(
        &self,
        settlement: Deferred,
        started: Option<BoxFuture<'static, Result<(), StoreError>>>,
    ) {
        if self.pending.fetch_add(1, Ordering::AcqRel) >= MAX_PENDING {
            self.pending.fetch_sub(1, Ordering::AcqRel);
            let Deferred { what, key, id, .. } = settlement;
            tracing::warn!(%key, %id, what, "too many settlements pending; leaving this one to the store's deadline");
            return;
        }
        let runs_here = tokio::runtime::Handle::try_current().is_ok();
        let mut started = match started {
            Some(started) => Some(started),
            None if runs_here => Some((settlement.attempt)()),
            None => None,
        };
        let tried = started.is_some();
        if let Some(first) = started.as_mut().filter(|_| runs_here) {
            // Polled once here, so that the store has it before this returns; the task polls it again
            // with a waker of its own.
            match first.as_mut().poll(&mut Context::from_waker(Waker::noop())) {
                Poll::Pending => {}
                Poll::Ready(Err(error)) if error.is_transient() => started = None,
                Poll::Ready(outcome) => {
                    self.pending.fetch_sub(1, Ordering::AcqRel);
                    if let Err(error) = outcome {
                        let Deferred { what, key, id, .. } = settlement;
                        tracing::warn!(%error, %key, %id, what, "not settled; the store's deadline will");
                    }
                    return;
                }
            }
        }
        let give_up = Instant::now() + settlement.within;
        let job = Job::Settle {
            started,
            tried,
            settlement,
            give_up,
        };
        if self.queue.send(job).is_err() {
            self.pending.fetch_sub(1, Ordering::AcqRel);
        }
    }

    /// Waits, up to `within`, until the settlements queued so far have ended; false if they had not.
    pub(crate) async fn flush(&self, within: Duration) -> bool {
        let (done, flushed) = oneshot::channel();
        if self.queue.send(Job::Flush(done)).is_err() {
            return true;
        }
        matches!(tokio::time::timeout(within, flushed).await, Ok(Ok(())))
    }
}

async fn run(mut jobs: mpsc::UnboundedReceiver<Job>, pending: Arc<AtomicUsize>) {
    let mut running = FuturesUnordered::new();
    // The settlements still running, by the order they came in, and the flushes waiting for those before.
    let (mut open, mut flushes, mut next) = (BTreeSet::new(), Vec::<(u64, _)>::new(), 0u64);
    loop {
        tokio::select! {
            job = jobs.recv() => match job {
                Some(Job::Settle { started, tried, settlement, give_up }) => {
                    running.push(finish(started, tried, settlement, give_up, next));
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

/// One settlement: its first try awaited, then tried again after transient failures until its deadline.
async fn finish(
    started: Option<BoxFuture<'static, Result<(), StoreError>>>,
    tried: bool,
    settlement: Deferred,
    give_up: Instant,
    seq: u64,
) -> u64 {
    let Deferred {
        what,
        key,
        id,
        attempt,
        ..
    } = settlement;
    let mut delay = FIRST_RETRY_DELAY;
    let mut outcome = match (started, tried) {
        (Some(started), _) => started.await,
        (None, false) => attempt().await,
        (None, true) => Err(StoreError::Unavailable("the first try failed".into())),
    };
    loop {
        match outcome {
            Ok(()) => return seq,
            Err(error) if error.is_transient() && Instant::now() + delay < give_up => {
                tracing::debug!(%error, %key, what, "not settled; retrying");
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(MAX_RETRY_DELAY);
            }
            Err(error) => {
                tracing::warn!(%error, %key, %id, what, "not settled; the store's deadline will");
                return seq;
            }
        }
        outcome = attempt().await;
    }
}

/// A store write not yet answered: while armed, dropping it hands the settlement to the [`Settler`].
pub(crate) struct Unsettled {
    settler: Settler,
    settlement: Option<Deferred>,
}

impl Unsettled {
    /// Armed when `armed`.
    pub(crate) fn new(settler: &Settler, settlement: Deferred, armed: bool) -> Self {
        Self {
            settler: settler.clone(),
            settlement: armed.then_some(settlement),
        }
    }

    /// Dropping it settles nothing any more, unless `still` says otherwise.
    pub(crate) fn disarm_unless(&mut self, still: bool) {
        if !still {
            self.settlement = None;
        }
    }
}

impl Drop for Unsettled {
    fn drop(&mut self) {
        if let Some(settlement) = self.settlement.take() {
            self.settler.settle(settlement);
        }
    }
}
