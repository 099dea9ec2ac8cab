//! Waiting for a slot under load, and how soon a release in one process wakes a waiter in another.
//!
//! 1. `TASKS` tasks loop on one key of limit `LIMIT` for `RUN`: each waits for a slot
//!    (`Limiter::acquire`, up to 5 s), holds it for `HOLD`, and releases it. Half the tasks are on one
//!    limiter and half on another (two store handles: two connections, as two processes), so releases
//!    wake waiters across them. Admissions/s and wait-time percentiles.
//! 2. `TRIALS` times: one limiter holds the only slot, the other waits; the holder releases, and the time
//!    from the release to the waiter's admission is measured.
//!
//! Prints one JSON line per store. `scripts/bench.sh` runs this; by hand:
//! `cargo run --release -p inflight --example wait_load -- [redis://127.0.0.1:6379]`

use std::sync::Arc;
use std::time::{Duration, Instant};

use inflight::{AcquireOptions, Limiter, MemoryStore, Policy, RedisStore, Wakeups};
use tokio::sync::Mutex;

const TASKS: usize = 64;
const LIMIT: u32 = 4;
const HOLD: Duration = Duration::from_millis(1);
const RUN: Duration = Duration::from_secs(3);
const TRIALS: usize = 200;

fn percentiles(mut took: Vec<Duration>) -> String {
    took.sort();
    let at = |q: f64| {
        let i = ((took.len().max(1) - 1) as f64 * q).round() as usize;
        took.get(i).map_or(0.0, |d| d.as_secs_f64() * 1e3)
    };
    format!(
        "{{\"p50_ms\": {:.3}, \"p99_ms\": {:.3}, \"max_ms\": {:.3}, \"n\": {}}}",
        at(0.5),
        at(0.99),
        at(1.0),
        took.len()
    )
}

async fn load<S: Wakeups>(a: Limiter<S>, b: Limiter<S>) -> String {
    let waits = Arc::new(Mutex::new(Vec::new()));
    let started = Instant::now();
    let mut tasks = Vec::new();
    for n in 0..TASKS {
        let limiter = if n % 2 == 0 { a.clone() } else { b.clone() };
        let waits = waits.clone();
        tasks.push(tokio::spawn(async move {
            let mut mine = Vec::new();
            while started.elapsed() < RUN {
                let asked = Instant::now();
                let options = AcquireOptions::new().max_wait(Duration::from_secs(5));
                if let Ok(permit) = limiter.acquire("hot", options).await {
                    mine.push(asked.elapsed());
                    tokio::time::sleep(HOLD).await;
                    drop(permit);
                }
            }
            waits.lock().await.extend(mine);
        }));
    }
    for task in tasks {
        let _ = task.await;
    }
    let waits = std::mem::take(&mut *waits.lock().await);
    let per_sec = waits.len() as f64 / started.elapsed().as_secs_f64();
    format!(
        "\"admissions_per_sec\": {per_sec:.0}, \"wait\": {}",
        percentiles(waits)
    )
}

async fn wake<S: Wakeups>(
    a: Limiter<S>,
    b: Limiter<S>,
) -> Result<String, Box<dyn std::error::Error>> {
    let mut took = Vec::with_capacity(TRIALS);
    for _ in 0..TRIALS {
        let held = a.try_acquire("wake").await?;
        let waiter = {
            let b = b.clone();
            tokio::spawn(async move {
                let options = AcquireOptions::new().max_wait(Duration::from_secs(5));
                let permit = b.acquire("wake", options).await;
                (permit, Instant::now())
            })
        };
        // Queued (and subscribed) before the release.
        while b.stats().waiting.load(std::sync::atomic::Ordering::SeqCst) == 0 {
            tokio::task::yield_now().await;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
        let released = Instant::now();
        drop(held);
        let (permit, admitted) = waiter.await?;
        took.push(admitted.duration_since(released));
        drop(permit?);
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    Ok(percentiles(took))
}

async fn run<S: Wakeups>(name: &str, a: S, b: S) -> Result<(), Box<dyn std::error::Error>> {
    let policy = Policy::new(LIMIT, 0);
    let (a, b) = (
        Limiter::builder(a).policy(policy.clone()).build(),
        Limiter::builder(b).policy(policy).build(),
    );
    let load = load(a.clone(), b.clone()).await;
    let one = Policy::new(1, 0);
    a.set_policy(one.clone());
    b.set_policy(one);
    let wake = wake(a, b).await?;
    println!(
        "{{\"store\": \"{name}\", \"tasks\": {TASKS}, \"limit\": {LIMIT}, {load}, \"wake_across\": {wake}}}"
    );
    Ok(())
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let memory = MemoryStore::new();
    run("memory", memory.clone(), memory).await?;
    if let Some(url) = std::env::args().nth(1) {
        let prefix = format!("inflight-wait-{}:", std::process::id());
        let open = || {
            RedisStore::builder(url.as_str())
                .prefix(prefix.clone())
                .open()
        };
        run("redis", open()?, open()?).await?;
    }
    Ok(())
}
