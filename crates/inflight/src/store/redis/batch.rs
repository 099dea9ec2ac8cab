//! Admissions and releases go to Redis in batches: what is waiting when a batch leaves rides together in
//! one call of `batch.lua`. A script call costs Redis far more than the few commands in it, so under load
//! this multiplies what one Redis can admit; with little load a batch is one operation and nothing waits.
//!
//! One dispatcher task per store (shared by its clones) forms the batches and drives them. At most
//! [`IN_FLIGHT`] batches are out at once: while they are, new operations queue, and the next batch takes
//! them all.

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;

use futures_util::stream::{FuturesUnordered, StreamExt};
use redis::aio::ConnectionManager;
use tokio::sync::{mpsc, oneshot};

use super::keys::KeyNames;
use super::scripts;
use crate::error::StoreError;
use crate::policy::Policy;

/// Batches sent and not yet answered, at most.
const IN_FLIGHT: usize = 2;
/// Operations in one batch, at most.
const MAX_BATCH: usize = 128;

/// One operation for `batch.lua`.
pub(super) enum Op {
    Acquire {
        names: KeyNames,
        id: String,
        weight: u32,
        lease_ms: u64,
        policy: Policy,
    },
    Release {
        names: KeyNames,
        id: String,
    },
}

struct Job {
    op: Op,
    reply: oneshot::Sender<Result<Vec<i64>, StoreError>>,
}

/// The way into the dispatcher.
pub(super) struct Batcher {
    jobs: mpsc::UnboundedSender<Job>,
}

impl Batcher {
    /// Starts the dispatcher (inside a Tokio runtime).
    pub(super) fn start(conn: ConnectionManager, clock_offset_ms: Arc<AtomicI64>) -> Self {
        let (jobs, queue) = mpsc::unbounded_channel();
        tokio::spawn(dispatch(queue, conn, clock_offset_ms));
        Self { jobs }
    }

    /// Runs `op` in the next batch; its reply from `batch.lua`.
    pub(super) async fn run(&self, op: Op) -> Result<Vec<i64>, StoreError> {
        let (reply, answer) = oneshot::channel();
        self.jobs
            .send(Job { op, reply })
            .map_err(|_| StoreError::Unavailable("the store's dispatcher has stopped".into()))?;
        answer
            .await
            .map_err(|_| StoreError::Unavailable("the store's dispatcher has stopped".into()))?
    }
}

async fn dispatch(
    mut queue: mpsc::UnboundedReceiver<Job>,
    conn: ConnectionManager,
    offset: Arc<AtomicI64>,
) {
    let mut in_flight = FuturesUnordered::new();
    let mut open = true;
    loop {
        tokio::select! {
            biased;
            Some(()) = in_flight.next(), if !in_flight.is_empty() => {}
            // Only with a batch slot free: what arrives meanwhile waits and joins the next batch.
            job = queue.recv(), if open && in_flight.len() < IN_FLIGHT => match job {
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
    match send(&mut conn, offset, &jobs).await {
        Ok(replies) if replies.len() == jobs.len() => {
            for (job, reply) in jobs.into_iter().zip(replies) {
                let _ = job.reply.send(Ok(reply));
            }
        }
        Ok(replies) => {
            let error = StoreError::Protocol(format!(
                "{} replies to {} operations",
                replies.len(),
                jobs.len()
            ));
            for job in jobs {
                let _ = job.reply.send(Err(error.clone()));
            }
        }
        Err(error) => {
            for job in jobs {
                let _ = job.reply.send(Err(error.clone()));
            }
        }
    }
}

async fn send(
    conn: &mut ConnectionManager,
    offset: i64,
    jobs: &[Job],
) -> Result<Vec<Vec<i64>>, StoreError> {
    let mut invocation = scripts::BATCH.prepare_invoke();
    invocation.arg(offset);
    for job in jobs {
        match &job.op {
            Op::Acquire {
                names,
                id,
                weight,
                lease_ms,
                policy,
            } => {
                invocation
                    .key(names.leases())
                    .key(names.weights())
                    .key(names.limit())
                    .arg("a")
                    .arg(id)
                    .arg(weight)
                    .arg(lease_ms)
                    .arg(policy.default_limit)
                    .arg(policy.max_limit);
            }
            Op::Release { names, id } => {
                invocation
                    .key(names.leases())
                    .key(names.weights())
                    .key(names.limit())
                    .arg("r")
                    .arg(id)
                    .arg(0)
                    .arg(0)
                    .arg(0)
                    .arg(0);
            }
        }
    }
    Ok(invocation.invoke_async(conn).await?)
}
