//! Bounds, an independent ledger under contention, and the permit records that carry a charge: each
//! scenario run on every store (main.rs instantiates them).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use inflight::quota::{Fund, QuotaError, Settlement};
use inflight::{PermitId, RemoteLease};

use crate::scenarios::{figures, settles_to};
use crate::{Fixture, TTL};

pub async fn balances_are_set_and_topped_up_within_bounds<F: Fixture>(f: F) {
    use inflight::quota::{MAX_BALANCE, MAX_RESERVATION_TTL};
    let quota = f.quota();
    let set = quota.fund("tenant:t1", Fund::Set(10)).await.unwrap();
    assert_eq!((set.balance, set.reserved), (10, 0));
    let held = quota.reserve("tenant:t1", 4).await.unwrap();
    let topped = quota.fund("tenant:t1", Fund::Add(5)).await.unwrap();
    assert_eq!((topped.balance, topped.reserved), (11, 4));
    let reset = quota.fund("tenant:t1", Fund::Set(2)).await.unwrap();
    assert_eq!(
        (reset.balance, reset.reserved),
        (2, 4),
        "what is reserved stays reserved"
    );
    held.refund().await.unwrap();
    assert_eq!(figures(&quota, "tenant:t1").await, (6, 0));
    let topped = quota.fund("tenant:t2", Fund::Add(3)).await.unwrap();
    assert_eq!(topped.balance, 3, "a top-up of an unmetered key sets it");

    let invalid = |r: Result<(), QuotaError>| matches!(r, Err(QuotaError::Invalid(_)));
    assert!(invalid(
        quota.fund("tenant:t1", Fund::Add(0)).await.map(drop)
    ));
    let over = quota.fund("tenant:t1", Fund::Set(MAX_BALANCE + 1)).await;
    assert!(invalid(over.map(drop)));
    let max = quota
        .fund("tenant:t1", Fund::Set(MAX_BALANCE))
        .await
        .unwrap();
    assert_eq!(max.balance, MAX_BALANCE);
    let over = quota.fund("tenant:t1", Fund::Add(1)).await;
    assert!(matches!(over, Err(QuotaError::Store(_))), "{over:?}");
    assert_eq!(figures(&quota, "tenant:t1").await, (MAX_BALANCE, 0));
    assert!(invalid(quota.reserve("tenant:t1", 0).await.map(drop)));
    let long = Some(MAX_RESERVATION_TTL + Duration::from_millis(1));
    assert!(invalid(
        quota
            .reserve_with("tenant:t1", 1, None, long)
            .await
            .map(drop)
    ));
    let zero = Some(Duration::ZERO);
    assert!(invalid(
        quota
            .reserve_with("tenant:t1", 1, None, zero)
            .await
            .map(drop)
    ));
    let empty = Some(PermitId::from(""));
    assert!(invalid(
        quota
            .reserve_with("tenant:t1", 1, empty, None)
            .await
            .map(drop)
    ));
    // The store refuses it too, and a refused funding leaves a new key unmetered.
    use inflight::QuotaStore;
    let store = f.store();
    for fund in [Fund::Set(MAX_BALANCE + 1), Fund::Add(MAX_BALANCE + 1)] {
        let once = inflight::quota::IdempotencyKey::generate();
        assert!(store.fund("new", fund, &once).await.is_err());
    }
    assert_eq!(quota.balance("new").await.unwrap(), None);
    let all = quota.reserve("tenant:t1", MAX_BALANCE).await.unwrap();
    assert_eq!(all.balance().unwrap().balance, 0);
    all.commit().await.unwrap();
    assert_eq!(figures(&quota, "tenant:t1").await, (0, 0));
}

/// 16 tasks reserve random amounts and settle each at random (commit, refund, drop, or abandon it to
/// expire), topping the balance up now and then. A ledger kept beside the store, from its answers alone,
/// must match the store at the end, and the balance never went below zero (it is unsigned: a store that
/// went below would fail to answer).
pub async fn balance_is_conserved_and_never_negative_under_contention<F: Fixture>(f: F) {
    const START: u64 = 300;
    let quota = f.quota();
    quota.fund("hot", Fund::Set(START)).await.unwrap();
    let (committed, funded, exhausted) = (
        Arc::new(AtomicU64::new(0)),
        Arc::new(AtomicU64::new(START)),
        Arc::new(AtomicU64::new(0)),
    );
    let tasks: Vec<_> = (0..16u64)
        .map(|task| {
            let (quota, committed, funded, exhausted) = (
                quota.clone(),
                committed.clone(),
                funded.clone(),
                exhausted.clone(),
            );
            tokio::spawn(async move {
                let mut seed = task * 7919 + 1;
                let mut next = move |n: u64| {
                    seed = seed
                        .wrapping_mul(6364136223846793005)
                        .wrapping_add(1442695040888963407);
                    (seed >> 33) % n
                };
                for _ in 0..60 {
                    let reservation = match quota.reserve("hot", 1 + next(5)).await {
                        Ok(reservation) => reservation,
                        Err(QuotaError::Exhausted { .. }) => {
                            exhausted.fetch_add(1, Ordering::SeqCst);
                            let amount = 1 + next(10);
                            quota.fund("hot", Fund::Add(amount)).await.unwrap();
                            funded.fetch_add(amount, Ordering::SeqCst);
                            continue;
                        }
                        Err(other) => panic!("{other}"),
                    };
                    let amount = reservation.amount();
                    match next(4) {
                        0 => {
                            if let Settlement::Settled(_) = reservation.commit().await.unwrap() {
                                committed.fetch_add(amount, Ordering::SeqCst);
                            }
                        }
                        1 => drop(reservation.refund().await.unwrap()),
                        2 => drop(reservation),
                        _ => drop(reservation.detach()),
                    }
                    tokio::task::yield_now().await;
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.unwrap();
    }
    // Every abandoned reservation expires; every dropped one has been refunded.
    f.advance(TTL + Duration::from_secs(1));
    let (funded, committed) = (
        funded.load(Ordering::SeqCst),
        committed.load(Ordering::SeqCst),
    );
    settles_to(&f, &quota, "hot", (funded - committed, 0)).await;
    assert!(committed > 0, "the load committed something");
    assert!(
        exhausted.load(Ordering::SeqCst) > 0,
        "the load pressed on the balance"
    );
}

pub async fn a_permits_record_keeps_its_quota_key_across_renewals<F: Fixture>(f: F) {
    use inflight::store::{IndexOp, Store};
    use inflight::AcquireOptions;
    let limiter = f.limiter(2);
    let lease = Duration::from_secs(10);
    let options = AcquireOptions::new().id("req-1").lease(lease);
    let permit = limiter
        .try_acquire_all(&["app:a1", "global"], options)
        .await
        .unwrap()
        .detach();
    let keys: Vec<Arc<str>> = vec![Arc::from("app:a1"), Arc::from("global")];
    let quota = Some(("tenant:t1", TTL));
    limiter
        .record(&keys, &permit.id, lease, quota)
        .await
        .unwrap();
    let store = f.store();
    let recorded = store
        .index(&permit.id, IndexOp::Get)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(recorded.quota.as_deref(), Some("tenant:t1"));
    assert_eq!(&*recorded.keys, keys.as_slice());
    f.advance(lease / 2);
    let by_id = RemoteLease::recorded(permit.id.clone(), permit.token);
    limiter.renew(&by_id, None).await.unwrap();
    let renewed = store
        .index(&permit.id, IndexOp::Get)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        renewed.quota.as_deref(),
        Some("tenant:t1"),
        "kept by the renewal"
    );
    // A record outlives the lease when its reservation does: whoever releases the permit settles it.
    limiter
        .record(&keys, &permit.id, lease, quota)
        .await
        .unwrap();
    f.advance(lease * 3);
    assert!(store
        .index(&permit.id, IndexOp::Get)
        .await
        .unwrap()
        .is_some());
    limiter
        .record(&keys, &permit.id, lease, None)
        .await
        .unwrap();
    let plain = store
        .index(&permit.id, IndexOp::Get)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(plain.quota, None);
}
