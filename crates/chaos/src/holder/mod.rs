//! `inflight-chaos holder`: one process that acquires, holds a random short while and releases, over and
//! over from several tasks, writing every operation to its history. Kinds: the library (`rust`), an
//! `inflight serve` (`http`) and an `inflight proxy` (`proxy`).

mod http;
mod proxy;
mod rust;

pub(crate) use rust::{policy, token_of};

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::history::{History, PermitInfo};

/// The client a holder uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum Kind {
    /// The Rust library, on a Redis URL.
    Rust,
    /// `inflight serve`'s HTTP API (POST/DELETE /v1/permits).
    Http,
    /// Requests through `inflight proxy`, each holding its slot until its response ends.
    Proxy,
}

/// What a holder is told.
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct HolderArgs {
    /// The client.
    #[arg(long, value_enum)]
    pub(crate) kind: Kind,
    /// A store URL (rust), the API's base URL (http) or the proxy's (proxy).
    #[arg(long)]
    pub(crate) target: String,
    /// The upstream's address (proxy): where a request's end is signalled.
    #[arg(long)]
    pub(crate) upstream: Option<String>,
    /// The process name in the history.
    #[arg(long)]
    pub(crate) process: String,
    /// The history file.
    #[arg(long)]
    pub(crate) out: PathBuf,
    /// How long to keep acquiring.
    #[arg(long, default_value_t = 10_000)]
    pub(crate) duration_ms: u64,
    /// The lease of each permit.
    #[arg(long, default_value_t = 2_000)]
    pub(crate) lease_ms: u64,
    /// Concurrent tasks in this process.
    #[arg(long, default_value_t = 4)]
    pub(crate) tasks: usize,
    /// The longest a permit is held (each hold is random below it).
    #[arg(long, default_value_t = 200)]
    pub(crate) max_hold_ms: u64,
    /// Seed of the random choices.
    #[arg(long, default_value_t = 1)]
    pub(crate) seed: u64,
    /// The keys' mix: `single` (one key a permit), `multi` (some permits on two keys) or `wait`.
    #[arg(long, default_value = "multi")]
    pub(crate) mix: String,
    /// Proxy: drop the connection instead of reading the answer to its end (a disconnect storm).
    #[arg(long)]
    pub(crate) storm: bool,
    /// Rust: wait for a slot (`acquire` with a max wait, random from 100 ms up to this, never past the
    /// run's end), task 0 at priority 1, the tasks in flows by task; 0: `try_acquire`, no wait.
    #[arg(long, default_value_t = 0)]
    pub(crate) max_wait_ms: u64,
    /// Rust: enforce 2 on the `l1:*` keys while logging their limit as 1, for a control run that must be
    /// caught over its limits.
    #[arg(long)]
    pub(crate) loose: bool,
}

/// One permit to take: its keys and weight.
#[derive(Debug, Clone)]
pub(crate) struct Job {
    /// The keys (limits in their names, see [`crate::history::limit_of`]).
    pub(crate) keys: Vec<String>,
    /// The weight.
    pub(crate) weight: u32,
}

/// The permits a run's holders take: limits 1, 4 and 64; weights 1 and 3; with `multi`, two keys at once;
/// `wait` (waiters) the small limits only, so that most asks wait.
pub(crate) fn mix(name: &str) -> Vec<Job> {
    let job = |keys: &[&str], weight| Job {
        keys: keys.iter().map(|k| (*k).to_owned()).collect(),
        weight,
    };
    if name == "wait" {
        return vec![
            job(&["l1:a"], 1),
            job(&["l4:a"], 1),
            job(&["l4:a"], 3),
            job(&["l4:a", "l1:b"], 1),
        ];
    }
    let mut jobs = vec![
        job(&["l1:a"], 1),
        job(&["l4:a"], 1),
        job(&["l4:a"], 3),
        job(&["l64:a"], 1),
        job(&["l64:a"], 3),
    ];
    if name == "multi" {
        jobs.push(job(&["l4:a", "l1:b"], 1));
        jobs.push(job(&["l64:a", "l4:b"], 3));
    }
    jobs
}

/// The keys of a mix, each once.
pub(crate) fn keys_of(name: &str) -> Vec<String> {
    let mut keys: Vec<String> = mix(name).into_iter().flat_map(|j| j.keys).collect();
    keys.sort();
    keys.dedup();
    keys
}

/// A small xorshift generator: enough for choosing jobs and hold times, with no dependency.
#[derive(Debug, Clone)]
pub(crate) struct Rng(u64);

impl Rng {
    /// Seeded (0 becomes 1).
    pub(crate) fn new(seed: u64) -> Self {
        Self(seed.max(1))
    }

    /// The next number.
    pub(crate) fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    /// A number in `0..n` (0 for n = 0).
    pub(crate) fn below(&mut self, n: u64) -> u64 {
        if n == 0 {
            0
        } else {
            self.next() % n
        }
    }
}

/// A unique permit id in this process.
pub(crate) fn next_id(process: &str) -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    format!("{process}-{}", NEXT.fetch_add(1, Ordering::Relaxed))
}

/// The permit id of task `task`'s next job `job`: half the time the one it used last for that job (a
/// request retried under its id; never held twice at once, as a task holds one permit at a time, but it
/// may follow a release that failed), else a new one.
pub(crate) fn pick_id(process: &str, task: usize, job: usize, rng: &mut Rng) -> String {
    if rng.below(2) == 0 {
        format!("{process}-t{task}-j{job}")
    } else {
        next_id(process)
    }
}

/// What every task of a holder shares.
pub(crate) struct Task {
    /// The holder's arguments.
    pub(crate) args: HolderArgs,
    /// Its history.
    pub(crate) history: History,
    /// When to stop.
    pub(crate) until: Instant,
}

impl Task {
    /// The permit task `n` asks for next: a job of the mix, under a new id or the one it used last.
    pub(crate) fn next_permit(&self, rng: &mut Rng, n: usize) -> PermitInfo {
        let jobs = mix(&self.args.mix);
        let j = rng.below(jobs.len() as u64) as usize;
        let job = &jobs[j];
        PermitInfo {
            keys: job.keys.clone(),
            id: pick_id(&self.args.process, n, j, rng),
            weight: job.weight,
            lease_ms: self.args.lease_ms,
        }
    }

    /// A random hold, at least 5 ms; one in eight longer than the lease (1 to 2.5 leases), so that it
    /// lasts only through renewals.
    pub(crate) fn hold(&self, rng: &mut Rng) -> Duration {
        let lease = self.args.lease_ms;
        // A storm's clients hold briefly: the storm is their coming and going.
        Duration::from_millis(match rng.below(8) {
            0 if !self.args.storm => lease + rng.below(lease * 3 / 2),
            _ => 5 + rng.below(self.args.max_hold_ms.max(1)),
        })
    }
}

/// Runs a holder to its end.
pub(crate) fn run(args: HolderArgs) -> crate::Result {
    let history = History::open(&args.out, &args.process)?;
    let until = Instant::now() + Duration::from_millis(args.duration_ms);
    let task = Arc::new(Task {
        args,
        history,
        until,
    });
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    runtime.block_on(async move {
        match task.args.kind {
            Kind::Rust => rust::run(task).await,
            Kind::Http => http::run(task).await,
            Kind::Proxy => proxy::run(task).await,
        }
    })
}
