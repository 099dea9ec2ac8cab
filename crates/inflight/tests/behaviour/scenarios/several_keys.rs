//! Permits on several keys: taken together or not at all, renewed and released by a recorded id.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use futures_util::stream;
use inflight::{AcquireError, AcquireOptions, ClassLimits, Limit, Policy, RemoteLease, Renewal};

use super::{classes, settle, LEASE};
use crate::fixtures::Fixture;

pub async fn several_limits_are_taken_together_or_not_at_all<F: Fixture>(f: F) {
    // An app's own limit, its tenant's, and a global one (defect D12).
    let limiter = f.limiter(Policy::new(2, 0));
    limiter.set_limit("tenant:acme", 3).await.unwrap();
    limiter.set_limit("global", 10).await.unwrap();
    let keys = |app: &'static str| [app, "tenant:acme", "global"];
    let a1 = limiter
        .try_acquire_all(&keys("app:a"), AcquireOptions::new())
        .await
        .unwrap();
    assert_eq!(
        (a1.key(), a1.limit(), a1.in_flight()),
        ("app:a", Limit::Limited(2), 1)
    );
    let _a2 = limiter
        .try_acquire_all(&keys("app:a"), AcquireOptions::new())
        .await
        .unwrap();
    let refused = limiter
        .try_acquire_all(&keys("app:a"), AcquireOptions::new())
        .await
        .unwrap_err();
    assert_eq!(refused.key, "app:a", "the app's own limit refused");
    assert!(refused.error.is_full());
    let b1 = limiter
        .try_acquire_all(&keys("app:b"), AcquireOptions::new())
        .await
        .unwrap();
    let refused = limiter
        .try_acquire_all(&keys("app:b"), AcquireOptions::new())
        .await
        .unwrap_err();
    assert_eq!(refused.key, "tenant:acme", "the tenant is full");
    let status = |key| limiter.status(key);
    assert_eq!(
        status("app:b").await.unwrap().in_flight,
        1,
        "nothing kept from the refusal"
    );
    assert_eq!(status("global").await.unwrap().in_flight, 3);
    // One permit, released together on every path; the same id on every key.
    let id = b1.id().clone();
    let streamed = b1.guard_stream(stream::iter([1]));
    drop(streamed);
    settle(&limiter, "tenant:acme", 2).await;
    settle(&limiter, "app:b", 0).await;
    settle(&limiter, "global", 2).await;
    assert!(
        !limiter
            .release(&RemoteLease::new(&["global"], id.clone(), 0))
            .await
            .unwrap()
            .0,
        "already released"
    );
    a1.release().await.unwrap();
    settle(&limiter, "tenant:acme", 1).await;
    // Repeated keys count once; no keys is a bad request.
    let twice = limiter
        .try_acquire_all(&["app:c", "app:c"], AcquireOptions::new())
        .await
        .unwrap();
    assert_eq!(limiter.status("app:c").await.unwrap().in_flight, 1);
    drop(twice);
    let none = limiter
        .try_acquire_all(&[], AcquireOptions::new())
        .await
        .unwrap_err();
    assert!(matches!(none.error, AcquireError::Invalid(_)));
    // At most 16 keys at once, however many are given.
    let names: Vec<String> = (0..50_000).map(|n| format!("k{n}")).collect();
    let many: Vec<&str> = names.iter().map(String::as_str).collect();
    let refused = limiter
        .try_acquire_all(&many, AcquireOptions::new())
        .await
        .unwrap_err();
    assert!(matches!(refused.error, AcquireError::Invalid(_)));
}

pub async fn a_permit_on_several_keys_is_renewed_and_released_by_its_recorded_id<F: Fixture>(f: F) {
    let limiter = f.limiter(classes());
    let keys = ["tenant:t", "app:a", "user:free"];
    let options = AcquireOptions::new().id("req-1").lease(LEASE);
    let lease = limiter
        .try_acquire_all(&keys, options)
        .await
        .unwrap()
        .detach();
    let names: Vec<Arc<str>> = keys.iter().map(|key| Arc::from(*key)).collect();
    limiter
        .record(&names, &lease.id, LEASE, None)
        .await
        .unwrap();
    let by_id = RemoteLease::recorded(lease.id.clone(), lease.token);
    // Renewed on every key for as long as the caller renews, found from the id alone.
    for _ in 0..3 {
        f.advance(LEASE / 2);
        let (renewal, found) = limiter.renew(&by_id, None).await.unwrap();
        assert_eq!(&*found.unwrap().keys, names.as_slice());
        assert!(matches!(renewal, Renewal::Renewed(grant) if grant.in_flight == 1));
    }
    assert_eq!(limiter.status("app:a").await.unwrap().in_flight, 1);
    assert_eq!(limiter.status("tenant:t").await.unwrap().in_flight, 1);
    let (held, found) = limiter.release(&by_id).await.unwrap();
    assert_eq!((found.unwrap().keys.len(), held), (3, true));
    assert_eq!(limiter.status("app:a").await.unwrap().in_flight, 0);
    assert_eq!(limiter.status("tenant:t").await.unwrap().in_flight, 0);
    let gone = limiter.renew(&by_id, None).await.unwrap();
    assert_eq!(gone, (Renewal::Lost, None));
    let twice = limiter.release(&by_id).await.unwrap();
    assert_eq!(twice, (false, None), "twice: no error");
    // A record whose lease ended goes with it; a lease named by its keys is renewed and released alone.
    let options = AcquireOptions::new().id("req-2").lease(LEASE);
    let lease = limiter
        .try_acquire_all(&keys, options)
        .await
        .unwrap()
        .detach();
    limiter
        .record(&names, &lease.id, LEASE, None)
        .await
        .unwrap();
    let by_keys = RemoteLease::new(&keys, lease.id.clone(), lease.token);
    let renewed = limiter.renew(&by_keys, Some(LEASE * 2)).await.unwrap();
    assert!(
        matches!(renewed, (Renewal::Renewed(_), None)),
        "{renewed:?}"
    );
    f.advance(LEASE * 3);
    let by_id = RemoteLease::recorded(lease.id.clone(), lease.token);
    let gone = limiter.renew(&by_id, None).await.unwrap();
    assert!(matches!(gone.0, Renewal::Lost), "{gone:?}");
    assert_eq!(limiter.release(&by_keys).await.unwrap(), (false, None));
}

/// With `a` full, admissions on `[b, a]` are refused again and again while a probe takes `b` alone: the
/// probe never fails, because a refused admission never holds `b`, not even for a moment. (The keys share
/// a hash tag: on Redis Cluster only keys of one slot are taken in one step; keys of several slots may
/// hold a slot while they roll back, which `tests/cluster.rs` bounds.) The probe starts only once every
/// refuser has been refused, and yields between its rounds, so the refusals overlap the probe whatever the
/// runtime and however its threads are scheduled: no round of the probe can finish before they begin.
pub async fn a_refused_admission_on_several_keys_never_takes_a_slot_for_a_moment<F: Fixture>(f: F) {
    let limiter = f.limiter(Policy::new(1, 0));
    let (a, b) = ("{k}a", "{k}b");
    let _a = limiter.try_acquire(a).await.unwrap();
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    // The 4 refusers and the probe: passed once each refuser has been refused once.
    let started = Arc::new(tokio::sync::Barrier::new(5));
    let refusers: Vec<_> = (0..4)
        .map(|_| {
            let (limiter, stop, started) = (limiter.clone(), stop.clone(), started.clone());
            tokio::spawn(async move {
                let mut refused = 0u32;
                while !stop.load(Ordering::Relaxed) {
                    let err = limiter
                        .try_acquire_all(&[b, a], AcquireOptions::new().id(format!("r{refused}")))
                        .await
                        .unwrap_err();
                    // `b` itself when the probe holds it.
                    assert!(err.error.is_full(), "{err:?}");
                    refused += 1;
                    if refused == 1 {
                        started.wait().await;
                    }
                    tokio::task::yield_now().await;
                }
                refused
            })
        })
        .collect();
    tokio::time::timeout(Duration::from_secs(10), started.wait())
        .await
        .expect("every refuser is refused once before the probe starts");
    for round in 0..300 {
        let probe = limiter
            .try_acquire_with(b, AcquireOptions::new().id("probe"))
            .await;
        assert!(
            probe.is_ok(),
            "round {round}: b alone was refused: {probe:?}"
        );
        probe.unwrap().release().await.unwrap();
        // The refusers run between the rounds, on a runtime of one thread too.
        tokio::task::yield_now().await;
    }
    stop.store(true, Ordering::Relaxed);
    let mut refused = 0;
    for task in refusers {
        refused += task.await.unwrap();
    }
    assert!(refused > 0);
    assert_eq!(
        limiter.status(b).await.unwrap().in_flight,
        0,
        "nothing left on b"
    );
}

/// A key of a held permit that becomes limited (a new rule, a new override) does not end the permit: it
/// is renewed on its other keys, and taken on that key too once there is room.
pub async fn a_permit_stays_held_when_one_of_its_keys_becomes_limited<F: Fixture>(f: F) {
    let limiter = f.limiter(classes());
    let options = AcquireOptions::new().id("p1").lease(LEASE);
    let lease = limiter
        .try_acquire_all(&["app:a", "user:u"], options)
        .await
        .unwrap()
        .detach();
    limiter.set_limit("user:u", 1).await.unwrap();
    let other = limiter.try_acquire("user:u").await.unwrap();
    assert!(other.is_counted());
    let remote = RemoteLease::new(&["app:a", "user:u"], lease.id.clone(), lease.token);
    let (renewal, _) = limiter.renew(&remote, None).await.unwrap();
    assert!(matches!(renewal, Renewal::Renewed(_)), "{renewal:?}");
    assert_eq!(limiter.status("app:a").await.unwrap().in_flight, 1);
    assert_eq!(
        limiter.status("user:u").await.unwrap().in_flight,
        1,
        "no room: uncounted there"
    );
    other.release().await.unwrap();
    let (renewal, _) = limiter.renew(&remote, None).await.unwrap();
    assert!(matches!(renewal, Renewal::Renewed(_)), "{renewal:?}");
    assert_eq!(
        limiter.status("user:u").await.unwrap().in_flight,
        1,
        "taken once it fits"
    );
    assert!(limiter.release(&remote).await.unwrap().0);
    // The same for a permit the limiter renews itself: a reload limits one of its keys, which is full.
    let held = limiter
        .try_acquire_all(&["app:b", "user:v"], AcquireOptions::new().id("p2"))
        .await
        .unwrap();
    let tighter = classes().rule("user:*", ClassLimits::new(1, 0)).unwrap();
    let _full = f
        .limiter(tighter.clone())
        .try_acquire("user:v")
        .await
        .unwrap();
    limiter.set_policy(tighter);
    f.advance(LEASE / 2);
    limiter.renew_now().await;
    assert!(!held.is_lost(), "held on app:b, so still held");
    assert_eq!(limiter.status("app:b").await.unwrap().in_flight, 1);
}
