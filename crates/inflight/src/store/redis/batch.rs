//! Admissions and releases go to Redis in batches: what is waiting when a batch leaves rides together in
//! one call of `batch.lua`. A script call costs Redis far more than the few commands in it, so under load
//! this multiplies what one Redis can admit; with little load a batch is one operation and nothing waits.
//!
//! One dispatcher task per store (shared by its clones), and with `batches_per_runtime` one more for each
//! runtime that batches its own, forms the batches and drives them. At most
//! `pipeline` batches are out at once (`RedisStoreBuilder::pipeline`, [`DEFAULT_PIPELINE`]): while they
//! are, new operations queue, and the next batch takes them all.

use std::collections::HashMap;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;

use futures_util::stream::{FuturesUnordered, StreamExt};
use redis::aio::ConnectionManager;
use tokio::sync::{mpsc, oneshot};

use super::keys::{KeyNames, Member};
use super::scripts;
use crate::error::StoreError;
use crate::id::PermitId;
use crate::policy::Policy;
use crate::store::ReleaseDone;

/// Batches sent and not yet answered, at most, unless the builder says otherwise. Measured side by side
/// (`inflight bench`, 16 to 256 tasks) against 2: the same at 64 tasks, steadier at 256.
pub(super) const DEFAULT_PIPELINE: usize = 3;
/// Operations in one batch, at most.
const MAX_BATCH: usize = 128;

/// One operation for `batch.lua`.
pub(super) enum Op {
    Acquire {
        names: KeyNames,
        id: PermitId,
        weight: u32,
        lease_ms: u64,
        policy: Policy,
    },
    Release {
        names: KeyNames,
        id: PermitId,
    },
}

impl Op {
    fn names(&self) -> &KeyNames {
        match self {
            Op::Acquire { names, .. } | Op::Release { names, .. } => names,
        }
    }

    /// How many numbers `batch.lua` answers it with.
    fn reply_len(&self) -> usize {
        match self {
            Op::Acquire { .. } => 5,
            Op::Release { .. } => 1,
        }
    }
}

/// An admission's terms as `batch.lua` reads them: `weight lease_ms default_limit max_limit`.
struct Terms<'a> {
    weight: u32,
    lease_ms: u64,
    policy: &'a Policy,
}

impl redis::ToRedisArgs for Terms<'_> {
    fn write_redis_args<W: ?Sized + redis::RedisWrite>(&self, out: &mut W) {
        out.write_arg_fmt(format_args!(
            "{} {} {} {}",
            self.weight, self.lease_ms, self.policy.default_limit, self.policy.max_limit
        ));
    }
}

/// What `batch.lua` answered one operation (a release uses the first number only).
pub(super) type Reply = [i64; 5];

struct Job {
    op: Op,
    reply: Answer,
}

/// Where an operation's reply goes: to a caller waiting for it, or, for a queued release, to the function
/// called with its outcome.
enum Answer {
    To(oneshot::Sender<Result<Reply, StoreError>>),
    Released(Released),
}

/// A queued release's `done`; dropped uncalled (its dispatcher gone, say with the runtime it ran on), it is
/// called with an error instead, so that whoever queued the release can try again elsewhere.
struct Released(Option<ReleaseDone>);

impl Drop for Released {
    fn drop(&mut self) {
        if let Some(done) = self.0.take() {
            done(Err(stopped()));
        }
    }
}

impl Answer {
    fn send(self, reply: Result<Reply, StoreError>) {
        match self {
            Answer::To(waiting) => {
                let _ = waiting.send(reply);
            }
            Answer::Released(mut released) => {
                if let Some(done) = released.0.take() {
                    done(reply.map(|[held, ..]| held == 1));
                }
            }
        }
    }
}

fn stopped() -> StoreError {
    StoreError::Unavailable("the store's dispatcher has stopped".into())
}

/// The way into the dispatcher.
#[derive(Clone)]
pub(super) struct Batcher {
    jobs: mpsc::UnboundedSender<Job>,
}

impl Batcher {
    /// True once its dispatcher has stopped (with the runtime it ran on).
    pub(super) fn is_closed(&self) -> bool {
        self.jobs.is_closed()
    }

    /// Starts the dispatcher on `runtime`, with at most `pipeline` (1 or more) batches out at once.
    pub(super) fn start(
        runtime: &tokio::runtime::Handle,
        conn: ConnectionManager,
        clock_offset_ms: Arc<AtomicI64>,
        pipeline: usize,
    ) -> Self {
        let (jobs, queue) = mpsc::unbounded_channel();
        runtime.spawn(dispatch(queue, conn, clock_offset_ms, pipeline));
        Self { jobs }
    }

    /// Runs `op` in the next batch; its reply from `batch.lua`.
    pub(super) async fn run(&self, op: Op) -> Result<Reply, StoreError> {
        let (reply, answer) = oneshot::channel();
        self.jobs
            .send(Job {
                op,
                reply: Answer::To(reply),
            })
            .map_err(|_| stopped())?;
        answer.await.map_err(|_| stopped())?
    }

    /// Runs the release `op` in the next batch and calls `done` with whether the lease was held, in the
    /// dispatcher's task; with an error instead if the dispatcher has stopped, or stops with `op` still
    /// queued (then wherever the operation is dropped).
    pub(super) fn queue_release(&self, op: Op, done: ReleaseDone) {
        // Not sent: dropped here, and `done` is told.
        let _ = self.jobs.send(Job {
            op,
            reply: Answer::Released(Released(Some(done))),
        });
    }
}

async fn dispatch(
    mut queue: mpsc::UnboundedReceiver<Job>,
    conn: ConnectionManager,
    offset: Arc<AtomicI64>,
    pipeline: usize,
) {
    let mut in_flight = FuturesUnordered::new();
    let mut open = true;
    loop {
        tokio::select! {
            biased;
            Some(()) = in_flight.next(), if !in_flight.is_empty() => {}
            // Only with a batch slot free: what arrives meanwhile waits and joins the next batch.
            job = queue.recv(), if open && in_flight.len() < pipeline => match job {
                Some(first) => {
                    let mut jobs = Vec::with_capacity(16);
                    jobs.push(first);
                    while jobs.len() < MAX_BATCH {
                        match queue.try_recv() {
                            Ok(job) => jobs.push(job),
                            Err(_) => break,
                        }
                    }
                    in_flight.push(run(conn.clone(), offset.load(Ordering::SeqCst), jobs));
                }
                None => open = false,
            },
            else => return,
        }
    }
}

/// Sends one batch and hands each operation its reply.
async fn run(mut conn: ConnectionManager, offset: i64, jobs: Vec<Job>) {
    let expected: usize = jobs.iter().map(|job| job.op.reply_len()).sum();
    match send(&mut conn, offset, &jobs).await {
        Ok(replies) if replies.len() == expected => {
            let mut rest = replies.as_slice();
            for job in jobs {
                let (mine, others) = rest.split_at(job.op.reply_len());
                rest = others;
                let mut reply = Reply::default();
                reply[..mine.len()].copy_from_slice(mine);
                job.reply.send(Ok(reply));
            }
        }
        Ok(replies) => {
            let error = StoreError::Protocol(format!(
                "{} numbers in reply to {} operations",
                replies.len(),
                jobs.len()
            ));
            for job in jobs {
                job.reply.send(Err(error.clone()));
            }
        }
        Err(error) => {
            for job in jobs {
                job.reply.send(Err(error.clone()));
            }
        }
    }
}

/// One `batch.lua` call: each user key's names once, then the operations, each pointing at its key.
async fn send(
    conn: &mut ConnectionManager,
    offset: i64,
    jobs: &[Job],
) -> Result<Vec<i64>, StoreError> {
    let mut invocation = scripts::BATCH.prepare_invoke();
    invocation.arg(offset);
    let mut places: HashMap<&str, usize> = HashMap::new();
    for job in jobs {
        let names = job.op.names();
        let next = places.len() + 1;
        let place = *places.entry(names.tag()).or_insert_with(|| {
            invocation
                .key(names.leases())
                .key(names.weights())
                .key(names.limit());
            next
        });
        match &job.op {
            Op::Acquire {
                id,
                weight,
                lease_ms,
                policy,
                ..
            } => {
                invocation.arg(place).arg(Member(id)).arg(Terms {
                    weight: *weight,
                    lease_ms: *lease_ms,
                    policy,
                });
            }
            Op::Release { id, .. } => {
                invocation.arg(-(place as i64)).arg(Member(id));
            }
        }
    }
    Ok(invocation.invoke_async(conn).await?)
}
