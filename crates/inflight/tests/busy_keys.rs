//! Busy keys ([`inflight::BusyKeys`], [`Limiter::busy`]) on both stores: busiest first, by prefix, live
//! leases only, bounded by the limit asked for, with this limiter's waiters.
#![allow(missing_docs)]

mod support;

use std::future::Future;
use std::time::{Duration, Instant};

use inflight::{
    AcquireOptions, BusyKeys, ClassLimits, Limit, Limiter, ManualClock, MemoryStore, Policy,
};
use support::TestRedis;

fn policy() -> Policy {
    Policy::new(5, 0)
        .rule("gpu:*", ClassLimits::new(2, 0))
        .unwrap()
}

/// `(key, in_flight, limit)` of what `limiter.busy(prefix, limit)` lists.
async fn listed<S: BusyKeys>(
    limiter: &Limiter<S>,
    prefix: &str,
    limit: usize,
) -> (Vec<(String, u32, Limit)>, bool) {
    let busy = limiter.busy(prefix, limit).await.unwrap();
    let keys = busy
        .keys
        .iter()
        .map(|b| (b.key.to_string(), b.in_flight, b.limit))
        .collect();
    (keys, busy.truncated)
}

/// Waits (bounded) until the listing of `prefix` is `want` (releases of dropped permits run in the
/// background).
async fn until_listed<S: BusyKeys>(limiter: &Limiter<S>, prefix: &str, want: &[(&str, u32)]) {
    let started = Instant::now();
    loop {
        let (keys, _) = listed(limiter, prefix, 100).await;
        let got: Vec<(&str, u32)> = keys.iter().map(|(k, n, _)| (k.as_str(), *n)).collect();
        if got == want {
            return;
        }
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "listed {got:?}, want {want:?}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// What every store does.
async fn lists_busy_keys<S: BusyKeys + inflight::Wakeups>(limiter: Limiter<S>) {
    assert_eq!(listed(&limiter, "", 100).await, (vec![], false));
    let heavy = AcquireOptions::new().weight(3);
    let a = limiter.try_acquire_with("app:a", heavy).await.unwrap();
    let b = limiter.try_acquire("app:b").await.unwrap();
    let glob = limiter.try_acquire("app:*[x]{y}%").await.unwrap();
    let gpu = limiter.try_acquire("gpu:1").await.unwrap();
    let other = limiter.try_acquire("other").await.unwrap();
    limiter.set_limit("app:b", 9).await.unwrap();

    let (keys, truncated) = listed(&limiter, "app:", 100).await;
    assert_eq!(
        keys,
        [
            ("app:a".to_owned(), 3, Limit::Limited(5)),
            ("app:*[x]{y}%".to_owned(), 1, Limit::Limited(5)),
            ("app:b".to_owned(), 1, Limit::Limited(9)),
        ]
    );
    assert!(!truncated);
    // The prefix is literal: glob characters in it match only themselves.
    let (keys, _) = listed(&limiter, "app:*", 100).await;
    assert_eq!(keys, [("app:*[x]{y}%".to_owned(), 1, Limit::Limited(5))]);
    let (keys, _) = listed(&limiter, "gpu:", 100).await;
    assert_eq!(keys, [("gpu:1".to_owned(), 1, Limit::Limited(2))]);
    // At most `limit`, busiest first, and says there is more.
    let (keys, truncated) = listed(&limiter, "", 2).await;
    assert_eq!(keys.len(), 2);
    assert_eq!(keys[0].0, "app:a");
    assert!(truncated);

    // A waiter of this limiter on a key at its limit.
    let second = limiter.try_acquire("gpu:1").await.unwrap();
    let waiting = {
        let limiter = limiter.clone();
        let wait = AcquireOptions::new().max_wait(Duration::from_secs(10));
        tokio::spawn(async move { limiter.acquire("gpu:1", wait).await })
    };
    let started = Instant::now();
    loop {
        let busy = limiter.busy("gpu:", 10).await.unwrap();
        if busy.keys[0].waiters == 1 {
            assert_eq!(busy.keys[0].in_flight, 2);
            break;
        }
        assert!(started.elapsed() < Duration::from_secs(5), "no waiter seen");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    drop(second);
    let third = waiting.await.unwrap().unwrap();
    assert_eq!(limiter.busy("gpu:", 10).await.unwrap().keys[0].waiters, 0);

    drop((a, glob));
    until_listed(&limiter, "app:", &[("app:b", 1)]).await;
    drop((b, gpu, other, third));
    until_listed(&limiter, "", &[]).await;
}

#[tokio::test]
async fn memory_lists_busy_keys() {
    let limiter = Limiter::builder(MemoryStore::new())
        .policy(policy())
        .build();
    lists_busy_keys(limiter).await;
}

#[tokio::test]
async fn redis_lists_busy_keys() {
    let redis = TestRedis::start();
    let limiter = Limiter::builder(redis.store()).policy(policy()).build();
    lists_busy_keys(limiter).await;
}

#[tokio::test]
async fn memory_counts_live_leases_only() {
    let clock = ManualClock::new(1_000);
    let store = MemoryStore::with_clock(clock.clone());
    let limiter = Limiter::builder(store).policy(policy()).build();
    let short = AcquireOptions::new().lease(Duration::from_secs(1));
    let _lent = limiter.try_acquire_with("k", short).await.unwrap().detach();
    let heavy = AcquireOptions::new().weight(2);
    let _held = limiter.try_acquire_with("k", heavy).await.unwrap();
    assert_eq!(listed(&limiter, "", 10).await.0[0].1, 3);
    clock.advance(Duration::from_secs(2));
    // The lent lease has expired (not yet reclaimed): not counted; this process's permit still is.
    assert_eq!(listed(&limiter, "", 10).await.0[0].1, 2);
}

#[tokio::test]
async fn redis_counts_live_leases_only_by_weight() {
    let redis = TestRedis::start();
    let store = redis.store();
    let limiter = Limiter::builder(store.clone()).policy(policy()).build();
    let short = AcquireOptions::new().lease(Duration::from_secs(1));
    let _lent = limiter.try_acquire_with("k", short).await.unwrap().detach();
    let heavy = AcquireOptions::new()
        .weight(3)
        .lease(Duration::from_secs(60));
    let _held = limiter.try_acquire_with("k", heavy).await.unwrap().detach();
    assert_eq!(listed(&limiter, "", 10).await.0[0].1, 4);
    store.advance_clock(Duration::from_secs(2));
    assert_eq!(listed(&limiter, "", 10).await.0[0].1, 3);
    store.advance_clock(Duration::from_secs(60));
    assert_eq!(listed(&limiter, "", 10).await, (vec![], false));
}

#[tokio::test]
async fn redis_scans_every_page_under_its_prefix_only() {
    let redis = TestRedis::start();
    let store = redis.store_builder().prefix("t*[1]:").open().unwrap();
    // Another prefix's keys are not this store's.
    let stranger = Limiter::builder(redis.store()).policy(policy()).build();
    let _theirs = stranger.try_acquire("app:x").await.unwrap().detach();
    let limiter = Limiter::builder(store).policy(policy()).build();
    let mut held = Vec::new();
    for n in 0..1200 {
        held.push(limiter.try_acquire(&format!("app:{n}")).await.unwrap());
    }
    let busy = limiter.busy("app:", 1000).await.unwrap();
    assert_eq!(busy.keys.len(), 1000);
    assert!(busy.truncated, "1200 are busy");
    let all = limiter.busy("app:1", 1000).await.unwrap();
    // app:1, app:10..19, app:100..199, app:1000..1199
    assert_eq!(all.keys.len(), 1 + 10 + 100 + 200);
    assert!(!all.truncated);
    assert!(all
        .keys
        .iter()
        .all(|b| b.key.starts_with("app:1") && b.in_flight == 1));
}

#[tokio::test]
async fn redis_dify_layout_says_unsupported() {
    let redis = TestRedis::start();
    let dify = redis.store_builder().dify().open().unwrap();
    let error = dify.busy("", 10).await.unwrap_err();
    assert!(
        matches!(error, inflight::StoreError::Unsupported(_)),
        "{error:?}"
    );
}

/// On a cluster every primary is scanned, keys with a hash tag of their own included, and the whole
/// scenario holds as on one server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_cluster_lists_busy_keys_of_every_primary() {
    let cluster = support::TestCluster::shared();
    let store = cluster
        .store_builder(&support::unique_prefix("busy"))
        .open()
        .unwrap();
    let limiter = Limiter::builder(store).policy(policy()).build();
    let mut held = Vec::new();
    for i in 0..30 {
        held.push(limiter.try_acquire(&format!("spread:{i}")).await.unwrap());
    }
    held.push(limiter.try_acquire("{t1}:app:a").await.unwrap());
    held.push(limiter.try_acquire("{t1}:tenant").await.unwrap());
    let (keys, truncated) = listed(&limiter, "spread:", 100).await;
    assert_eq!((keys.len(), truncated), (30, false), "{keys:?}");
    let (keys, _) = listed(&limiter, "{t1}", 100).await;
    let mut tagged: Vec<&str> = keys.iter().map(|(key, _, _)| key.as_str()).collect();
    tagged.sort_unstable();
    assert_eq!(tagged, ["{t1}:app:a", "{t1}:tenant"]);
    drop(held);
    until_listed(&limiter, "", &[]).await;
    lists_busy_keys(limiter).await;
}

#[tokio::test]
async fn memory_stops_at_the_cap_on_keys_examined() {
    let limiter = Limiter::builder(MemoryStore::new())
        .policy(policy())
        .build();
    let mut held = Vec::new();
    for n in 0..=inflight::store::MAX_EXAMINED {
        held.push(limiter.try_acquire(&format!("k{n}")).await.unwrap());
    }
    let busy = limiter.busy("none:", 10).await.unwrap();
    assert!(busy.keys.is_empty());
    assert!(busy.truncated, "not every key was looked at");
}

#[tokio::test]
async fn redis_stops_at_the_cap_on_names_examined() {
    let redis = TestRedis::start();
    let mut pipe = redis::pipe();
    for n in 0..inflight::store::MAX_EXAMINED + 2_000 {
        pipe.set(format!("other:{n}"), 1).ignore();
    }
    pipe.exec(&mut redis.client()).unwrap();
    let limiter = Limiter::builder(redis.store()).policy(policy()).build();
    let _held = limiter.try_acquire("app:a").await.unwrap().detach();
    let busy = limiter.busy("app:", 10).await.unwrap();
    assert!(busy.truncated, "the scan stopped before the end");
    assert!(busy.keys.len() <= 1);
}

/// A listing of many keys gives the runtime back between turns of cells, so that a single-threaded
/// server's admissions go on meanwhile: polled by hand, it is pending several times before it answers.
#[tokio::test]
async fn memory_listing_yields_to_the_runtime_between_turns() {
    let limiter = Limiter::builder(MemoryStore::new())
        .policy(policy())
        .build();
    let mut held = Vec::new();
    for n in 0..2_000 {
        held.push(limiter.try_acquire(&format!("k{n}")).await.unwrap());
    }
    let mut listing = std::pin::pin!(limiter.busy("", 1000));
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    let mut pending = 0;
    let busy = loop {
        match listing.as_mut().poll(&mut cx) {
            std::task::Poll::Ready(busy) => break busy.unwrap(),
            std::task::Poll::Pending => pending += 1,
        }
    };
    assert!(pending >= 4, "pending {pending} times");
    assert_eq!(busy.keys.len(), 1000);
    assert!(busy.truncated);
}
