//! Admissions and releases go to Redis in batches: what is waiting when a batch leaves rides together in
//! one call of `batch.lua`; with little load a batch is one operation and nothing waits.
//!
//! One dispatcher task per store (shared by its clones) sends the batches, at most `pipeline` at once
//! (`RedisStoreBuilder::pipeline`); meanwhile new operations queue, and the next batch takes them all.
//! On a Redis Cluster a batch is cut by slot: one call per slot it touches, sent together; every
//! operation reaching this module has all its keys in one slot (`across.rs` splits the others).

use std::collections::HashMap;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use futures_util::stream::{FuturesUnordered, StreamExt};
use tokio::sync::{mpsc, oneshot};

use super::answer::Answer;
use super::connect::slot;
use super::connect::Conn;
use super::error::retried;
use super::records::{records, Op};
use super::scripts;
use crate::clock::millis;
use crate::error::StoreError;

/// Replicas that must acknowledge each batch (Redis `WAIT`) before it is answered, and the longest wait
/// for them; when fewer acknowledge in time the batch is answered anyway (its writes are on the primary).
#[derive(Clone, Copy, Debug)]
pub(super) struct Durability {
    pub(super) replicas: u32,
    pub(super) timeout: Duration,
}

/// Operations in one batch, at most.
const MAX_BATCH: usize = 128;

struct Job {
    op: Op,
    reply: oneshot::Sender<Result<Reply, StoreError>>,
}

/// What `batch.lua` answered one operation: an admission's answer, or whether a release, an undo or a
/// leave changed anything.
enum Reply {
    Admission(Answer),
    Done(bool),
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
    /// Starts the dispatcher on the current runtime, with at most `pipeline` (1 or more) batches out.
    pub(super) fn start(
        conn: Conn,
        offset: Arc<AtomicI64>,
        pipeline: usize,
        wait: Option<Durability>,
    ) -> Self {
        let (jobs, queue) = mpsc::unbounded_channel();
        tokio::spawn(dispatch(queue, conn, offset, pipeline, wait));
        Self { jobs }
    }

    /// Runs an admission in the next batch.
    pub(super) async fn admit(&self, op: Op) -> Result<Answer, StoreError> {
        match self.send(op).await? {
            Reply::Admission(answer) => Ok(answer),
            Reply::Done(_) => Err(StoreError::Protocol(
                "an admission answered one number".into(),
            )),
        }
    }

    /// Runs a release, an undo or a leave in the next batch: whether it changed anything.
    pub(super) async fn run(&self, op: Op) -> Result<bool, StoreError> {
        match self.send(op).await? {
            Reply::Done(done) => Ok(done),
            Reply::Admission(_) => Err(StoreError::Protocol(
                "a release answered an admission".into(),
            )),
        }
    }

    async fn send(&self, op: Op) -> Result<Reply, StoreError> {
        let (reply, answer) = oneshot::channel();
        self.jobs.send(Job { op, reply }).map_err(|_| stopped())?;
        answer.await.map_err(|_| stopped())?
    }
}

async fn dispatch(
    mut queue: mpsc::UnboundedReceiver<Job>,
    conn: Conn,
    offset: Arc<AtomicI64>,
    pipeline: usize,
    wait: Option<Durability>,
) {
    let passed = Passed::default();
    let mut in_flight = FuturesUnordered::new();
    let mut open = true;
    loop {
        tokio::select! {
            biased;
            Some(()) = in_flight.next(), if !in_flight.is_empty() => {}
            // Only with a batch slot free: what arrives meanwhile waits and joins the next batch.
            job = queue.recv(), if open && in_flight.len() < pipeline => match job {
                Some(first) => {
                    let mut jobs = vec![first];
                    while jobs.len() < MAX_BATCH {
                        match queue.try_recv() {
                            Ok(job) => jobs.push(job),
                            Err(_) => break,
                        }
                    }
                    let offset = offset.load(Ordering::Relaxed);
                    in_flight.push(run(conn.clone(), offset, jobs, wait, &passed));
                }
                None => open = false,
            },
            else => return,
        }
    }
}

/// Sends one batch (one call per slot on a cluster) and hands each operation its reply.
async fn run(conn: Conn, offset: i64, jobs: Vec<Job>, wait: Option<Durability>, passed: &Passed) {
    if !conn.is_cluster() {
        return run_one(conn, offset, jobs, wait, passed).await;
    }
    let mut slots: HashMap<u16, Vec<Job>> = HashMap::new();
    for job in jobs {
        let slot = slot(job.op.names()[0].tag().as_bytes());
        slots.entry(slot).or_default().push(job);
    }
    futures_util::future::join_all(
        slots
            .into_values()
            .map(|jobs| run_one(conn.clone(), offset, jobs, wait, passed)),
    )
    .await;
}

/// Sends one call of `batch.lua` and hands each operation its reply. A lone operation `lone.lua` may
/// take goes there first, and to `batch.lua` when it answers nothing (the manifest's `lone`), unless
/// `lone.lua` passed on its key lately.
async fn run_one(
    conn: Conn,
    offset: i64,
    jobs: Vec<Job>,
    wait: Option<Durability>,
    passed: &Passed,
) {
    let expected: usize = jobs.iter().map(|job| job.op.reply_len()).sum();
    if let [job] = jobs.as_slice() {
        let tag = job.op.names()[0].tag();
        if job.op.lone() && passed.may_take(tag) {
            let invocation = &records(&scripts::LONE, offset, jobs.iter().map(|job| &job.op));
            match retried(|| send(conn.clone(), invocation, wait)).await {
                Ok(replies) if replies.is_empty() => passed.note(tag),
                replies => return answer(jobs, replies, expected),
            }
        }
    }
    let invocation = &records(&scripts::BATCH, offset, jobs.iter().map(|job| &job.op));
    let replies = retried(|| send(conn.clone(), invocation, wait)).await;
    answer(jobs, replies, expected);
}

/// Keys `lone.lua` passed on lately (a queue, mostly): their next [`Passed::SKIP`] lone calls go straight
/// to `batch.lua`, sparing each a round trip that would pass again. A hint only: either way the answer
/// is the same.
#[derive(Default)]
struct Passed(Mutex<HashMap<String, u32>>);

impl Passed {
    const SKIP: u32 = 64;
    /// Keys remembered at most: past it, all are forgotten at once.
    const MOST: usize = 1024;

    /// Whether `lone.lua` may take a call on the key of this hash tag (counting the skipped ones down).
    fn may_take(&self, tag: &str) -> bool {
        let mut keys = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        let Some(left) = keys.get_mut(tag) else {
            return true;
        };
        *left -= 1;
        if *left == 0 {
            keys.remove(tag);
        }
        false
    }

    fn note(&self, tag: &str) {
        let mut keys = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        if keys.len() >= Self::MOST {
            keys.clear();
        }
        keys.insert(tag.to_owned(), Self::SKIP);
    }
}

/// Hands each operation its reply from the script's numbers.
fn answer(jobs: Vec<Job>, replies: Result<Vec<i64>, StoreError>, expected: usize) {
    let replies = match replies {
        Ok(replies) if replies.len() == expected => replies,
        Ok(replies) => {
            let error = format!(
                "{} numbers in reply to {} operations",
                replies.len(),
                jobs.len()
            );
            return fail(jobs, StoreError::Protocol(error));
        }
        Err(error) => return fail(jobs, error),
    };
    let mut rest = replies.as_slice();
    for job in jobs {
        let (mine, others) = rest.split_at(job.op.reply_len());
        rest = others;
        let reply = match job.op {
            Op::Acquire { .. } => Answer::read(mine).map(Reply::Admission),
            _ => Ok(Reply::Done(mine == [1])),
        };
        let _ = job.reply.send(reply);
    }
}

/// Runs the batch's script, then (when asked) waits for its replicas.
async fn send(
    mut conn: Conn,
    invocation: &redis::ScriptInvocation<'_>,
    wait: Option<Durability>,
) -> redis::RedisResult<Vec<i64>> {
    let Some(wait) = wait else {
        return invocation.invoke_async(&mut conn).await;
    };
    let mut pipe = redis::pipe();
    pipe.invoke_script(invocation)
        .cmd("WAIT")
        .arg(wait.replicas)
        .arg(millis(wait.timeout).max(1));
    let sent: redis::RedisResult<(Vec<i64>, u32)> = pipe.query_async(&mut conn).await;
    let (replies, acknowledged) = match sent {
        // A server without the script (restarted, promoted): loaded, then sent again.
        Err(error)
            if error.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript) =>
        {
            invocation.load_async(&mut conn).await?;
            pipe.query_async(&mut conn).await?
        }
        sent => sent?,
    };
    if acknowledged < wait.replicas {
        tracing::debug!(
            acknowledged,
            wanted = wait.replicas,
            "fewer replicas than asked acknowledged a batch in time"
        );
    }
    Ok(replies)
}

fn fail(jobs: Vec<Job>, error: StoreError) {
    for job in jobs {
        let _ = job.reply.send(Err(error.clone()));
    }
}
