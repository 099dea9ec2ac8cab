//! `inflight-chaos holder`: one process that acquires, holds a random short while and releases, over and
//! over from several tasks, writing every operation to its history. Kinds: the library (`rust`), an
//! `inflight serve` (`http`) and an `inflight proxy` (`proxy`).

pub(crate) mod http;
mod proxy;
mod rust;

pub(crate) use rust::{policy, token_of};

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use inflight::{Limiter, RedisStore};

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

/// One permit to take: its keys (limits in their names, see [`crate::history::limit_of`]) and weight.
pub(crate) type Job = (&'static [&'static str], u32);

/// Limits 1, 4 and 64; weights 1 and 3; the last two on two keys at once (the `multi` mix only).
const MULTI: [Job; 7] = [
    (&["l1:a"], 1),
    (&["l4:a"], 1),
    (&["l4:a"], 3),
    (&["l64:a"], 1),
    (&["l64:a"], 3),
    (&["l4:a", "l1:b"], 1),
    (&["l64:a", "l4:b"], 3),
];

/// The permits a run's holders take: `multi` every one of [`MULTI`], `single` those on one key, `wait`
/// (waiters) the small limits only, so that most asks wait.
pub(crate) fn mix(name: &str) -> &'static [Job] {
    match name {
        "wait" => &[
            (&["l1:a"], 1),
            (&["l4:a"], 1),
            (&["l4:a"], 3),
            (&["l4:a", "l1:b"], 1),
        ],
        "multi" => &MULTI,
        _ => &MULTI[..5],
    }
}

/// The keys of `job`, owned.
pub(crate) fn keys(job: &Job) -> Vec<String> {
    job.0.iter().map(ToString::to_string).collect()
}

/// The keys of a mix, each once.
pub(crate) fn keys_of(name: &str) -> Vec<String> {
    let mut keys: Vec<String> = mix(name).iter().flat_map(keys).collect();
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
        self.next() % n.max(1)
    }
}

/// A unique permit id in this process.
pub(crate) fn next_id(process: &str) -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    format!("{process}-{}", NEXT.fetch_add(1, Ordering::Relaxed))
}

/// What every task of a holder shares: its arguments, history, end, and (the library's) limiter.
pub(crate) struct Task {
    pub(crate) args: HolderArgs,
    pub(crate) history: History,
    pub(crate) until: Instant,
    pub(crate) limiter: Option<Limiter<RedisStore>>,
}

impl Task {
    /// The permit task `n` asks for next: a job of the mix, half the time under the id the task used
    /// last for that job (a request retried under its id; never held twice at once, as a task holds one
    /// permit at a time, but it may follow a release that failed), else under a new one.
    pub(crate) fn next_permit(&self, rng: &mut Rng, n: usize) -> PermitInfo {
        let (jobs, process) = (mix(&self.args.mix), &self.args.process);
        let j = rng.below(jobs.len() as u64) as usize;
        let id = match rng.below(2) {
            0 => format!("{process}-t{n}-j{j}"),
            _ => next_id(process),
        };
        PermitInfo {
            keys: keys(&jobs[j]),
            id,
            weight: jobs[j].1,
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

/// Runs a holder to its end: `--tasks` tasks, each taking permits one after the other until the end.
pub(crate) fn run(args: HolderArgs) -> crate::Result {
    let history = History::open(&args.out, &args.process)?;
    let until = Instant::now() + Duration::from_millis(args.duration_ms);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    runtime.block_on(async move {
        let limiter = match args.kind {
            Kind::Rust => Some(rust::limiter(&args)?),
            Kind::Http | Kind::Proxy => None,
        };
        let task = Arc::new(Task {
            args,
            history,
            until,
            limiter,
        });
        let tasks: Vec<_> = (0..task.args.tasks)
            .map(|n| {
                let task = task.clone();
                tokio::spawn(async move {
                    let mut rng = Rng::new(task.args.seed.wrapping_mul(7919) + n as u64);
                    while Instant::now() < task.until {
                        match task.args.kind {
                            Kind::Rust => rust::cycle(&task, &mut rng, n).await,
                            Kind::Http => http::cycle(&task, &mut rng, n).await,
                            Kind::Proxy => proxy::cycle(&task, &mut rng).await,
                        }
                    }
                })
            })
            .collect();
        for handle in tasks {
            handle.await?;
        }
        Ok(())
    })
}
