//! Waiting for a slot under load, and how soon a release in one process wakes a waiter in another.
//!
//! 1. `--tasks` tasks (64) loop on one key of limit `--limit` (4) for `--secs` (3): each waits for a slot
//!    (`Limiter::acquire`, up to 5 s), holds it for `HOLD`, and releases it. Half the tasks are on one
//!    limiter and half on another, so releases wake waiters across them. Admissions/s, wait-time
//!    percentiles, each side's share of the admissions, and how many admissions went out of order (to a
//!    waiter that asked more than `MARGIN_US` after another still waiting more than `MARGIN_US` later).
//! 2. `--trials` times (200): one side holds the only slot of a key of limit 1, the other waits; the holder
//!    releases, and the time from the release to the waiter's admission is measured.
//!
//! Without `--procs 2` the two sides are two store handles in this process (two connections; memory,
//! then Redis if a URL is given). With `--procs 2` (Redis only) they are two OS processes, copies of this
//! one started with `--child`, timed on one clock (`SystemTime`, one host), and the parent also reads
//! Redis's own CPU time (`INFO cpu`) around the load: `redis_cpu_us_per_admission`.
//!
//! Prints one JSON line per store. `scripts/bench.sh` and `scripts/bench/waiting.sh` run this; by hand:
//! `cargo run --release -p inflight --example wait_load -- [redis://127.0.0.1:6379] [--procs 2]`

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use inflight::{AcquireOptions, Limiter, MemoryStore, Permit, Policy, RedisStore, Wakeups};
use tokio::sync::Mutex;

mod procs;

type Error = Box<dyn std::error::Error>;

const HOLD: Duration = Duration::from_millis(1);
const MAX_WAIT: Duration = Duration::from_secs(5);
/// Arrivals and admissions closer than this are not told apart when counting out-of-order admissions.
const MARGIN_US: u64 = 1_000;

struct Args {
    url: Option<String>,
    procs: usize,
    tasks: usize,
    limit: u32,
    secs: f64,
    trials: usize,
}

fn args() -> Result<Args, Error> {
    let mut args = Args {
        url: None,
        procs: 1,
        tasks: 64,
        limit: 4,
        secs: 3.0,
        trials: 200,
    };
    let mut given = std::env::args().skip(1);
    while let Some(arg) = given.next() {
        let mut value = || given.next().ok_or(format!("{arg} needs a value"));
        match arg.as_str() {
            "--procs" => args.procs = value()?.parse()?,
            "--tasks" => args.tasks = value()?.parse()?,
            "--limit" => args.limit = value()?.parse()?,
            "--secs" => args.secs = value()?.parse()?,
            "--trials" => args.trials = value()?.parse()?,
            _ if !arg.starts_with("--") => args.url = Some(arg),
            _ => return Err(format!("unknown argument {arg}").into()),
        }
    }
    Ok(args)
}

/// Microseconds on the host's clock, which every process of the run shares.
fn now_us() -> u64 {
    let since = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    since.as_micros() as u64
}

/// One try to be admitted: by which side, when it asked and when it ended (µs), and whether admitted.
#[derive(Clone, Copy)]
struct Record {
    side: usize,
    asked: u64,
    ended: u64,
    admitted: bool,
}

fn percentiles(mut took_us: Vec<u64>) -> String {
    took_us.sort_unstable();
    let at = |q: f64| {
        let i = ((took_us.len().max(1) - 1) as f64 * q).round() as usize;
        took_us.get(i).map_or(0.0, |&us| us as f64 / 1e3)
    };
    format!(
        "{{\"p50_ms\": {:.3}, \"p99_ms\": {:.3}, \"max_ms\": {:.3}, \"n\": {}}}",
        at(0.5),
        at(0.99),
        at(1.0),
        took_us.len()
    )
}

/// Admissions that went to a waiter while one that asked earlier (by more than `MARGIN_US`) was still
/// waiting (ended more than `MARGIN_US` later).
fn out_of_order(records: &[Record]) -> usize {
    let mut by_end = records.to_vec();
    by_end.sort_unstable_by_key(|r| r.ended);
    // The earliest arrival among the tries that ended at or after each index.
    let mut earliest = vec![u64::MAX; by_end.len() + 1];
    for i in (0..by_end.len()).rev() {
        earliest[i] = earliest[i + 1].min(by_end[i].asked);
    }
    let admitted = by_end.iter().filter(|r| r.admitted);
    admitted
        .filter(|r| {
            let later = by_end.partition_point(|w| w.ended <= r.ended + MARGIN_US);
            earliest[later].saturating_add(MARGIN_US) < r.asked
        })
        .count()
}

/// The load's figures from every side's tries, `started` when the load began (µs).
fn summary(records: &[Record], started: u64, sides: usize) -> String {
    let admitted: Vec<&Record> = records.iter().filter(|r| r.admitted).collect();
    let ended = records.iter().map(|r| r.ended).max().unwrap_or(started);
    let per_sec = admitted.len() as f64 / ((ended - started) as f64 / 1e6);
    let share: Vec<String> = (0..sides)
        .map(|side| admitted.iter().filter(|r| r.side == side).count() as f64)
        .map(|n| format!("{:.3}", n / admitted.len().max(1) as f64))
        .collect();
    let waits = admitted.iter().map(|r| r.ended - r.asked).collect();
    format!(
        "\"admissions\": {}, \"admissions_per_sec\": {per_sec:.0}, \"wait\": {}, \"share\": [{}], \
         \"timed_out\": {}, \"out_of_order\": {}",
        admitted.len(),
        percentiles(waits),
        share.join(", "),
        records.len() - admitted.len(),
        out_of_order(records)
    )
}

/// `tasks` tasks (the `n`th on `limiters[n % len]`) loop from `start` (µs) for `run`; every try.
async fn load<S: Wakeups>(
    limiters: &[Limiter<S>],
    tasks: usize,
    start: u64,
    run: Duration,
) -> Vec<Record> {
    let records = Arc::new(Mutex::new(Vec::new()));
    tokio::time::sleep(Duration::from_micros(start.saturating_sub(now_us()))).await;
    let until = start + run.as_micros() as u64;
    let mut spawned = Vec::new();
    for n in 0..tasks {
        let side = n % limiters.len();
        let (limiter, records) = (limiters[side].clone(), records.clone());
        spawned.push(tokio::spawn(async move {
            let mut mine = Vec::new();
            while now_us() < until {
                let asked = now_us();
                let permit = limiter
                    .acquire("hot", AcquireOptions::new().max_wait(MAX_WAIT))
                    .await;
                mine.push(Record {
                    side,
                    asked,
                    ended: now_us(),
                    admitted: permit.is_ok(),
                });
                if let Ok(permit) = permit {
                    tokio::time::sleep(HOLD).await;
                    drop(permit);
                }
            }
            records.lock().await.extend(mine);
        }));
    }
    for task in spawned {
        let _ = task.await;
    }
    let records = std::mem::take(&mut *records.lock().await);
    records
}

/// Holds the only slot of `wake` (the last release may not have reached the store yet: tried again).
async fn hold<S: Wakeups>(limiter: &Limiter<S>) -> Permit {
    loop {
        if let Ok(permit) = limiter.try_acquire("wake").await {
            return permit;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

/// A waiter on `wake`, once it is queued (and, after 5 ms, subscribed): its permit and when admitted.
async fn queue<S: Wakeups>(limiter: &Limiter<S>) -> tokio::task::JoinHandle<(Option<Permit>, u64)> {
    let waiter = {
        let limiter = limiter.clone();
        tokio::spawn(async move {
            let permit = limiter
                .acquire("wake", AcquireOptions::new().max_wait(MAX_WAIT))
                .await;
            (permit.ok(), now_us())
        })
    };
    while limiter
        .stats()
        .waiting
        .load(std::sync::atomic::Ordering::SeqCst)
        == 0
    {
        tokio::time::sleep(Duration::from_micros(100)).await;
    }
    tokio::time::sleep(Duration::from_millis(5)).await;
    waiter
}

async fn wake<S: Wakeups>(a: Limiter<S>, b: Limiter<S>, trials: usize) -> Result<String, Error> {
    let mut took = Vec::with_capacity(trials);
    for _ in 0..trials {
        let held = hold(&a).await;
        let waiter = queue(&b).await;
        let released = now_us();
        drop(held);
        let (permit, admitted) = waiter.await?;
        took.push(admitted.saturating_sub(released));
        drop(permit.ok_or("the waiter was not admitted")?);
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    Ok(percentiles(took))
}

async fn run<S: Wakeups>(name: &str, a: S, b: S, args: &Args) -> Result<(), Error> {
    let build = |store: S, limit| {
        Limiter::builder(store)
            .policy(Policy::new(limit, 0))
            .build()
    };
    let (a, b) = (build(a, args.limit), build(b, args.limit));
    let started = now_us();
    let records = load(
        &[a.clone(), b.clone()],
        args.tasks,
        started,
        Duration::from_secs_f64(args.secs),
    )
    .await;
    let load = summary(&records, started, 2);
    a.set_policy(Policy::new(1, 0));
    b.set_policy(Policy::new(1, 0));
    let wake = wake(a, b, args.trials).await?;
    let (tasks, limit) = (args.tasks, args.limit);
    println!("{{\"store\": \"{name}\", \"tasks\": {tasks}, \"limit\": {limit}, {load}, \"wake_across\": {wake}}}");
    Ok(())
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Error> {
    let given: Vec<String> = std::env::args().collect();
    if let [_, flag, url, prefix] = &given[..] {
        if flag == "--child" {
            return procs::child(url, prefix).await;
        }
    }
    let args = args()?;
    match (&args.url, args.procs) {
        (Some(url), 2) => return procs::processes(url, &args).await,
        (_, 1) => {}
        _ => return Err("--procs 2 needs a Redis URL (and only 1 or 2 sides exist)".into()),
    }
    let memory = MemoryStore::new();
    run("memory", memory.clone(), memory, &args).await?;
    if let Some(url) = &args.url {
        let prefix = format!("inflight-wait-{}:", std::process::id());
        let open = || {
            RedisStore::builder(url.as_str())
                .prefix(prefix.clone())
                .open()
        };
        run("redis", open()?, open()?, &args).await?;
    }
    Ok(())
}
