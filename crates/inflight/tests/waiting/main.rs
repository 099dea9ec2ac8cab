//! Waiting for a slot (`Limiter::acquire`): bounded, in one order for every process (arrival, flows in
//! turn, priorities), woken by releases in other processes, cancel-safe; each scenario on the memory
//! store (two limiters on one store stand for two processes) and on a real redis-server (two store
//! handles, two connections). Woken, bounded and cancel-safe (wakeups.rs); one queue for every process,
//! its order, floors and abandoned tickets (queue.rs). The waiters of Dify's layout take tickets too.
#![allow(missing_docs)]

mod queue;
#[path = "../support/mod.rs"]
mod support;
mod wakeups;

use std::sync::atomic::Ordering;
use std::time::Duration;

use inflight::{AcquireOptions, DifyStore, Limiter, MemoryStore, Policy, RedisStore, Wakeups};
use support::TestRedis;

fn limiter<S: Wakeups>(store: S, limit: u32) -> Limiter<S> {
    Limiter::builder(store)
        .policy(Policy::new(limit, 0))
        .build()
}

fn wait(ms: u64) -> AcquireOptions {
    AcquireOptions::new().max_wait(Duration::from_millis(ms))
}

/// Two "processes" on one store: the memory store shared, or two handles (connections) to one Redis.
fn memory() -> (MemoryStore, MemoryStore) {
    let store = MemoryStore::new();
    (store.clone(), store)
}

fn redis() -> (RedisStore, RedisStore, TestRedis) {
    let server = TestRedis::start();
    (server.store(), server.store(), server)
}

/// Two handles on Dify's key layout, whose waiters queue beside Dify's hash.
fn dify() -> (DifyStore, DifyStore, TestRedis) {
    let server = TestRedis::start();
    let open = || server.store_builder().dify().open().unwrap();
    (open(), open(), server)
}

/// Waits (bounded) until `limiter` has `n` admissions waiting.
async fn waiting<S: Wakeups>(limiter: &Limiter<S>, n: u64) {
    for _ in 0..400 {
        if limiter.stats().waiting.load(Ordering::SeqCst) == n {
            return;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    panic!("never {n} waiting");
}
