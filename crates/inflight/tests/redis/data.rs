//! What the store keeps in Redis, and for how long: leases, weights and overrides.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use inflight::{AcquireOptions, Limiter, Policy};

use crate::support::TestRedis;
use crate::timing_sensitive;

#[tokio::test]
async fn what_is_left_in_redis_expires_except_the_overrides() {
    let redis = TestRedis::start();
    let limiter = Limiter::builder(redis.store())
        .policy(Policy::new(5, 0))
        .build();
    limiter.set_limit("configured", 3).await.unwrap();
    let heavy = limiter
        .try_acquire_with("weighted", AcquireOptions::new().weight(3))
        .await
        .unwrap();
    let plain = limiter.try_acquire("plain").await.unwrap();
    let _detached = limiter.try_acquire("handed-off").await.unwrap().detach();
    heavy.release().await.unwrap();
    plain.release().await.unwrap();
    let mut c = redis.client();
    let keys: Vec<String> = redis::cmd("KEYS").arg("*").query(&mut c).unwrap();
    assert!(!keys.is_empty());
    for key in keys {
        let ttl: i64 = redis::cmd("PTTL").arg(&key).query(&mut c).unwrap();
        if key.ends_with(":limit") || key.starts_with("inflight:overrides") {
            assert!(
                [
                    "inflight:{configured}:limit",
                    "inflight:overrides",
                    "inflight:overrides:version"
                ]
                .contains(&key.as_str()),
                "{key}"
            );
            assert_eq!(
                ttl, -1,
                "an override (and its index) is configuration: it stays"
            );
        } else {
            assert!(ttl > 0, "{key} would never expire");
        }
    }
}

#[tokio::test]
async fn weights_never_outlive_the_leases_they_count() {
    let redis = TestRedis::start();
    let limiter = Limiter::builder(redis.store())
        .policy(Policy::new(10, 0))
        .build();
    let _plain = limiter.try_acquire("k").await.unwrap();
    let _heavy = limiter
        .try_acquire_with(
            "k",
            AcquireOptions::new()
                .weight(5)
                .lease(Duration::from_secs(60)),
        )
        .await
        .unwrap();
    let mut c = redis.client();
    let leases: i64 = redis::cmd("PTTL")
        .arg("inflight:{k}:leases")
        .query(&mut c)
        .unwrap();
    let weights: i64 = redis::cmd("PTTL")
        .arg("inflight:{k}:permits")
        .query(&mut c)
        .unwrap();
    assert!(
        weights > 0 && weights <= leases,
        "weights {weights} ms, leases {leases} ms"
    );
    // If the leases vanish alone (evicted), their weights must not keep counting.
    redis::cmd("DEL")
        .arg("inflight:{k}:leases")
        .exec(&mut c)
        .unwrap();
    assert_eq!(limiter.status("k").await.unwrap().in_flight, 0);
    let heavy = limiter
        .try_acquire_with("k", AcquireOptions::new().weight(10))
        .await;
    assert!(heavy.is_ok(), "{heavy:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_permit_held_for_ten_leases_is_never_evicted() {
    let _machine = timing_sensitive().await;
    let redis = TestRedis::start();
    let holder = Limiter::builder(redis.store())
        .policy(Policy::new(1, 0))
        .lease(Duration::from_secs(1))
        .build();
    let other = Limiter::builder(redis.store())
        .policy(Policy::new(1, 0))
        .build();
    let permit = holder.try_acquire("long").await.unwrap();
    let start = Instant::now();
    let mut attempts = 0;
    while start.elapsed() < Duration::from_secs(10) {
        assert!(
            other.try_acquire("long").await.unwrap_err().is_full(),
            "evicted after {:?}",
            start.elapsed()
        );
        attempts += 1;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(attempts > 100);
    assert!(!permit.is_lost());
    assert_eq!(other.stats().reclaimed.load(Ordering::Relaxed), 0);
    drop(permit);
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(other.try_acquire("long").await.is_ok());
}

#[tokio::test]
async fn a_limit_set_through_one_connection_applies_to_the_next_admission_on_another() {
    let redis = TestRedis::start();
    let one = Limiter::builder(redis.store())
        .policy(Policy::new(1, 0))
        .build();
    let two = Limiter::builder(redis.store())
        .policy(Policy::new(1, 0))
        .build();
    let _a = two.try_acquire("app").await.unwrap();
    assert!(two.try_acquire("app").await.unwrap_err().is_full());
    one.set_limit("app", 2).await.unwrap();
    let _b = two
        .try_acquire("app")
        .await
        .expect("the new limit, at the very next admission");
    one.set_limit("app", 1).await.unwrap();
    assert!(two.try_acquire("app").await.unwrap_err().is_full());
}
