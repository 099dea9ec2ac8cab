//! Holders and waiters listed from another process, and revoked: what an operator sees and does.

use std::collections::HashSet;
use std::time::Duration;

use inflight::store::Holders;
use inflight::{AcquireError, AcquireOptions, Policy};

use crate::fixtures::Fixture;

/// Polls (bounded) until `key` lists `n` waiters.
async fn waiters<S: Holders>(
    limiter: &inflight::Limiter<S>,
    key: &str,
    n: usize,
) -> inflight::PermitPage {
    for _ in 0..1000 {
        let page = limiter.permits(key, None).await.unwrap();
        if page.waiters.len() == n {
            return page;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    panic!("{key:?} did not list {n} waiters");
}

pub async fn holders_are_listed_with_their_labels_from_another_process<F: Fixture>(f: F)
where
    F::S: Holders,
{
    let (one, other) = (f.limiter(Policy::new(8, 0)), f.limiter(Policy::new(8, 0)));
    let labelled = AcquireOptions::new()
        .id("req-1")
        .weight(2)
        .holder("10.0.0.7");
    let held = one.try_acquire_with("app", labelled).await.unwrap();
    let plain = one.try_acquire("app").await.unwrap();
    let page = other.permits("app", None).await.unwrap();
    assert_eq!(page.cursor, None);
    assert!(page.waiters.is_empty());
    let found = page
        .holders
        .iter()
        .find(|h| h.id == *held.id())
        .expect("listed");
    assert_eq!(found.holder.as_deref(), Some("10.0.0.7"));
    assert_eq!((found.weight, found.token), (2, held.token()));
    assert_eq!(found.lease_expires_at_ms, held.expires_at_ms());
    assert!(found.admitted_at_ms <= found.lease_expires_at_ms);
    assert!(found.lease_expires_at_ms - found.admitted_at_ms <= 30_000);
    // Every slot is listed, or counted as held without a lease (an in-process store's own permits).
    let listed: u32 = page.holders.iter().map(|h| h.weight).sum();
    assert_eq!(listed + page.unlisted, 3);
    assert!(page
        .holders
        .iter()
        .filter(|h| h.id != *held.id())
        .all(|h| h.holder.is_none()));
    drop((held, plain));
}

pub async fn a_revoked_holder_hears_it_lost_and_its_slot_is_free_at_once<F: Fixture>(f: F)
where
    F::S: Holders,
{
    let (holder, admin) = (f.limiter(Policy::new(1, 0)), f.limiter(Policy::new(1, 0)));
    let options = AcquireOptions::new().holder("stuck stream");
    let permit = holder.try_acquire_with("app", options).await.unwrap();
    assert!(admin.try_acquire("app").await.unwrap_err().is_full());
    assert!(admin.revoke("app", permit.id()).await.unwrap());
    assert!(
        !admin.revoke("app", permit.id()).await.unwrap(),
        "revoked once"
    );
    let taken = admin
        .try_acquire("app")
        .await
        .expect("the slot is free at once");
    // Its renewal finds it revoked: lost, and not taken back (the key would not be full without it).
    drop(taken);
    holder.renew_now().await;
    tokio::time::timeout(Duration::from_secs(10), permit.lost())
        .await
        .expect("heard lost");
    assert!(permit.is_lost());
    assert_eq!(
        admin.status("app").await.unwrap().in_flight,
        0,
        "not added back"
    );
    drop(permit);
    assert!(admin.try_acquire("app").await.is_ok());
}

pub async fn a_revoked_waiter_ends_with_revoked_and_leaves_the_queue<F: Fixture>(f: F)
where
    F::S: Holders + inflight::Wakeups,
{
    let (one, other) = (f.limiter(Policy::new(1, 0)), f.limiter(Policy::new(1, 0)));
    let _held = one.try_acquire("app").await.unwrap();
    let options = AcquireOptions::new()
        .max_wait(Duration::from_secs(60))
        .priority(3)
        .flow("tenant-a")
        .holder("waiter-1");
    let waiting = tokio::spawn(async move { other.acquire("app", options).await });
    let page = waiters(&one, "app", 1).await;
    let waiter = &page.waiters[0];
    assert_eq!(
        (waiter.priority, &*waiter.flow, waiter.weight),
        (3, "tenant-a", 1)
    );
    assert_eq!(waiter.holder.as_deref(), Some("waiter-1"));
    assert!(waiter.waiting_since_ms > 0);
    assert!(one.revoke_waiter("app", &waiter.ticket).await.unwrap());
    let ended = tokio::time::timeout(Duration::from_secs(10), waiting)
        .await
        .expect("ended");
    assert!(matches!(ended.unwrap(), Err(AcquireError::Revoked)));
    waiters(&one, "app", 0).await;
    assert!(!one.revoke_waiter("app", &waiter.ticket).await.unwrap());
}

pub async fn every_holder_is_listed_across_pages<F: Fixture>(f: F)
where
    F::S: Holders,
{
    let limiter = f.limiter(Policy::new(500, 0));
    let mut held = Vec::new();
    for i in 0..250 {
        let options = AcquireOptions::new().holder(format!("client-{i}"));
        held.push(limiter.try_acquire_with("app", options).await.unwrap());
    }
    let (mut seen, mut cursor, mut pages) = (HashSet::new(), None::<String>, 0);
    loop {
        let page = limiter.permits("app", cursor.as_deref()).await.unwrap();
        // (Redis's page is a ZSCAN step: about MAX_PAGE.)
        assert!(page.holders.len() <= 2 * inflight::store::MAX_PAGE);
        seen.extend(page.holders.iter().map(|h| h.holder.clone().unwrap()));
        pages += 1;
        match page.cursor {
            Some(next) => cursor = Some(next),
            None => break,
        }
        assert!(pages < 100, "the pages end");
    }
    assert_eq!(seen.len(), 250, "every holder listed at least once");
    assert!(pages >= 2);
    assert!(limiter.permits("app", Some("not a cursor")).await.is_err());
}

pub async fn a_permit_revoked_on_one_of_its_keys_leaves_them_all_at_its_renewal<F: Fixture>(f: F)
where
    F::S: Holders,
{
    let (holder, admin) = (f.limiter(Policy::new(1, 0)), f.limiter(Policy::new(1, 0)));
    let options = AcquireOptions::new().holder("runaway");
    let keys = ["tenant:{t}", "app:{t}:a"]; // (one hash tag: one Cluster slot)
    let permit = holder.try_acquire_all(&keys, options).await.unwrap();
    assert!(admin.revoke(keys[1], permit.id()).await.unwrap());
    assert_eq!(
        admin.status(keys[0]).await.unwrap().in_flight,
        1,
        "held there until it hears"
    );
    holder.renew_now().await;
    tokio::time::timeout(Duration::from_secs(10), permit.lost())
        .await
        .expect("heard lost");
    assert_eq!(
        admin.status(keys[0]).await.unwrap().in_flight,
        0,
        "gone from every key"
    );
    assert!(admin
        .try_acquire_all(&keys, AcquireOptions::new())
        .await
        .is_ok());
}
