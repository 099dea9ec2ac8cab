//! Admission at the limit: ids, weights, keys, and many tasks at once.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use inflight::{AcquireError, AcquireOptions, Limit, PermitId, Policy, RemoteLease, Renewal};

use super::{settle, LEASE};
use crate::fixtures::Fixture;

pub async fn admits_up_to_the_limit_and_rejects_exactly_at_it<F: Fixture>(f: F) {
    let limiter = f.limiter(Policy::new(3, 0));
    let mut held = Vec::new();
    for n in 1..=3 {
        let permit = limiter
            .try_acquire("app")
            .await
            .expect("room under the limit");
        assert_eq!(permit.limit(), Limit::Limited(3));
        assert_eq!(permit.in_flight(), n);
        held.push(permit);
    }
    let err = limiter
        .try_acquire("app")
        .await
        .expect_err("the 4th is over the limit");
    assert_eq!(
        err,
        AcquireError::Full {
            limit: 3,
            in_flight: 3
        }
    );
    assert_eq!(err.retry_after(), Some(Duration::from_secs(1)));
    assert_eq!(limiter.status("app").await.unwrap().in_flight, 3);
    // Other keys are not affected.
    let other = limiter
        .try_acquire("other-app")
        .await
        .expect("another key has its own slots");
    assert_eq!(other.in_flight(), 1);
}

pub async fn generated_ids_are_uuids_and_given_ids_are_kept<F: Fixture>(f: F) {
    let limiter = f.limiter(Policy::new(5, 0));
    let a = limiter.try_acquire("app").await.unwrap();
    let b = limiter.try_acquire("app").await.unwrap();
    assert_ne!(a.id(), b.id());
    assert!(uuid_like(&a.id().to_string()), "{}", a.id());
    let given = limiter
        .try_acquire_with("app", AcquireOptions::new().id("req-123"))
        .await
        .unwrap();
    assert_eq!(given.id().to_string(), "req-123");
    // The given id is what the store holds: releasing it by id frees it.
    let lease = given.detach();
    let lease = RemoteLease::new(&["app"], lease.id, lease.token);
    assert!(limiter.release(&lease).await.unwrap().0);
    let again = limiter.release(&lease).await.unwrap().0;
    assert!(!again, "second release is a no-op");
    assert_eq!(limiter.status("app").await.unwrap().in_flight, 2);
}

pub async fn an_empty_id_is_refused_and_never_matches<F: Fixture>(f: F) {
    let limiter = f.limiter(Policy::new(5, 0));
    let _weighted = limiter
        .try_acquire_with("app", AcquireOptions::new().weight(3))
        .await
        .unwrap();
    let err = limiter
        .try_acquire_with("app", AcquireOptions::new().id(""))
        .await
        .unwrap_err();
    assert!(matches!(err, AcquireError::Invalid(_)), "{err:?}");
    let empty = RemoteLease::new(&["app"], "", 0);
    assert!(!limiter.release(&empty).await.unwrap().0);
    assert_eq!(limiter.renew(&empty, None).await.unwrap().0, Renewal::Lost);
    assert_eq!(
        limiter.status("app").await.unwrap().in_flight,
        3,
        "the weights' bookkeeping is intact"
    );
}

pub async fn weights_count_and_a_weight_over_the_limit_can_never_fit<F: Fixture>(f: F) {
    let limiter = f.limiter(Policy::new(5, 0));
    let heavy = limiter
        .try_acquire_with("app", AcquireOptions::new().weight(3))
        .await
        .unwrap();
    assert_eq!((heavy.weight(), heavy.in_flight()), (3, 3));
    let err = limiter
        .try_acquire_with("app", AcquireOptions::new().weight(3))
        .await
        .unwrap_err();
    assert_eq!(
        err,
        AcquireError::Full {
            limit: 5,
            in_flight: 3
        }
    );
    let _two = limiter
        .try_acquire_with("app", AcquireOptions::new().weight(2))
        .await
        .unwrap();
    let err = limiter
        .try_acquire_with("app", AcquireOptions::new().weight(6))
        .await
        .unwrap_err();
    assert_eq!(
        err,
        AcquireError::WeightExceedsLimit {
            weight: 6,
            limit: 5
        }
    );
    let err = limiter
        .try_acquire_with("app", AcquireOptions::new().weight(0))
        .await
        .unwrap_err();
    assert!(matches!(err, AcquireError::Invalid(_)));
    drop(heavy);
    settle(&limiter, "app", 2).await;
}

pub async fn weights_as_large_as_the_limit_never_overflow<F: Fixture>(f: F) {
    let limiter = f.limiter(Policy::new(u32::MAX, 0));
    let big = AcquireOptions::new().weight(3_000_000_000);
    let _first = limiter.try_acquire_with("app", big.clone()).await.unwrap();
    let err = limiter.try_acquire_with("app", big).await.unwrap_err();
    assert_eq!(
        err,
        AcquireError::Full {
            limit: u32::MAX,
            in_flight: 3_000_000_000
        }
    );
    let err = limiter
        .try_acquire_with(
            "app",
            AcquireOptions::new().lease(Duration::from_secs(2 * 86_400)),
        )
        .await
        .unwrap_err();
    assert!(
        matches!(err, AcquireError::Invalid(_)),
        "leases are at most a day: {err:?}"
    );
}

pub async fn status_of_an_unknown_key_is_empty<F: Fixture>(f: F) {
    let limiter = f.limiter(Policy::new(7, 0));
    let status = limiter.status("never-seen").await.unwrap();
    assert_eq!(
        (status.limit, status.override_limit, status.in_flight),
        (Limit::Limited(7), None, 0)
    );
    let unknown = RemoteLease::new(&["never-seen"], PermitId::generate(), 0);
    assert!(!limiter.release(&unknown).await.unwrap().0);
}

pub async fn keys_are_opaque<F: Fixture>(f: F) {
    let limiter = f.limiter(Policy::new(1, 0));
    for key in [
        "",
        "a:b",
        "{tag}",
        "}{",
        "with space",
        "ünïcode",
        "x\u{0}y",
        "*",
        "a/b/../c",
    ] {
        let permit = limiter.try_acquire(key).await.unwrap();
        assert!(
            limiter.try_acquire(key).await.unwrap_err().is_full(),
            "key {key:?}"
        );
        assert_eq!(
            limiter.status(key).await.unwrap().in_flight,
            1,
            "key {key:?}"
        );
        drop(permit);
        settle(&limiter, key, 0).await;
    }
    let _ = LEASE;
}

pub async fn many_tasks_never_exceed_the_limit_and_end_at_zero<F: Fixture>(f: F) {
    const LIMIT: u32 = 4;
    let limiters: Vec<_> = (0..4).map(|_| f.limiter(Policy::new(LIMIT, 0))).collect();
    let probe = Arc::new(AtomicU32::new(0));
    let max_seen = Arc::new(AtomicU32::new(0));
    let admitted = Arc::new(AtomicU32::new(0));
    let mut tasks = Vec::new();
    for t in 0..64 {
        let limiter = limiters[t % limiters.len()].clone();
        let (probe, max_seen, admitted) = (probe.clone(), max_seen.clone(), admitted.clone());
        tasks.push(tokio::spawn(async move {
            for _ in 0..200 {
                if let Ok(permit) = limiter.try_acquire("hot").await {
                    let now = probe.fetch_add(1, Ordering::SeqCst) + 1;
                    max_seen.fetch_max(now, Ordering::SeqCst);
                    admitted.fetch_add(1, Ordering::Relaxed);
                    tokio::task::yield_now().await;
                    probe.fetch_sub(1, Ordering::SeqCst);
                    permit.release().await.unwrap();
                } else {
                    tokio::task::yield_now().await;
                }
            }
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
    let max = max_seen.load(Ordering::SeqCst);
    assert!(max <= LIMIT, "saw {max} in flight at limit {LIMIT}");
    assert_eq!(max, LIMIT, "the limit was reached under this load");
    assert!(admitted.load(Ordering::Relaxed) > 100);
    assert_eq!(limiters[0].status("hot").await.unwrap().in_flight, 0);
}

fn uuid_like(s: &str) -> bool {
    s.len() == 36 && s.chars().filter(|c| *c == '-').count() == 4
}
