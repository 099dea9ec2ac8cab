//! The behaviour every store must have, written once; `main.rs` instantiates it per store.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures_util::{stream, StreamExt};
use inflight::{AcquireError, AcquireOptions, ClassLimits, Limit, PermitId, Policy, Renewal};

use crate::fixtures::Fixture;

const LEASE: Duration = Duration::from_secs(30);

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

pub async fn dropping_or_releasing_a_permit_frees_its_slot<F: Fixture>(f: F) {
    let limiter = f.limiter(Policy::new(1, 0));
    let permit = limiter.try_acquire("app").await.unwrap();
    drop(permit);
    settle(&limiter, "app", 0).await;
    let permit = limiter
        .try_acquire("app")
        .await
        .expect("slot freed by drop");
    permit
        .release()
        .await
        .expect("explicit release reports success");
    assert_eq!(limiter.status("app").await.unwrap().in_flight, 0);
    let _again = limiter
        .try_acquire("app")
        .await
        .expect("slot freed by release");
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
    assert!(limiter.release("app", &lease.id).await.unwrap());
    assert!(
        !limiter.release("app", &lease.id).await.unwrap(),
        "second release is a no-op"
    );
    assert_eq!(limiter.status("app").await.unwrap().in_flight, 2);
}

pub async fn reacquiring_a_held_id_counts_once_and_refreshes_its_lease<F: Fixture>(f: F) {
    let limiter = f.limiter(Policy::new(2, 0));
    let opts = || {
        AcquireOptions::new()
            .id("retried")
            .lease(Duration::from_secs(10))
    };
    let first = limiter
        .try_acquire_with("app", opts())
        .await
        .unwrap()
        .detach();
    f.advance(Duration::from_secs(8));
    let second = limiter
        .try_acquire_with("app", opts())
        .await
        .unwrap()
        .detach();
    assert_eq!(second.in_flight, 1, "the same id counts once");
    assert!(
        second.expires_at_ms >= first.expires_at_ms + 8_000,
        "lease refreshed"
    );
    f.advance(Duration::from_secs(8));
    // 16 s after the first acquisition, 8 s after the second: still held.
    assert_eq!(limiter.status("app").await.unwrap().in_flight, 1);
    // Even at the limit, a retry of a held id is admitted (it already has its slot).
    let _other = limiter.try_acquire("app").await.unwrap();
    let third = limiter
        .try_acquire_with("app", opts())
        .await
        .unwrap()
        .detach();
    assert_eq!(third.in_flight, 2);
}

pub async fn two_permits_for_one_id_hold_the_slot_until_the_last_goes<F: Fixture>(f: F) {
    // Dify's re-enter pattern: a request admitted under its id, then admitted again under the same id.
    let limiter = f.limiter(Policy::new(2, 0));
    let options = || AcquireOptions::new().id("request-1");
    let first = limiter.try_acquire_with("app", options()).await.unwrap();
    let second = limiter.try_acquire_with("app", options()).await.unwrap();
    assert_eq!(second.in_flight(), 1, "the same id counts once");
    assert_eq!(limiter.held(), 1, "one lease, renewed once");
    drop(first);
    let other = limiter.try_acquire("app").await.unwrap();
    assert!(
        limiter.try_acquire("app").await.unwrap_err().is_full(),
        "the live holder still has its slot"
    );
    limiter.renew_now().await;
    assert!(!second.is_lost());
    drop(second);
    settle(&limiter, "app", 1).await;
    drop(other);
    settle(&limiter, "app", 0).await;
}

pub async fn a_retry_under_the_same_id_right_after_a_release_keeps_its_slot<F: Fixture>(f: F) {
    let limiter = f.limiter(Policy::new(1, 0));
    let options = || AcquireOptions::new().id("request-1");
    for _ in 0..3 {
        let first = limiter.try_acquire_with("app", options()).await.unwrap();
        drop(first);
        let retried = limiter.try_acquire_with("app", options()).await.unwrap();
        // The first one's release reached the store before the retry: the retry's lease is the one held.
        settle(&limiter, "app", 1).await;
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert_eq!(limiter.status("app").await.unwrap().in_flight, 1);
        assert!(limiter.try_acquire("app").await.unwrap_err().is_full());
        drop(retried);
        settle(&limiter, "app", 0).await;
    }
    // Held with another weight, the id cannot be joined.
    let held = limiter.try_acquire_with("app", options()).await.unwrap();
    let heavier = limiter.try_acquire_with("app", options().weight(2)).await;
    assert!(
        matches!(heavier, Err(AcquireError::Invalid(_))),
        "{heavier:?}"
    );
    drop(held);
}

pub async fn a_renewal_without_a_length_keeps_the_leases_own<F: Fixture>(f: F) {
    let limiter = f.limiter(Policy::new(2, 0));
    let long = Duration::from_secs(60);
    let lease = limiter
        .try_acquire_with("app", AcquireOptions::new().lease(long))
        .await
        .unwrap()
        .detach();
    f.advance(Duration::from_secs(40));
    let Renewal::Renewed(grant) = limiter.renew("app", &lease.id, None).await.unwrap() else {
        panic!("held");
    };
    assert!(
        grant.expires_at_ms >= lease.expires_at_ms + 40_000,
        "renewed for its own 60 s, not the limiter's 30 s"
    );
    // Past the limiter's lease, within its own: still held.
    f.advance(Duration::from_secs(45));
    assert_eq!(limiter.status("app").await.unwrap().in_flight, 1);
    // A renewal with a length changes it for the renewals after it too.
    limiter
        .renew("app", &lease.id, Some(Duration::from_secs(5)))
        .await
        .unwrap();
    f.advance(Duration::from_secs(4));
    limiter.renew("app", &lease.id, None).await.unwrap();
    f.advance(Duration::from_secs(6));
    assert_eq!(limiter.status("app").await.unwrap().in_flight, 0);
}

pub async fn a_limit_change_applies_to_the_next_admission_in_every_process<F: Fixture>(f: F) {
    let one = f.limiter(Policy::new(1, 0));
    let two = f.limiter(Policy::new(1, 0));
    let _held = one.try_acquire("app").await.unwrap();
    assert!(two.try_acquire("app").await.unwrap_err().is_full());
    let status = one.set_limit("app", 2).await.unwrap();
    assert_eq!(
        (status.limit, status.override_limit, status.in_flight),
        (Limit::Limited(2), Some(2), 1)
    );
    let _second = two
        .try_acquire("app")
        .await
        .expect("the other process sees the new limit at once");
    one.clear_limit("app").await.unwrap();
    let status = two.status("app").await.unwrap();
    assert_eq!(
        (status.limit, status.override_limit, status.in_flight),
        (Limit::Limited(1), None, 2)
    );
    assert!(two.try_acquire("app").await.unwrap_err().is_full());
    // 0 clears too.
    one.set_limit("app", 4).await.unwrap();
    assert_eq!(one.set_limit("app", 0).await.unwrap().override_limit, None);
}

pub async fn the_ceiling_caps_every_override<F: Fixture>(f: F) {
    let limiter = f.limiter(Policy::new(3, 4));
    assert_eq!(
        limiter.set_limit("big", 10).await.unwrap().limit,
        Limit::Limited(4)
    );
    assert_eq!(
        limiter.set_limit("small", 2).await.unwrap().limit,
        Limit::Limited(2)
    );
    assert_eq!(
        limiter.status("plain").await.unwrap().limit,
        Limit::Limited(3)
    );
    let permits: Vec<_> =
        futures_util::future::join_all((0..6).map(|_| limiter.try_acquire("big"))).await;
    assert_eq!(permits.iter().filter(|p| p.is_ok()).count(), 4);
}

pub async fn an_override_limits_a_key_that_is_unlimited_by_default<F: Fixture>(f: F) {
    let limiter = f.limiter(Policy::new(0, 0));
    let free: Vec<_> = (0..10).map(|_| limiter.try_acquire("open")).collect();
    for permit in futures_util::future::join_all(free).await {
        let permit = permit.unwrap();
        assert_eq!(permit.limit(), Limit::Unlimited);
        assert!(!permit.is_counted());
    }
    limiter.set_limit("capped", 1).await.unwrap();
    let _held = limiter.try_acquire("capped").await.unwrap();
    assert!(limiter.try_acquire("capped").await.unwrap_err().is_full());
    assert!(limiter.try_acquire("open").await.is_ok());
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

pub async fn an_expired_lease_is_reclaimed_at_the_next_admission<F: Fixture>(f: F) {
    let crashed = f.limiter(Policy::new(2, 0));
    let survivor = f.limiter(Policy::new(2, 0));
    let short = AcquireOptions::new().lease(Duration::from_secs(2));
    // A holder that "crashes": its leases are never renewed nor released.
    crashed
        .try_acquire_with("app", short.clone())
        .await
        .unwrap()
        .detach();
    crashed
        .try_acquire_with("app", short)
        .await
        .unwrap()
        .detach();
    assert!(survivor.try_acquire("app").await.unwrap_err().is_full());
    // (Redis time also moves for real while the test runs: keep a margin.)
    f.advance(Duration::from_millis(1_500));
    assert!(
        survivor.try_acquire("app").await.unwrap_err().is_full(),
        "not before the lease ends"
    );
    f.advance(Duration::from_millis(500));
    let permit = survivor
        .try_acquire("app")
        .await
        .expect("expired leases reclaimed");
    assert_eq!(permit.in_flight(), 1);
    assert_eq!(survivor.stats().reclaimed.load(Ordering::Relaxed), 2);
}

pub async fn a_held_permit_keeps_its_slot_across_many_leases<F: Fixture>(f: F) {
    let holder = f.limiter(Policy::new(1, 0));
    let other = f.limiter(Policy::new(1, 0));
    // A given id always takes a lease, in every store.
    let permit = holder
        .try_acquire_with(
            "app",
            AcquireOptions::new()
                .id("long")
                .lease(Duration::from_secs(1)),
        )
        .await
        .unwrap();
    for _ in 0..40 {
        f.advance(Duration::from_millis(300));
        holder.renew_now().await;
        assert!(other.try_acquire("app").await.unwrap_err().is_full());
    }
    assert!(!permit.is_lost());
    assert!(permit.expires_at_ms() > 0);
    drop(permit);
    settle(&other, "app", 0).await;
}

pub async fn a_renewal_readds_a_lease_the_store_lost<F: Fixture>(f: F) {
    let holder = f.limiter(Policy::new(1, 0));
    let permit = holder
        .try_acquire_with("app", AcquireOptions::new().id("p"))
        .await
        .unwrap();
    // The store forgets the lease (as a Redis restarted empty would).
    assert!(holder.release("app", permit.id()).await.unwrap());
    assert_eq!(holder.status("app").await.unwrap().in_flight, 0);
    holder.renew_now().await;
    assert_eq!(holder.status("app").await.unwrap().in_flight, 1, "re-added");
    assert!(!permit.is_lost());
    assert_eq!(holder.stats().readded.load(Ordering::Relaxed), 1);
}

pub async fn a_renewal_marks_the_permit_lost_when_the_key_filled_up<F: Fixture>(f: F) {
    let holder = f.limiter(Policy::new(1, 0));
    let other = f.limiter(Policy::new(1, 0));
    let permit = holder
        .try_acquire_with(
            "app",
            AcquireOptions::new().id("p").lease(Duration::from_secs(1)),
        )
        .await
        .unwrap();
    f.advance(Duration::from_secs(2)); // the renewal task "stalled" past the lease
    let _taken = other
        .try_acquire("app")
        .await
        .expect("the expired lease was reclaimed");
    holder.renew_now().await;
    assert!(permit.is_lost());
    assert_eq!(holder.stats().lost.load(Ordering::Relaxed), 1);
    assert_eq!(holder.held(), 0, "a lost permit is no longer renewed");
    drop(permit);
    assert_eq!(
        other.status("app").await.unwrap().in_flight,
        1,
        "dropping the lost permit frees nothing else"
    );
}

pub async fn remote_renewal_of_a_gone_lease_says_lost<F: Fixture>(f: F) {
    let limiter = f.limiter(Policy::new(2, 0));
    let lease = limiter
        .try_acquire_with("app", AcquireOptions::new().lease(Duration::from_secs(5)))
        .await
        .unwrap()
        .detach();
    f.advance(Duration::from_secs(4));
    match limiter
        .renew("app", &lease.id, Some(Duration::from_secs(5)))
        .await
        .unwrap()
    {
        Renewal::Renewed(grant) => {
            assert_eq!(
                (grant.weight, grant.in_flight, grant.limit),
                (1, 1, Limit::Limited(2))
            );
            assert!(grant.expires_at_ms > lease.expires_at_ms);
        }
        other => panic!("expected Renewed, got {other:?}"),
    }
    f.advance(Duration::from_secs(4));
    assert!(matches!(
        limiter.renew("app", &lease.id, None).await.unwrap(),
        Renewal::Renewed(_)
    ));
    let unknown = PermitId::from("never-acquired");
    assert_eq!(
        limiter.renew("app", &unknown, None).await.unwrap(),
        Renewal::Lost
    );
    assert_eq!(
        limiter.status("app").await.unwrap().in_flight,
        1,
        "a remote renewal never re-adds"
    );
}

pub async fn a_stream_holds_its_permit_until_it_ends<F: Fixture>(f: F) {
    let limiter = f.limiter(Policy::new(1, 0));
    let permit = limiter.try_acquire("app").await.unwrap();
    let mut s = permit.guard_stream(stream::iter(vec![1, 2, 3]));
    assert_eq!(s.next().await, Some(1));
    assert!(limiter.try_acquire("app").await.unwrap_err().is_full());
    assert_eq!(s.next().await, Some(2));
    assert_eq!(s.next().await, Some(3));
    assert!(
        s.permit().is_some(),
        "held until the stream says it has ended"
    );
    assert_eq!(s.next().await, None);
    assert!(s.permit().is_none());
    settle(&limiter, "app", 0).await;
    assert_eq!(s.next().await, None, "nothing after the end");
}

pub async fn a_stream_dropped_midway_or_before_its_first_item_releases<F: Fixture>(f: F) {
    let limiter = f.limiter(Policy::new(1, 0));
    let permit = limiter.try_acquire("app").await.unwrap();
    let mut s = permit.guard_stream(stream::iter(0..1_000_000));
    assert_eq!(s.next().await, Some(0));
    drop(s); // the client went away
    settle(&limiter, "app", 0).await;

    let permit = limiter.try_acquire("app").await.unwrap();
    let s = permit.guard_stream(stream::pending::<u8>());
    drop(s); // closed before it started
    settle(&limiter, "app", 0).await;
}

pub async fn a_stream_that_errors_releases_when_it_ends<F: Fixture>(f: F) {
    let limiter = f.limiter(Policy::new(1, 0));
    let permit = limiter.try_acquire("app").await.unwrap();
    let items: Vec<Result<u8, &str>> = vec![Ok(1), Err("upstream broke")];
    let collected: Vec<_> = permit.guard_stream(stream::iter(items)).collect().await;
    assert_eq!(collected, vec![Ok(1), Err("upstream broke")]);
    settle(&limiter, "app", 0).await;
}

pub async fn a_scope_holds_its_permit_until_the_future_completes_or_is_cancelled<F: Fixture>(f: F) {
    let limiter = f.limiter(Policy::new(1, 0));
    let permit = limiter.try_acquire("app").await.unwrap();
    let (tx, rx) = tokio::sync::oneshot::channel::<u32>();
    let task = tokio::spawn(permit.scope(async move { rx.await.unwrap_or(0) + 1 }));
    tokio::task::yield_now().await;
    assert!(limiter.try_acquire("app").await.unwrap_err().is_full());
    tx.send(41).unwrap();
    assert_eq!(task.await.unwrap(), 42);
    settle(&limiter, "app", 0).await;

    let permit = limiter.try_acquire("app").await.unwrap();
    let task = tokio::spawn(permit.scope(std::future::pending::<()>()));
    tokio::task::yield_now().await;
    task.abort(); // cancellation
    assert!(task.await.unwrap_err().is_cancelled());
    settle(&limiter, "app", 0).await;
}

pub async fn a_panic_while_holding_a_permit_releases_it<F: Fixture>(f: F) {
    let limiter = f.limiter(Policy::new(1, 0));
    let permit = limiter.try_acquire("app").await.unwrap();
    let task = tokio::spawn(async move {
        let _permit = permit;
        panic!("handler bug");
    });
    assert!(task.await.unwrap_err().is_panic());
    settle(&limiter, "app", 0).await;
}

pub async fn one_permit_is_handed_from_phase_to_phase<F: Fixture>(f: F) {
    // The reference system re-entered the same id in its dispatch phase and then deleted it (D5).
    let limiter = f.limiter(Policy::new(1, 0));
    let permit = limiter.try_acquire("workflow").await.unwrap();
    let dispatched = permit.scope(async { "prepared" }).await;
    assert_eq!(dispatched, "prepared");
    settle(&limiter, "workflow", 0).await;
    let permit = limiter.try_acquire("workflow").await.unwrap();
    // Dispatch phase: the permit is held by the caller, then moved into the stream.
    let prepared = async { vec!["a", "b"] }.await;
    let mut s = permit.guard_stream(stream::iter(prepared));
    assert!(
        limiter.try_acquire("workflow").await.is_err(),
        "held through the hand-off"
    );
    while s.next().await.is_some() {}
    settle(&limiter, "workflow", 0).await;
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
    let empty = PermitId::from("");
    assert!(!limiter.release("app", &empty).await.unwrap());
    assert_eq!(
        limiter.renew("app", &empty, None).await.unwrap(),
        Renewal::Lost
    );
    assert_eq!(
        limiter.status("app").await.unwrap().in_flight,
        3,
        "the weights' bookkeeping is intact"
    );
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
        !limiter.release("global", &id).await.unwrap(),
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

pub async fn status_of_an_unknown_key_is_empty<F: Fixture>(f: F) {
    let limiter = f.limiter(Policy::new(7, 0));
    let status = limiter.status("never-seen").await.unwrap();
    assert_eq!(
        (status.limit, status.override_limit, status.in_flight),
        (Limit::Limited(7), None, 0)
    );
    assert!(!limiter
        .release("never-seen", &PermitId::generate())
        .await
        .unwrap());
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

/// Waits (bounded) until the key's in-flight count is `want`: a dropped permit may release in the
/// background when the store cannot release synchronously.
pub async fn settle<S: inflight::Store>(limiter: &inflight::Limiter<S>, key: &str, want: u32) {
    for _ in 0..200 {
        if limiter.status(key).await.unwrap().in_flight == want {
            return;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    panic!("in_flight of {key:?} did not settle at {want}");
}

fn uuid_like(s: &str) -> bool {
    s.len() == 36 && s.chars().filter(|c| *c == '-').count() == 4
}

/// Rules for the classes of keys of the example, and one more specific rule.
fn classes() -> Policy {
    Policy::new(0, 0)
        .rule("tenant:*", ClassLimits::new(2, 3))
        .and_then(|p| p.rule("app:*", ClassLimits::new(1, 0)))
        .and_then(|p| p.rule("app:big-*", ClassLimits::new(3, 0)))
        .and_then(|p| p.rule("global", ClassLimits::new(4, 0)))
        .unwrap()
}

pub async fn classes_of_keys_have_their_own_limits_and_cap_their_overrides<F: Fixture>(f: F) {
    let limiter = f.limiter(classes());
    let full = |key: &'static str| {
        let limiter = limiter.clone();
        async move { limiter.try_acquire(key).await.unwrap_err().is_full() }
    };
    let app = limiter.try_acquire("app:x").await.unwrap();
    assert_eq!(app.limit(), Limit::Limited(1));
    assert!(full("app:x").await);
    let big: Vec<_> =
        futures_util::future::join_all((0..3).map(|_| limiter.try_acquire("app:big-1")))
            .await
            .into_iter()
            .map(Result::unwrap)
            .collect();
    assert!(full("app:big-1").await, "the more specific rule: 3");
    let tenant = [
        limiter.try_acquire("tenant:t").await.unwrap(),
        limiter.try_acquire("tenant:t").await.unwrap(),
    ];
    assert!(full("tenant:t").await);
    // An override of a key is capped by its class's ceiling.
    let status = limiter.set_limit("tenant:t", 10).await.unwrap();
    assert_eq!(
        (status.limit, status.override_limit),
        (Limit::Limited(3), Some(10))
    );
    let third = limiter.try_acquire("tenant:t").await.unwrap();
    assert!(full("tenant:t").await);
    // A key that no rule matches has the defaults: unlimited, nothing counted.
    let free = limiter.try_acquire("user:1").await.unwrap();
    assert!(!free.is_counted());
    assert_eq!(
        limiter.status("user:1").await.unwrap().limit,
        Limit::Unlimited
    );
    assert_eq!(
        limiter.status("global").await.unwrap().limit,
        Limit::Limited(4)
    );
    assert_eq!(
        limiter.status("app:never").await.unwrap().limit,
        Limit::Limited(1)
    );
    drop((app, big, tenant, third, free));
}

pub async fn a_new_policy_applies_to_the_next_admission_and_held_permits_stay<F: Fixture>(f: F) {
    let limiter = f.limiter(Policy::new(1, 0));
    let other = f.limiter(Policy::new(1, 0));
    let first = limiter.try_acquire("k").await.unwrap();
    assert!(limiter.try_acquire("k").await.unwrap_err().is_full());
    let wider = Policy::new(1, 0).rule("k", ClassLimits::new(3, 0)).unwrap();
    limiter.set_policy(wider);
    let more = [
        limiter.try_acquire("k").await.unwrap(),
        limiter.try_acquire("k").await.unwrap(),
    ];
    assert!(limiter.try_acquire("k").await.unwrap_err().is_full());
    assert!(
        other.try_acquire("k").await.unwrap_err().is_full(),
        "its own policy: 1"
    );
    limiter.set_policy(Policy::new(1, 0));
    assert!(limiter.try_acquire("k").await.unwrap_err().is_full());
    assert_eq!(
        limiter.status("k").await.unwrap().in_flight,
        3,
        "held permits stay held"
    );
    drop((first, more));
    settle(&limiter, "k", 0).await;
    assert!(limiter.try_acquire("k").await.is_ok());
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
    limiter.record(&names, &lease.id, LEASE).await.unwrap();
    // Renewed on every key for as long as the caller renews, found from the id alone.
    for _ in 0..3 {
        f.advance(LEASE / 2);
        let (found, renewal) = limiter
            .renew_recorded(&lease.id, None)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(&*found.keys, names.as_slice());
        assert!(matches!(renewal, Renewal::Renewed(grant) if grant.in_flight == 1));
    }
    assert_eq!(limiter.status("app:a").await.unwrap().in_flight, 1);
    assert_eq!(limiter.status("tenant:t").await.unwrap().in_flight, 1);
    let (found, held) = limiter.release_recorded(&lease.id).await.unwrap().unwrap();
    assert_eq!((found.len(), held), (3, true));
    assert_eq!(limiter.status("app:a").await.unwrap().in_flight, 0);
    assert_eq!(limiter.status("tenant:t").await.unwrap().in_flight, 0);
    assert!(limiter
        .renew_recorded(&lease.id, None)
        .await
        .unwrap()
        .is_none());
    assert!(
        limiter.release_recorded(&lease.id).await.unwrap().is_none(),
        "twice: no error"
    );
    // A record whose lease ended goes with it; renew_all and release_all take the keys directly.
    let options = AcquireOptions::new().id("req-2").lease(LEASE);
    let lease = limiter
        .try_acquire_all(&keys, options)
        .await
        .unwrap()
        .detach();
    limiter.record(&names, &lease.id, LEASE).await.unwrap();
    assert!(matches!(
        limiter
            .renew_all(&names, &lease.id, Some(LEASE * 2))
            .await
            .unwrap(),
        Renewal::Renewed(_)
    ));
    f.advance(LEASE * 3);
    let gone = limiter.renew_recorded(&lease.id, None).await.unwrap();
    assert!(matches!(gone, None | Some((_, Renewal::Lost))), "{gone:?}");
    assert!(!limiter.release_all(&names, &lease.id).await.unwrap());
}

/// With `a` full, admissions on `[b, a]` are refused again and again while a probe takes `b` alone: the
/// probe never fails, because a refused admission never holds `b`, not even for a moment. (The keys share
/// a hash tag: on Redis Cluster only keys of one slot are taken in one step; keys of several slots may
/// hold a slot while they roll back, which `tests/cluster.rs` bounds.)
pub async fn a_refused_admission_on_several_keys_never_takes_a_slot_for_a_moment<F: Fixture>(f: F) {
    let limiter = f.limiter(Policy::new(1, 0));
    let (a, b) = ("{k}a", "{k}b");
    let _a = limiter.try_acquire(a).await.unwrap();
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let refusers: Vec<_> = (0..4)
        .map(|_| {
            let (limiter, stop) = (limiter.clone(), stop.clone());
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
                    tokio::task::yield_now().await;
                }
                refused
            })
        })
        .collect();
    for round in 0..300 {
        let probe = limiter
            .try_acquire_with(b, AcquireOptions::new().id("probe"))
            .await;
        assert!(
            probe.is_ok(),
            "round {round}: b alone was refused: {probe:?}"
        );
        probe.unwrap().release().await.unwrap();
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
    let names: Vec<Arc<str>> = ["app:a", "user:u"].into_iter().map(Arc::from).collect();
    let options = AcquireOptions::new().id("p1").lease(LEASE);
    let lease = limiter
        .try_acquire_all(&["app:a", "user:u"], options)
        .await
        .unwrap()
        .detach();
    limiter.set_limit("user:u", 1).await.unwrap();
    let other = limiter.try_acquire("user:u").await.unwrap();
    assert!(other.is_counted());
    let renewal = limiter.renew_all(&names, &lease.id, None).await.unwrap();
    assert!(matches!(renewal, Renewal::Renewed(_)), "{renewal:?}");
    assert_eq!(limiter.status("app:a").await.unwrap().in_flight, 1);
    assert_eq!(
        limiter.status("user:u").await.unwrap().in_flight,
        1,
        "no room: uncounted there"
    );
    other.release().await.unwrap();
    let renewal = limiter.renew_all(&names, &lease.id, None).await.unwrap();
    assert!(matches!(renewal, Renewal::Renewed(_)), "{renewal:?}");
    assert_eq!(
        limiter.status("user:u").await.unwrap().in_flight,
        1,
        "taken once it fits"
    );
    assert!(limiter.release_all(&names, &lease.id).await.unwrap());
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
