//! `inflight bench`: load on a store through the library itself (no HTTP), one JSON line out.
//!
//! Tasks acquire and release permits on `--keys` keys as fast as they can for `--duration`; an
//! independent probe (a counter per key in this process, raised after each admission and lowered before
//! each release) records the most permits it ever saw in flight on one key, which must never pass the limit.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Args;
use inflight::{AcquireError, AnyStore, Limiter, Policy};
use serde::Serialize;

/// Options of `inflight bench`.
#[derive(Clone, Debug, Args)]
pub struct BenchArgs {
    /// The store: memory://, redis://host:port[/db], ...
    #[arg(long, default_value = "memory://")]
    pub store: String,
    /// How many keys the load spreads over.
    #[arg(long, default_value_t = 1)]
    pub keys: usize,
    /// Concurrent tasks.
    #[arg(long, default_value_t = 64)]
    pub tasks: usize,
    /// Threads of the runtime the tasks (and the store's connection) run on, 1 to 1024.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..=1024))]
    pub threads: u16,
    /// The limit of every key (0: unlimited).
    #[arg(long, default_value_t = 1_000_000)]
    pub limit: u32,
    /// How long to run, e.g. 5s.
    #[arg(long, default_value = "5s", value_parser = humantime::parse_duration)]
    pub duration: Duration,
    /// How long each admitted request holds its permit before releasing it (default: not at all).
    #[arg(long, value_parser = humantime::parse_duration)]
    pub hold: Option<Duration>,
    /// Permits held on every key for the whole run, besides the load (latency at depth).
    #[arg(long, default_value_t = 0)]
    pub held: usize,
    /// Prefix of the Redis keys (a fresh one per run keeps runs apart).
    #[arg(long, default_value = "inflight-bench:")]
    pub redis_prefix: String,
    /// Batches out to Redis at once (the library's default, 3, suits this closed loop of waiting tasks).
    #[arg(long, default_value_t = 3)]
    pub redis_pipeline: usize,
    /// Replicas that must acknowledge each batch (Redis WAIT); 0: none.
    #[arg(long, default_value_t = 0)]
    pub redis_wait_replicas: u32,
    /// How long to wait for them at most.
    #[arg(long, default_value = "100ms", value_parser = humantime::parse_duration)]
    pub redis_wait_timeout: Duration,
}

/// The line `inflight bench` prints.
#[derive(Debug, Serialize)]
pub struct Report {
    /// acquire+release pairs completed per second.
    pub pairs_per_sec: f64,
    /// Refused admissions (key full) per second.
    pub rejected_per_sec: f64,
    /// Median acquire latency, µs.
    pub p50_us: f64,
    /// 99th percentile acquire latency, µs.
    pub p99_us: f64,
    /// The most permits the probe saw in flight on one key at once.
    pub max_in_flight_seen: u32,
    /// The store.
    pub store: String,
    /// Keys.
    pub keys: usize,
    /// Tasks.
    pub tasks: usize,
    /// Runtime threads.
    pub threads: u16,
    /// Limit per key.
    pub limit: u32,
    /// Seconds run.
    pub duration_s: f64,
    /// Hold per admitted request, µs.
    pub hold_us: u64,
    /// Permits held per key throughout.
    pub held: usize,
    /// Batches out to Redis at once, at most (Redis stores only).
    pub redis_pipeline: usize,
    /// Replicas each batch waited for (Redis stores only).
    pub redis_wait_replicas: u32,
    /// Redis's own CPU time per pair, µs (`INFO cpu`: system + user, before and after the load, over
    /// every primary of a Cluster); refused admissions' share included. Redis stores only.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub redis_cpu_us_per_pair: Option<f64>,
}

/// How many pairs a task completes between two updates of the progress count.
const PROGRESS_STEP: usize = 64;

/// A line on stderr every second until aborted: time run, pairs so far and refusals.
async fn progress(
    started: Instant,
    duration: Duration,
    done: Arc<AtomicU64>,
    rejected: Arc<AtomicU64>,
) {
    let mut tick = tokio::time::interval_at(
        tokio::time::Instant::now() + Duration::from_secs(1),
        Duration::from_secs(1),
    );
    loop {
        tick.tick().await;
        eprintln!(
            "inflight bench: {:.1}s of {:.1}s, {} pairs, {} refused",
            started.elapsed().as_secs_f64(),
            duration.as_secs_f64(),
            done.load(Ordering::Relaxed),
            rejected.load(Ordering::Relaxed),
        );
    }
}

/// Runs the load on `store`.
pub async fn run(args: &BenchArgs, store: AnyStore) -> Result<Report, AcquireError> {
    let redis_cpu = store.clone();
    let limiter = Limiter::builder(store)
        .policy(Policy::new(args.limit, 0))
        .build();
    let keys: Arc<Vec<String>> = Arc::new(
        (0..args.keys.max(1))
            .map(|n| format!("bench-{n}"))
            .collect(),
    );
    let mut background = Vec::new();
    for key in keys.iter() {
        for _ in 0..args.held {
            background.push(limiter.try_acquire(key).await?);
        }
    }
    let probes: Arc<Vec<AtomicU32>> = Arc::new(keys.iter().map(|_| AtomicU32::new(0)).collect());
    let max_seen = Arc::new(AtomicU32::new(0));
    let rejected = Arc::new(AtomicU64::new(0));
    let done = Arc::new(AtomicU64::new(0));
    let cpu_before = redis_cpu.redis_cpu_time().await.transpose()?;
    let started = Instant::now();
    let deadline = started + args.duration;
    let progress = tokio::spawn(progress(
        started,
        args.duration,
        done.clone(),
        rejected.clone(),
    ));
    let mut tasks = Vec::new();
    for task in 0..args.tasks.max(1) {
        let (limiter, keys, probes) = (limiter.clone(), keys.clone(), probes.clone());
        let (max_seen, rejected, hold) = (max_seen.clone(), rejected.clone(), args.hold);
        let done = done.clone();
        tasks.push(tokio::spawn(async move {
            let mut latencies: Vec<u64> = Vec::with_capacity(1 << 16);
            let mut n = task;
            while Instant::now() < deadline {
                // On the memory store an admission is ready at once and never yields: without this,
                // tasks past the runtime's threads, and the progress line, would wait for the end.
                tokio::task::coop::consume_budget().await;
                let k = n % keys.len();
                n = n.wrapping_add(7919);
                let asked = Instant::now();
                match limiter.try_acquire(&keys[k]).await {
                    Ok(permit) => {
                        latencies
                            .push(u64::try_from(asked.elapsed().as_nanos()).unwrap_or(u64::MAX));
                        let now = probes[k].fetch_add(1, Ordering::SeqCst) + 1;
                        max_seen.fetch_max(now, Ordering::SeqCst);
                        if let Some(hold) = hold {
                            tokio::time::sleep(hold).await;
                        }
                        probes[k].fetch_sub(1, Ordering::SeqCst);
                        permit.release().await.map_err(AcquireError::Store)?;
                        // (Counted in steps, so the tasks do not all contend on one atomic.)
                        if latencies.len() % PROGRESS_STEP == 0 {
                            done.fetch_add(PROGRESS_STEP as u64, Ordering::Relaxed);
                        }
                    }
                    Err(AcquireError::Full { .. }) => {
                        rejected.fetch_add(1, Ordering::Relaxed);
                        tokio::task::yield_now().await;
                    }
                    Err(other) => return Err(other),
                }
            }
            Ok(latencies)
        }));
    }
    let mut all = Vec::new();
    for task in tasks {
        all.extend(task.await.expect("bench task")?);
    }
    let elapsed = started.elapsed().as_secs_f64();
    let cpu_after = redis_cpu.redis_cpu_time().await.transpose()?;
    progress.abort();
    drop(background);
    all.sort_unstable();
    let pct = |p: f64| {
        let i = ((all.len() as f64 * p) as usize).min(all.len().saturating_sub(1));
        all.get(i).map_or(0.0, |ns| *ns as f64 / 1_000.0)
    };
    Ok(Report {
        pairs_per_sec: all.len() as f64 / elapsed,
        rejected_per_sec: rejected.load(Ordering::Relaxed) as f64 / elapsed,
        p50_us: pct(0.50),
        p99_us: pct(0.99),
        max_in_flight_seen: max_seen.load(Ordering::SeqCst),
        store: args.store.clone(),
        keys: keys.len(),
        tasks: args.tasks.max(1),
        threads: args.threads,
        limit: args.limit,
        duration_s: elapsed,
        hold_us: args.hold.map_or(0, |h| h.as_micros() as u64),
        held: args.held,
        redis_pipeline: args.redis_pipeline,
        redis_wait_replicas: args.redis_wait_replicas,
        redis_cpu_us_per_pair: cpu_before.zip(cpu_after).map(|(before, after)| {
            after.saturating_sub(before).as_secs_f64() * 1e6 / (all.len().max(1) as f64)
        }),
    })
}
