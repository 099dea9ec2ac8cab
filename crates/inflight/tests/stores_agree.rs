//! Property test: the Redis store and the memory store make the same decisions for the same random
//! sequences of acquire / release / renew / set-limit / advance-time.
#![allow(missing_docs)]

mod support;

use std::time::Duration;

use inflight::{ManualClock, MemoryStore, RedisStore};
use proptest::prelude::*;
use support::ops::{apply_store, coarse_op, policy, Outcome};
use support::TestRedis;

/// Deadlines are absolute times of each store's own clock: compare what the decision was, not when.
fn without_times(outcome: Outcome) -> Outcome {
    match outcome {
        Outcome::Admitted { in_flight, .. } => Outcome::Admitted {
            in_flight,
            expires_at_ms: 0,
        },
        Outcome::Renewed { in_flight, .. } => Outcome::Renewed {
            in_flight,
            expires_at_ms: 0,
        },
        other => other,
    }
}

#[test]
fn redis_and_memory_decide_alike() {
    let redis = TestRedis::start();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let case = std::sync::atomic::AtomicU32::new(0);
    let config = ProptestConfig {
        cases: 64,
        ..ProptestConfig::default()
    };
    proptest!(config, |(policy in policy(), ops in prop::collection::vec(coarse_op(), 1..60))| {
        let case = case.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let clock = ManualClock::new(1_000_000);
        let memory = MemoryStore::with_clock(clock.clone());
        // A fresh prefix per case: nothing carries over from the previous one.
        let _guard = rt.enter();
        let shared = RedisStore::builder(redis.url()).prefix(format!("case{case}:")).open().unwrap();
        let (mut memory_holds, mut redis_holds) = (Vec::new(), Vec::new());
        for (step, op) in ops.iter().enumerate() {
            let want = rt.block_on(apply_store(&memory, &|d| clock.advance(d), policy, &mut memory_holds, op));
            let got = rt.block_on(apply_store(&shared, &|d: Duration| shared.advance_clock(d), policy, &mut redis_holds, op));
            prop_assert_eq!(without_times(got), without_times(want), "step {} {:?}", step, op);
        }
    });
}

/// The same, with every operation of a sequence sent at once, so that they reach Redis together in
/// batches (in order): the decisions must still be those of the operations one by one.
#[test]
fn batched_operations_decide_as_one_by_one() {
    use support::ops::Op;
    let redis = TestRedis::start();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let case = std::sync::atomic::AtomicU32::new(0);
    let config = ProptestConfig {
        cases: 64,
        ..ProptestConfig::default()
    };
    let burst_op = coarse_op().prop_filter("batched kinds", |op| {
        matches!(op, Op::Acquire { .. } | Op::Release { .. })
    });
    proptest!(config, |(policy in policy(), ops in prop::collection::vec(burst_op, 1..120))| {
        let case = case.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let clock = ManualClock::new(1_000_000);
        let memory = MemoryStore::with_clock(clock.clone());
        let _guard = rt.enter();
        let shared = RedisStore::builder(redis.url()).prefix(format!("burst{case}:")).open().unwrap();
        let mut holds = Vec::new();
        let want: Vec<Outcome> = ops
            .iter()
            .map(|op| rt.block_on(apply_store(&memory, &|d| clock.advance(d), policy, &mut holds, op)))
            .collect();
        let got: Vec<Outcome> = rt.block_on(futures_util::future::join_all(ops.iter().map(|op| {
            let shared = &shared;
            async move {
                let mut holds = Vec::new();
                apply_store(shared, &|d: Duration| shared.advance_clock(d), policy, &mut holds, op).await
            }
        })));
        for (step, (got, want)) in got.into_iter().zip(want).enumerate() {
            prop_assert_eq!(without_times(got), without_times(want), "step {} {:?}", step, ops[step]);
        }
    });
}
