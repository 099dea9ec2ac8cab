//! Admissions and releases go to Redis in batches: what is waiting when a batch leaves rides together in
//! one call of `batch.lua`; with little load a batch is one operation and nothing waits.
//!
//! One dispatcher task per store (shared by its clones) sends the batches, at most `pipeline` at once
//! (`RedisStoreBuilder::pipeline`); meanwhile new operations queue, and the next batch takes them all.
//! On a Redis Cluster a batch is cut by slot: one call per slot it touches, sent together; every
//! operation reaching this module has all its keys in one slot (`across.rs` splits the others).

use std::collections::HashMap;
use std::fmt::Write;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures_util::stream::{FuturesUnordered, StreamExt};
use tokio::sync::{mpsc, oneshot};

use super::answer::Answer;
use super::connect::slot;
use super::connect::Conn;
use super::error::retried;
use super::naming::{KeyNames, Member};
use super::scripts;
use crate::clock::millis;
use crate::error::StoreError;
use crate::id::PermitId;
use crate::policy::ClassLimits;

/// Replicas that must acknowledge each batch (Redis `WAIT`) before it is answered, and the longest wait
/// for them; when fewer acknowledge in time the batch is answered anyway (its writes are on the primary).
#[derive(Clone, Copy, Debug)]
pub(super) struct Durability {
    pub(super) replicas: u32,
    pub(super) timeout: Duration,
}

/// Operations in one batch, at most.
const MAX_BATCH: usize = 128;

/// One operation for `batch.lua`.
pub(super) enum Op {
    Acquire {
        names: Vec<KeyNames>,
        id: PermitId,
        /// `weight lease_ms` and the limits of each key's class, as `batch.lua` reads them.
        terms: (u32, u64, Vec<ClassLimits>),
        /// The token the lease keeps: 0, the one the admission gets (across Cluster slots, the first
        /// slot's, so that one token names the permit's lease on every slot).
        keep: u64,
        /// The id was generated for this admission (`AcquireRequest::generated`).
        generated: bool,
        /// A waiter's ticket (`AcquireRequest::ticket`): kept in the refusing key's queue.
        wait: Option<WaitArgs>,
    },
    /// A waiter gives up its ticket on these keys; with its id (`handed`), a lease a release handed it
    /// is released when the ticket is no longer queued.
    Leave {
        names: Vec<KeyNames>,
        ticket: String,
        handed: Option<PermitId>,
    },
    /// A release of the lease the admission that got `token` (0: any) holds.
    Release {
        names: Vec<KeyNames>,
        id: PermitId,
        token: u64,
    },
    /// Undoes on these keys the admission that got `token`: puts back what the id held before it
    /// (`weight lease_ms token`; weight 0: nothing, the lease is removed).
    Undo {
        names: Vec<KeyNames>,
        id: PermitId,
        token: u64,
        before: [u64; 3],
    },
}

/// An admission's standing, as `batch.lua` takes it (flags 2 and 4): a waiter's ticket (`""`: none), its
/// priority and flow, and its keys' floors: `"p:slots p:slots;..."`, one group per key in order (`""`:
/// none).
pub(super) struct WaitArgs {
    pub(super) ticket: String,
    /// A release may hand the waiter the slot (`Ticket::handoff`; flags 8).
    pub(super) handoff: bool,
    pub(super) priority: u8,
    pub(super) flow: String,
    pub(super) flow_weight: u32,
    pub(super) lease_ms: u64,
    pub(super) floors: String,
}

impl Op {
    fn names(&self) -> &[KeyNames] {
        match self {
            Op::Acquire { names, .. }
            | Op::Release { names, .. }
            | Op::Undo { names, .. }
            | Op::Leave { names, .. } => names,
        }
    }

    /// How many numbers `batch.lua` answers it with.
    fn reply_len(&self) -> usize {
        match self {
            Op::Acquire { .. } => Answer::LEN,
            Op::Release { .. } | Op::Undo { .. } | Op::Leave { .. } => 1,
        }
    }

    /// Whether `lone.lua` may take it: an admission or a release on one key, the admission without a
    /// standing and keeping the token it gets.
    fn lone(&self) -> bool {
        match self {
            Op::Acquire {
                names, wait, keep, ..
            } => names.len() == 1 && wait.is_none() && *keep == 0,
            Op::Release { names, .. } => names.len() == 1,
            Op::Undo { .. } | Op::Leave { .. } => false,
        }
    }

    /// Its record's kind and flags (see `batch.lua`).
    fn kind(&self) -> (char, u8) {
        match self {
            Op::Acquire {
                generated, wait, ..
            } => {
                let standing = match wait {
                    Some(WaitArgs { floors, .. }) if !floors.is_empty() => 6,
                    Some(WaitArgs { handoff: true, .. }) => 10,
                    Some(_) => 2,
                    None => 0,
                };
                ('a', u8::from(*generated) | standing)
            }
            Op::Release { .. } => ('r', 0),
            Op::Undo { .. } => ('u', 0),
            Op::Leave { handed, .. } => ('l', if handed.is_some() { 8 } else { 0 }),
        }
    }
}

/// A record's head: its kind and flags (a hex digit), and the number of its keys when it has several
/// (`batch.lua`).
struct Head(char, u8, usize);

impl redis::ToRedisArgs for Head {
    fn write_redis_args<W: ?Sized + redis::RedisWrite>(&self, out: &mut W) {
        match self {
            Head(kind, flags, 1) => out.write_arg_fmt(format_args!("{kind}{flags:x}")),
            Head(kind, flags, n) => out.write_arg_fmt(format_args!("{kind}{flags:x}x{n}")),
        }
    }
}

/// An admission's terms and the token its lease keeps, as one argument written straight into the command.
struct Terms<'a>(&'a (u32, u64, Vec<ClassLimits>), u64);

impl redis::ToRedisArgs for Terms<'_> {
    fn write_redis_args<W: ?Sized + redis::RedisWrite>(&self, out: &mut W) {
        let ((weight, lease_ms, limits), keep) = (self.0, self.1);
        if let [limits] = limits.as_slice() {
            let (default_limit, max_limit) = (limits.default_limit, limits.max_limit);
            out.write_arg_fmt(format_args!(
                "{weight} {lease_ms} {keep} {default_limit} {max_limit}"
            ));
            return;
        }
        let mut terms = format!("{weight} {lease_ms} {keep}");
        for limits in limits {
            let (default_limit, max_limit) = (limits.default_limit, limits.max_limit);
            let _ = write!(terms, " {default_limit} {max_limit}");
        }
        out.write_arg(terms.as_bytes());
    }
}

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
                    in_flight.push(run(conn.clone(), offset.load(Ordering::Relaxed), jobs, wait));
                }
                None => open = false,
            },
            else => return,
        }
    }
}

/// Sends one batch (one call per slot on a cluster) and hands each operation its reply.
async fn run(conn: Conn, offset: i64, jobs: Vec<Job>, wait: Option<Durability>) {
    if !conn.is_cluster() {
        return run_one(conn, offset, jobs, wait).await;
    }
    let mut slots: HashMap<u16, Vec<Job>> = HashMap::new();
    for job in jobs {
        let slot = slot(job.op.names()[0].tag().as_bytes());
        slots.entry(slot).or_default().push(job);
    }
    futures_util::future::join_all(
        slots
            .into_values()
            .map(|jobs| run_one(conn.clone(), offset, jobs, wait)),
    )
    .await;
}

/// Sends one call of `batch.lua` and hands each operation its reply. A lone operation `lone.lua` may
/// take goes there first, and to `batch.lua` when it answers nothing (the manifest's `lone`).
async fn run_one(conn: Conn, offset: i64, jobs: Vec<Job>, wait: Option<Durability>) {
    let expected: usize = jobs.iter().map(|job| job.op.reply_len()).sum();
    if let [job] = jobs.as_slice() {
        if job.op.lone() {
            let invocation = &records(&scripts::LONE, offset, &jobs);
            match retried(|| send(conn.clone(), invocation, wait)).await {
                Ok(replies) if replies.is_empty() => {}
                replies => return answer(jobs, replies, expected),
            }
        }
    }
    let invocation = &records(&scripts::BATCH, offset, &jobs);
    let replies = retried(|| send(conn.clone(), invocation, wait)).await;
    answer(jobs, replies, expected);
}

/// The call of `script` with the batch's records (`batch.lua`).
fn records<'a>(
    script: &'a redis::Script,
    offset: i64,
    jobs: &[Job],
) -> redis::ScriptInvocation<'a> {
    let mut invocation = script.prepare_invoke();
    invocation.arg(offset);
    let mut places: HashMap<&str, usize> = HashMap::new();
    for job in jobs {
        let names = job.op.names();
        let (kind, flags) = job.op.kind();
        invocation.arg(Head(kind, flags, names.len()));
        for key in names {
            let next = places.len() + 1;
            let place = *places.entry(key.tag()).or_insert_with(|| {
                key.declare(&mut invocation);
                next
            });
            invocation.arg(place);
        }
        match &job.op {
            Op::Acquire {
                id,
                terms,
                keep,
                wait,
                ..
            } => {
                invocation.arg(Member(id)).arg(Terms(terms, *keep));
                if let Some(wait) = wait {
                    let level = format!("{}:{}", wait.priority, wait.flow_weight.max(1));
                    invocation
                        .arg(&wait.ticket)
                        .arg(level)
                        .arg(&wait.flow)
                        .arg(wait.lease_ms);
                    if !wait.floors.is_empty() {
                        invocation.arg(&wait.floors);
                    }
                }
            }
            Op::Release { id, token, .. } => {
                invocation.arg(Member(id)).arg(token);
            }
            Op::Undo {
                id, token, before, ..
            } => {
                let [weight, lease_ms, old] = before;
                invocation
                    .arg(Member(id))
                    .arg(token)
                    .arg(format!("{weight} {lease_ms} {old}"));
            }
            Op::Leave { ticket, handed, .. } => {
                invocation.arg(ticket);
                if let Some(id) = handed {
                    invocation.arg(Member(id));
                }
            }
        }
    }
    invocation
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
