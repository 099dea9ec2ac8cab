//! The batches the store sends to Redis: every pipeline depth, a key emptied and refilled within one
//! batch, and more releases at once than the release task keeps pending.

use std::sync::Arc;
use std::time::{Duration, Instant};

use inflight::store::{AcquireRequest, Admission};
use inflight::{ClassLimits, Limiter, PermitId, Policy, RedisStore, Store};

use crate::support::TestRedis;

/// However many batches may be out at once (0 counts as 1), 64 admissions at once on a key of limit 10
/// admit 10, and their releases give the slots back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_pipeline_depth_admits_exactly_the_limit() {
    let redis = TestRedis::start();
    for depth in [0, 1, 3, 8] {
        let store = RedisStore::builder(redis.url())
            .prefix(format!("depth{depth}:"))
            .pipeline(depth)
            .open()
            .unwrap();
        let limiter = Arc::new(Limiter::builder(store).policy(Policy::new(10, 0)).build());
        let attempts: Vec<_> = (0..64)
            .map(|_| {
                let limiter = limiter.clone();
                tokio::spawn(async move { limiter.try_acquire("k").await })
            })
            .collect();
        let mut permits = Vec::new();
        for attempt in attempts {
            match attempt.await.unwrap() {
                Ok(permit) => permits.push(permit),
                Err(error) => assert!(error.is_full(), "depth {depth}: {error}"),
            }
        }
        assert_eq!(permits.len(), 10, "depth {depth}");
        for permit in permits {
            permit.release().await.unwrap();
        }
        assert_eq!(
            limiter.status("k").await.unwrap().in_flight,
            0,
            "depth {depth}"
        );
    }
}

/// One batch that empties a key and fills it again: the set Redis deletes with its last lease and the one
/// the next admission creates are two keys, and the new one must get an expiry of its own.
#[tokio::test]
async fn a_key_emptied_and_refilled_within_one_batch_still_expires() {
    let redis = TestRedis::start();
    let store = redis.store();
    let limits = [ClassLimits::new(4, 0)];
    let (first, second) = (PermitId::generate(), PermitId::generate());
    let keys = [std::sync::Arc::from("k")];
    let acquire = |id| {
        store.acquire(AcquireRequest {
            keys: &["k"],
            id,
            weight: 1,
            lease_ms: 30_000,
            limits: &limits,
            generated: false,
            ticket: None,
            priority: 0,
            floors: &[],
            holder: None,
            shadow: 0,
        })
    };
    // Sent together from one thread, so they reach the dispatcher, and Redis, as one batch in this order.
    let (a, released, b) = tokio::join!(
        acquire(&first),
        store.release(&keys, &first, 0),
        acquire(&second)
    );
    assert!(matches!(a.unwrap(), Admission::Admitted { .. }));
    assert!(released.unwrap());
    assert!(matches!(b.unwrap(), Admission::Admitted { .. }));
    let mut c = redis.client();
    let ttl: i64 = redis::cmd("PTTL")
        .arg("inflight:{k}:leases")
        .query(&mut c)
        .unwrap();
    assert!(
        ttl > 30_000,
        "the refilled set must expire after its lease, PTTL {ttl}"
    );
}

/// The release task bounds the releases pending at once (65,536), not all it ever had: far more dropped
/// permits than that are all released.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn more_dropped_permits_than_the_pending_bound_are_all_released() {
    let redis = TestRedis::start();
    let limiter = Limiter::builder(redis.store())
        .policy(Policy::new(64, 0))
        .lease(Duration::from_secs(60))
        .build();
    let tasks: Vec<_> = (0..64)
        .map(|_| {
            let limiter = limiter.clone();
            tokio::spawn(async move {
                let mut admitted = 0;
                while admitted < 1_100 {
                    match limiter.try_acquire("k").await {
                        Ok(permit) => {
                            admitted += 1;
                            drop(permit);
                        }
                        Err(error) => {
                            assert!(error.is_full(), "{error}");
                            tokio::task::yield_now().await;
                        }
                    }
                }
            })
        })
        .collect();
    let all = futures_util::future::join_all(tasks);
    tokio::time::timeout(Duration::from_secs(60), all)
        .await
        .expect("70,400 permits admitted: their slots came back");
    let started = Instant::now();
    while limiter.status("k").await.unwrap().in_flight > 0 {
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "releases were dropped"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
