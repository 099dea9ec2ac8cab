//! The view of overrides on Redis: unlimited keys are admitted without a round trip, also while Redis is
//! away, and an override set by one process reaches every other within moments.
#![allow(missing_docs)]

mod support;

use std::time::{Duration, Instant};

use inflight::store::OverrideChange;
use inflight::{AcquireError, ClassLimits, FailurePolicy, Limiter, Policy, RedisStore, Store};
use support::gate::Gate;
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

/// True when `store`'s view lets `key` (of an unlimited class) be admitted without asking Redis.
fn unasked(store: &RedisStore, key: &str) -> bool {
    store
        .hold(&[key], &[ClassLimits::default()], 1, false)
        .is_some()
}

/// Waits (up to 10 s) until `what` holds.
async fn until(what: &str, mut done: impl FnMut() -> bool) {
    let started = Instant::now();
    while !done() {
        assert!(started.elapsed() < Duration::from_secs(10), "never: {what}");
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

/// Issue 28, item 5: this process clears `k`; before its answer arrives, another process sets `k` again
/// and the view here hears of both. The clear's answer must not take `k` out of the view (no poll would
/// ever put it back: the view's version is Redis's).
#[tokio::test]
async fn a_clears_answer_never_undoes_a_newer_override_in_the_view() {
    let redis = TestRedis::start();
    let gate = Gate::start(redis.port()).await;
    let store = test_support::store_builder(gate.url())
        .response_timeout(Duration::from_secs(30))
        .open()
        .unwrap();
    let other = limiter(redis.store());
    let mut c = redis.client();
    until("the view is read", || unasked(&store, "probe")).await;
    other.set_limit("k", 5).await.unwrap();
    until("the view has k", || !unasked(&store, "k")).await;

    gate.hold();
    let clearing = tokio::spawn({
        let store = store.clone();
        async move {
            let limits = ClassLimits::default();
            store.status("k", limits, OverrideChange::Clear).await
        }
    });
    let cleared = || {
        !redis::cmd("EXISTS")
            .arg("inflight:{k}:limit")
            .query::<bool>(&mut c)
            .unwrap()
    };
    until("the clear ran in Redis", cleared).await;
    until("the view heard of the clear", || unasked(&store, "k")).await;
    other.set_limit("k", 1).await.unwrap();
    until("the view heard of the new override", || {
        !unasked(&store, "k")
    })
    .await;
    gate.open();
    let status = clearing.await.unwrap().unwrap();
    assert_eq!(status.override_limit, None);

    assert!(
        !unasked(&store, "k"),
        "the clear's answer undid the newer override"
    );
    let here = limiter(store);
    let _held = other.try_acquire("k").await.unwrap();
    assert!(here.try_acquire("k").await.unwrap_err().is_full());
}

/// Changes the rules of the ACL user `viewer`.
fn set_viewer(c: &mut redis::Connection, rules: &[&str]) {
    redis::cmd("ACL")
        .arg("SETUSER")
        .arg("viewer")
        .arg(rules)
        .query::<()>(c)
        .unwrap();
}

/// A store that connects as the ACL user `viewer`, allowed everything until a test says otherwise.
fn viewer_store(redis: &TestRedis, c: &mut redis::Connection) -> RedisStore {
    set_viewer(c, &["on", ">secret", "~*", "&*", "+@all"]);
    let url = format!("redis://viewer:secret@127.0.0.1:{}", redis.port());
    test_support::store_builder(url).open().unwrap()
}

/// Issue 28, item 6: the view's subscription is lost and cannot be remade (here its user loses the
/// channel, as an ACL change does; `maxclients` reached does the same) while Redis answers everything
/// else: an override set elsewhere must still reach this process, through the version poll.
#[tokio::test]
async fn an_override_reaches_a_view_that_cannot_subscribe() {
    let redis = TestRedis::start();
    let mut c = redis.client();
    let store = viewer_store(&redis, &mut c);
    let here = limiter(store.clone());
    until("the view is read", || unasked(&store, "probe")).await;
    // Without the channel: its subscription is dropped, and every new one refused (NOPERM).
    set_viewer(&mut c, &["resetchannels"]);
    redis::cmd("CLIENT")
        .arg(&["KILL", "TYPE", "pubsub", "USER", "viewer"])
        .query::<u64>(&mut c)
        .unwrap();
    let subscribed = |c: &mut redis::Connection| {
        let clients: String = redis::cmd("CLIENT").arg("LIST").query(c).unwrap();
        clients
            .lines()
            .any(|l| l.contains("user=viewer") && !l.contains(" sub=0 "))
    };
    assert!(!subscribed(&mut c));

    let other = limiter(redis.store());
    other.set_limit("k", 1).await.unwrap();
    let _held = other.try_acquire("k").await.unwrap();
    let started = Instant::now();
    loop {
        match here.try_acquire("k").await {
            Err(refused) if refused.is_full() => break,
            Ok(permit) => assert!(!permit.is_counted(), "{permit:?}"),
            Err(other) => panic!("{other:?}"),
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "the override never reached the process that cannot subscribe"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    eprintln!("seen without a subscription after {:?}", started.elapsed());
    assert!(!subscribed(&mut c), "the test meant no subscription");
}

/// Redis answers, but refuses the view's reads (an ACL without the index's keys and channel): the view
/// is not trusted, and every admission asks Redis, which sees the override set elsewhere.
#[tokio::test]
async fn a_view_whose_reads_are_refused_is_not_trusted() {
    let redis = TestRedis::start();
    let mut c = redis.client();
    let store = viewer_store(&redis, &mut c);
    let here = limiter(store.clone());
    until("the view is read", || unasked(&store, "probe")).await;
    // The user keeps its keys' names (`inflight:{key}:...`) only.
    set_viewer(&mut c, &["resetchannels", "resetkeys", "~inflight:{*"]);
    redis::cmd("CLIENT")
        .arg(&["KILL", "TYPE", "pubsub", "USER", "viewer"])
        .query::<u64>(&mut c)
        .unwrap();
    until("the view is not trusted", || !unasked(&store, "probe")).await;
    let other = limiter(redis.store());
    other.set_limit("k", 1).await.unwrap();
    let _held = other.try_acquire("k").await.unwrap();
    assert!(here.try_acquire("k").await.unwrap_err().is_full());
}
