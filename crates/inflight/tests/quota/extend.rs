//! Reservations that outlive their ttl while their holder works: one held elsewhere is extended with
//! `Quota::extend`; one held in this process extends itself. Run on every store (main.rs).

use std::sync::atomic::Ordering;
use std::time::Duration;

use inflight::quota::{Extension, Fund, QuotaError, Settle, Settlement, MAX_RESERVATION_TTL};
use inflight::PermitId;

use crate::scenarios::figures;
use crate::{Fixture, TTL};

pub async fn extending_moves_only_an_open_reservations_deadline<F: Fixture>(f: F) {
    let quota = f.quota();
    quota.fund("tenant:t1", Fund::Set(5)).await.unwrap();
    let held = quota.reserve("tenant:t1", 2).await.unwrap().detach();
    // Extended before each ttl passes, it stays open through three of them.
    let mut deadline = held.expires_at_ms;
    for _ in 0..4 {
        f.advance(TTL * 3 / 4);
        let extended = quota.extend("tenant:t1", &held.id, None).await.unwrap();
        let moved = extended.expires_at_ms().expect("still open");
        assert!(moved > deadline, "{moved} after {deadline}");
        deadline = moved;
    }
    assert_eq!(figures(&quota, "tenant:t1").await, (3, 2), "still held");
    let settled = quota.settle("tenant:t1", &held.id, Settle::Commit).await;
    assert!(
        matches!(settled, Ok(Settlement::Settled(b)) if (b.balance, b.reserved) == (3, 0)),
        "{settled:?}"
    );

    // Settled, expired, never made, on an unmetered key: nothing to extend, and nothing changes.
    let extend = |key: &'static str, id: PermitId| {
        let quota = quota.clone();
        async move { quota.extend(key, &id, None).await.unwrap() }
    };
    let not_open = |extension: Extension| match extension {
        Extension::NotOpen(Some(b)) => (b.balance, b.reserved),
        other => panic!("{other:?}"),
    };
    assert_eq!(
        not_open(extend("tenant:t1", held.id.clone()).await),
        (3, 0),
        "settled"
    );
    let lost = quota.reserve("tenant:t1", 1).await.unwrap().detach();
    f.advance(TTL);
    assert_eq!(
        not_open(extend("tenant:t1", lost.id.clone()).await),
        (3, 0),
        "expired"
    );
    assert_eq!(
        not_open(extend("tenant:t1", PermitId::from("never")).await),
        (3, 0)
    );
    let unmetered = extend("free:f1", lost.id.clone()).await;
    assert_eq!(unmetered, Extension::NotOpen(None), "unmetered");
    assert_eq!(figures(&quota, "tenant:t1").await, (3, 0));
    assert_eq!(quota.stats().expired.load(Ordering::SeqCst), 1);
    let too_long = quota
        .extend("tenant:t1", &lost.id, Some(MAX_RESERVATION_TTL * 2))
        .await;
    assert!(
        matches!(too_long, Err(QuotaError::Invalid(_))),
        "{too_long:?}"
    );
}

/// A reservation held here is extended every third of its ttl while its holder works, so that work
/// lasting several ttls is still charged; one handed off and left alone expires. The store's clock is
/// moved an eighth of the ttl at a time (Redis's also moves by itself, so it runs 1.25 times as fast
/// as real time), between real waits in which the keeper runs.
pub async fn a_held_reservation_extends_itself_while_its_holder_works<F: Fixture>(f: F) {
    let ttl = Duration::from_millis(900);
    let quota = f.quota().with_ttl(ttl);
    quota.fund("tenant:t1", Fund::Set(5)).await.unwrap();
    let held = quota.reserve("tenant:t1", 2).await.unwrap();
    let left = quota.reserve("tenant:t1", 1).await.unwrap().detach();
    for _ in 0..10 {
        tokio::time::sleep(ttl / 2).await;
        f.advance(ttl / 8);
    }
    // Over a ttl has passed on the store's clock: what was left alone expired, what is held did not.
    assert_eq!(figures(&quota, "tenant:t1").await, (3, 2));
    let late = quota.settle("tenant:t1", &left.id, Settle::Commit).await;
    assert!(matches!(late, Ok(Settlement::NotFound(_))), "{late:?}");
    let settled = held.commit().await;
    assert!(
        matches!(settled, Ok(Settlement::Settled(b)) if (b.balance, b.reserved) == (3, 0)),
        "{settled:?}"
    );
    assert_eq!(quota.stats().expired.load(Ordering::SeqCst), 1);
    assert_eq!(quota.stats().committed.load(Ordering::SeqCst), 1);
}
