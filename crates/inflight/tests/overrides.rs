//! The view of overrides on Redis: unlimited keys are admitted without a round trip, also while Redis is
//! away, and an override set by one process reaches every other within moments.
#![allow(missing_docs)]

mod support;

use std::time::{Duration, Instant};

use inflight::{AcquireError, FailurePolicy, Limiter, Policy, RedisStore};
use support::TestRedis;

fn limiter(store: RedisStore) -> Limiter<RedisStore> {
    Limiter::builder(store)
        .policy(Policy::new(0, 0))
        .on_store_failure(FailurePolicy::FailClosed)
        .build()
}

/// Waits until `key` is admitted with a count in `limiter` (its view knows the override) or not
/// (`counted` false); how long that took, and that permit.
async fn until_counted(
    limiter: &Limiter<RedisStore>,
    key: &str,
    counted: bool,
) -> (Duration, inflight::Permit) {
    let started = Instant::now();
    loop {
        let permit = limiter.try_acquire(key).await.unwrap();
        if permit.is_counted() == counted {
            return (started.elapsed(), permit);
        }
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "{key} never became counted={counted}"
        );
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

/// The view is ready once a batch of admissions runs no script.
async fn until_ready(redis: &TestRedis, limiter: &Limiter<RedisStore>) {
    let started = Instant::now();
    loop {
        let before = redis.scripts_run();
        for _ in 0..10 {
            drop(limiter.try_acquire("probe").await.unwrap());
        }
        if redis.scripts_run() == before {
            return;
        }
        assert!(started.elapsed() < Duration::from_secs(5), "never ready");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test]
async fn unlimited_keys_are_admitted_without_a_script_and_overridden_ones_with_one() {
    let redis = TestRedis::start();
    let limiter = limiter(redis.store());
    until_ready(&redis, &limiter).await;
    let before = redis.scripts_run();
    for n in 0..500 {
        let permit = limiter.try_acquire(&format!("app:{n}")).await.unwrap();
        assert!(!permit.is_counted());
    }
    let many = limiter
        .try_acquire_all(&["a", "b", "c"], Default::default())
        .await;
    assert!(!many.unwrap().is_counted());
    assert_eq!(
        redis.scripts_run(),
        before,
        "no script for an unlimited key"
    );
    limiter.set_limit("app:7", 1).await.unwrap();
    let held = limiter.try_acquire("app:7").await.unwrap();
    assert!(held.is_counted(), "the process that set it sees it at once");
    assert!(limiter.try_acquire("app:7").await.unwrap_err().is_full());
    limiter.clear_limit("app:7").await.unwrap();
    assert!(!limiter.try_acquire("app:7").await.unwrap().is_counted());
}

#[tokio::test]
async fn with_redis_gone_unlimited_keys_are_admitted_and_overridden_ones_refused() {
    let mut redis = TestRedis::start();
    let limiter = limiter(redis.store());
    limiter.set_limit("vip", 5).await.unwrap();
    until_ready(&redis, &limiter).await;
    redis.stop();
    for n in 0..50 {
        let permit = limiter.try_acquire(&format!("free:{n}")).await;
        assert!(permit.is_ok(), "an unlimited key, Redis away: {permit:?}");
    }
    let refused = limiter.try_acquire("vip").await.unwrap_err();
    assert!(matches!(refused, AcquireError::Store(_)), "{refused:?}");
    let refused = limiter
        .try_acquire_all(&["free:1", "vip"], Default::default())
        .await;
    assert!(matches!(refused.unwrap_err().error, AcquireError::Store(_)));
}

#[tokio::test]
async fn an_override_set_by_one_process_applies_in_another_within_moments() {
    let redis = TestRedis::start();
    // Two stores: two connections, two views, as two processes have.
    let (one, two) = (limiter(redis.store()), limiter(redis.store()));
    until_ready(&redis, &two).await;
    let mut took = Vec::new();
    for n in 0..20 {
        let key = format!("app:{n}");
        one.set_limit(&key, 3).await.unwrap();
        took.push(until_counted(&two, &key, true).await.0);
        one.clear_limit(&key).await.unwrap();
        drop(until_counted(&two, &key, false).await);
    }
    took.sort();
    eprintln!(
        "an override reached the other process after: median {:?}, max {:?}",
        took[took.len() / 2],
        took[took.len() - 1]
    );
}

/// An announcement lost on the way (written here without one) is caught by the version poll.
#[tokio::test]
async fn a_lost_announcement_is_caught_by_the_version_poll() {
    let redis = TestRedis::start();
    let limiter = limiter(redis.store());
    until_ready(&redis, &limiter).await;
    let mut c = redis.client();
    redis::pipe()
        .cmd("SET")
        .arg("inflight:{quiet}:limit")
        .arg(1)
        .cmd("HSET")
        .arg("inflight:overrides")
        .arg("quiet")
        .arg(1)
        .cmd("INCR")
        .arg("inflight:overrides:version")
        .query::<()>(&mut c)
        .unwrap();
    let (took, _held) = until_counted(&limiter, "quiet", true).await;
    eprintln!("a silent override was seen after {took:?}");
    assert!(limiter.try_acquire("quiet").await.unwrap_err().is_full());
}

/// Issue 28, item 10: an override another writer left that no process can read (past 2^32 - 1, below 1,
/// not a whole number) is read as none: the key's class limits apply, in every process, and its status
/// says it has no override, instead of every admission on it failing.
#[tokio::test]
async fn an_override_no_process_can_read_is_read_as_none() {
    let redis = TestRedis::start();
    let limiter = Limiter::builder(redis.store())
        .policy(Policy::new(1, 0))
        .build();
    let mut c = redis.client();
    let written = [
        "4294967296",
        "18446744073709551616",
        "1e400",
        "-3",
        "2.5",
        "many",
    ];
    let mut holders = Vec::new();
    for (n, value) in written.into_iter().enumerate() {
        let key = format!("bad:{n}");
        redis::pipe()
            .cmd("SET")
            .arg(format!("inflight:{{{key}}}:limit"))
            .arg(value)
            .cmd("HSET")
            .arg("inflight:overrides")
            .arg(&key)
            .arg(value)
            .query::<()>(&mut c)
            .unwrap();
        let status = limiter.status(&key).await;
        let status = status.unwrap_or_else(|e| panic!("{value}: {e}"));
        assert_eq!(status.override_limit, None, "{value}");
        assert_eq!(status.limit.get(), Some(1), "{value}: the class default");
        let held = limiter.try_acquire(&key).await;
        let held = held.unwrap_or_else(|e| panic!("{value}: {e}"));
        assert_eq!(held.limit().get(), Some(1), "{value}");
        let full = limiter.try_acquire(&key).await.unwrap_err();
        assert!(full.is_full(), "{value}: {full:?}");
        holders.push(held);
        let busy = limiter.busy("bad:", 10).await;
        let busy = busy.unwrap_or_else(|e| panic!("{value}: {e}")).keys;
        assert_eq!(busy.len(), n + 1);
        assert!(busy.iter().all(|b| b.limit.get() == Some(1)), "{busy:?}");
    }
}
