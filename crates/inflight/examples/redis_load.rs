//! Load on the Redis store: acquire+release pairs/s and acquire latency (p50/p99) at 1, 16, 64 and 256
//! concurrent tasks, beside a naive two-round-trip check-then-set limiter (HLEN, then HSET; HDEL to
//! release: the reference system's way) in the same process and the same run.
//!
//! `scripts/bench-redis.sh` starts a redis-server and runs this; by hand:
//! `cargo run --release -p inflight --example redis_load -- redis://127.0.0.1:6379 [seconds-per-row]`

use std::sync::Arc;
use std::time::{Duration, Instant};

use inflight::{Limiter, Policy, RedisStore, Store};
use redis::aio::ConnectionManager;

const LIMIT: u32 = 1_000_000; // never reached: this measures the cost of a pair, not rejections

struct Row {
    tasks: usize,
    pairs_per_sec: f64,
    p50_us: u64,
    p99_us: u64,
}

async fn run<F, Fut>(tasks: usize, seconds: f64, pair: F) -> Row
where
    F: Fn(usize) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = Duration> + Send,
{
    let pair = Arc::new(pair);
    let deadline = Instant::now() + Duration::from_secs_f64(seconds);
    let start = Instant::now();
    let mut handles = Vec::new();
    for t in 0..tasks {
        let pair = pair.clone();
        handles.push(tokio::spawn(async move {
            let mut latencies = Vec::with_capacity(100_000);
            let mut n = 0usize;
            while Instant::now() < deadline {
                latencies.push(pair(t * 1_000_000 + n).await.as_micros() as u64);
                n += 1;
            }
            latencies
        }));
    }
    let mut all = Vec::new();
    for handle in handles {
        all.extend(handle.await.expect("load task"));
    }
    let elapsed = start.elapsed().as_secs_f64();
    all.sort_unstable();
    let pct = |p: f64| {
        all.get(((all.len() as f64 * p) as usize).min(all.len().saturating_sub(1)))
            .copied()
            .unwrap_or(0)
    };
    Row {
        tasks,
        pairs_per_sec: all.len() as f64 / elapsed,
        p50_us: pct(0.50),
        p99_us: pct(0.99),
    }
}

// One runtime thread for both limiters, like `inflight bench` by default (on the 2-core benchmark machine,
// with Redis beside it, two threads made fewer pairs/s than one: BENCHMARKS.md).
#[tokio::main(flavor = "multi_thread", worker_threads = 1)]
async fn main() {
    let mut args = std::env::args().skip(1);
    let url = args
        .next()
        .unwrap_or_else(|| "redis://127.0.0.1:6379".into());
    let seconds: f64 = args.next().and_then(|s| s.parse().ok()).unwrap_or(3.0);

    let store = RedisStore::open(url.clone()).expect("redis url");
    store.maintain().await.expect("redis reachable");
    let limiter = Limiter::builder(store)
        .policy(Policy::new(LIMIT, 0))
        .build();
    let client = redis::Client::open(url.as_str()).expect("redis url");
    let naive_conn = ConnectionManager::new(client)
        .await
        .expect("redis reachable");

    println!("| tasks | inflight pairs/s | p50 µs | p99 µs | naive check-then-set pairs/s | p50 µs | p99 µs | ratio |");
    println!("|---|---|---|---|---|---|---|---|");
    for tasks in [1usize, 16, 64, 256] {
        let l = limiter.clone();
        let ours = run(tasks, seconds, move |_| {
            let l = l.clone();
            async move {
                let started = Instant::now();
                let permit = l.try_acquire("bench").await.expect("admitted");
                let latency = started.elapsed();
                permit.release().await.expect("released");
                latency
            }
        })
        .await;
        let conn = naive_conn.clone();
        let naive = run(tasks, seconds, move |n| {
            let mut conn = conn.clone();
            async move {
                let id = n.to_string();
                let started = Instant::now();
                let count: u32 = redis::cmd("HLEN")
                    .arg("naive")
                    .query_async(&mut conn)
                    .await
                    .expect("HLEN");
                assert!(count < LIMIT);
                let _: () = redis::cmd("HSET")
                    .arg("naive")
                    .arg(&id)
                    .arg(n)
                    .query_async(&mut conn)
                    .await
                    .expect("HSET");
                let latency = started.elapsed();
                let _: () = redis::cmd("HDEL")
                    .arg("naive")
                    .arg(&id)
                    .query_async(&mut conn)
                    .await
                    .expect("HDEL");
                latency
            }
        })
        .await;
        println!(
            "| {} | {:.0} | {} | {} | {:.0} | {} | {} | {:.2} |",
            ours.tasks,
            ours.pairs_per_sec,
            ours.p50_us,
            ours.p99_us,
            naive.pairs_per_sec,
            naive.p50_us,
            naive.p99_us,
            ours.pairs_per_sec / naive.pairs_per_sec
        );
    }
}
