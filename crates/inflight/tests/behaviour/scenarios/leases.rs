//! Leases under an id: held again, renewed, expired and reclaimed, lost.

use std::sync::atomic::Ordering;
use std::time::Duration;

use inflight::{AcquireError, AcquireOptions, Limit, Policy, RemoteLease, Renewal};

use super::settle;
use crate::fixtures::Fixture;

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
    assert_eq!(limiter.renewing(), 1, "one lease, renewed once");
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
    let remote = RemoteLease::new(&["app"], lease.id.clone(), lease.token);
    f.advance(Duration::from_secs(40));
    let (Renewal::Renewed(grant), None) = limiter.renew(&remote, None).await.unwrap() else {
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
    let length = Some(Duration::from_secs(5));
    limiter.renew(&remote, length).await.unwrap();
    f.advance(Duration::from_secs(4));
    limiter.renew(&remote, None).await.unwrap();
    f.advance(Duration::from_secs(6));
    assert_eq!(limiter.status("app").await.unwrap().in_flight, 0);
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
    let remote = RemoteLease::new(&["app"], permit.id().clone(), permit.token());
    assert!(holder.release(&remote).await.unwrap().0);
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
    assert_eq!(holder.renewing(), 0, "a lost permit is no longer renewed");
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
    let remote = RemoteLease::new(&["app"], lease.id.clone(), lease.token);
    f.advance(Duration::from_secs(4));
    match limiter
        .renew(&remote, Some(Duration::from_secs(5)))
        .await
        .unwrap()
        .0
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
    let renewed = limiter.renew(&remote, None).await.unwrap().0;
    assert!(matches!(renewed, Renewal::Renewed(_)));
    let unknown = RemoteLease::new(&["app"], "never-acquired", 0);
    let lost = limiter.renew(&unknown, None).await.unwrap();
    assert_eq!(lost, (Renewal::Lost, None));
    assert_eq!(
        limiter.status("app").await.unwrap().in_flight,
        1,
        "a remote renewal never re-adds"
    );
}
