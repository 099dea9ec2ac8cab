//! Property test: the Redis store and the memory store make the same decisions for the same random
//! sequences of acquire / release / renew / set-limit / advance-time.
#![allow(missing_docs)]

mod support;

use std::cell::Cell;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use inflight::{ManualClock, MemoryStore, Policy, RedisStore};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};
use support::ops::{apply_store, coarse_op, crowded_op, crowded_policy, policy, Op, Outcome};
use support::TestRedis;

thread_local! {
    /// The most permits on a key that a compared decision reported, on this test's thread.
    static MOST_IN_FLIGHT: Cell<u32> = const { Cell::new(0) };
}

/// Deadlines are absolute times of each store's own clock: compare what the decision was, not when.
fn without_times(outcome: Outcome) -> Outcome {
    if let Outcome::Admitted { in_flight, .. } | Outcome::Renewed { in_flight, .. } = outcome {
        MOST_IN_FLIGHT.set(MOST_IN_FLIGHT.get().max(in_flight));
    }
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

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// A fresh pair for one case: the memory store on its own clock, the Redis store under its own prefix
/// (opened inside the runtime it will live on).
fn fresh_stores(
    redis: &TestRedis,
    prefix: String,
) -> (ManualClock, MemoryStore<ManualClock>, RedisStore) {
    let clock = ManualClock::new(1_000_000);
    let memory = MemoryStore::with_clock(clock.clone());
    let shared = RedisStore::builder(redis.url())
        .prefix(prefix)
        .open()
        .unwrap();
    (clock, memory, shared)
}

/// Every sequence applied one operation at a time to both stores; each case on a fresh prefix.
fn agree_one_by_one(
    cases: u32,
    sequences: impl Strategy<Value = (Policy, Vec<Op>)>,
) -> Result<(), proptest::test_runner::TestError<(Policy, Vec<Op>)>> {
    let redis = TestRedis::start();
    let rt = runtime();
    let case = AtomicU32::new(0);
    TestRunner::new(Config::with_cases(cases)).run(&sequences, |(policy, ops)| {
        let case = case.fetch_add(1, Ordering::Relaxed);
        let _guard = rt.enter();
        let (clock, memory, shared) = fresh_stores(&redis, format!("case{case}:"));
        let (mut memory_holds, mut redis_holds) = (Vec::new(), Vec::new());
        for (step, op) in ops.iter().enumerate() {
            let advance = |d| clock.advance(d);
            let want = rt.block_on(apply_store(
                &memory,
                &advance,
                policy,
                &mut memory_holds,
                op,
            ));
            let advance = |d: Duration| shared.advance_clock(d);
            let got = rt.block_on(apply_store(&shared, &advance, policy, &mut redis_holds, op));
            prop_assert_eq!(
                without_times(got),
                without_times(want),
                "step {} {:?}",
                step,
                op
            );
        }
        Ok(())
    })
}

/// Every sequence sent at once to Redis, so that its operations reach Redis together in batches (in
/// order): the decisions must still be those of the operations one by one.
fn agree_batched(
    cases: u32,
    sequences: impl Strategy<Value = (Policy, Vec<Op>)>,
) -> Result<(), proptest::test_runner::TestError<(Policy, Vec<Op>)>> {
    let redis = TestRedis::start();
    let rt = runtime();
    let case = AtomicU32::new(0);
    TestRunner::new(Config::with_cases(cases)).run(&sequences, |(policy, ops)| {
        let case = case.fetch_add(1, Ordering::Relaxed);
        let _guard = rt.enter();
        let (clock, memory, shared) = fresh_stores(&redis, format!("burst{case}:"));
        let mut holds = Vec::new();
        let want: Vec<Outcome> = ops
            .iter()
            .map(|op| {
                rt.block_on(apply_store(
                    &memory,
                    &|d| clock.advance(d),
                    policy,
                    &mut holds,
                    op,
                ))
            })
            .collect();
        let got: Vec<Outcome> = rt.block_on(futures_util::future::join_all(ops.iter().map(|op| {
            let shared = &shared;
            async move {
                let mut holds = Vec::new();
                let advance = |d: Duration| shared.advance_clock(d);
                apply_store(shared, &advance, policy, &mut holds, op).await
            }
        })));
        for (step, (got, want)) in got.into_iter().zip(want).enumerate() {
            prop_assert_eq!(
                without_times(got),
                without_times(want),
                "step {} {:?}",
                step,
                ops[step]
            );
        }
        Ok::<(), TestCaseError>(())
    })
}

fn batched_kinds(op: &Op) -> bool {
    matches!(op, Op::Acquire { .. } | Op::Release { .. })
}

#[test]
fn redis_and_memory_decide_alike() {
    agree_one_by_one(64, (policy(), prop::collection::vec(coarse_op(), 1..60))).unwrap();
}

#[test]
fn batched_operations_decide_as_one_by_one() {
    let op = coarse_op().prop_filter("batched kinds", batched_kinds);
    agree_batched(64, (policy(), prop::collection::vec(op, 1..120))).unwrap();
}

/// Keys holding hundreds of permits: the Redis store shards them (see `scripts/common.lua`).
#[test]
fn redis_and_memory_decide_alike_on_crowded_keys() {
    let sequences = (
        crowded_policy(),
        prop::collection::vec(crowded_op(), 400..700),
    );
    agree_one_by_one(16, sequences).unwrap();
    // Past a plain sorted set (127 leases) and into shards of 16.
    assert!(MOST_IN_FLIGHT.get() > 150, "{}", MOST_IN_FLIGHT.get());
}

#[test]
fn batched_operations_decide_as_one_by_one_on_crowded_keys() {
    let op = crowded_op().prop_filter("batched kinds", batched_kinds);
    agree_batched(16, (crowded_policy(), prop::collection::vec(op, 400..700))).unwrap();
    assert!(MOST_IN_FLIGHT.get() > 150, "{}", MOST_IN_FLIGHT.get());
}
