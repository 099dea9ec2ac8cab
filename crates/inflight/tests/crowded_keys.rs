//! A key holding many permits on Redis: what Redis holds for them, what it costs, and that it all goes
//! away. What the decisions must be is `stores_agree.rs`'s.
#![allow(missing_docs)]

mod support;

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use futures_util::future::join_all;
use inflight::store::{AcquireRequest, Admission, OverrideChange};
use inflight::{ClassLimits as Policy, PermitId, RedisStore, Store};
use support::TestRedis;

const POLICY: Policy = Policy::new(10_000, 0);

async fn acquire(
    store: &RedisStore,
    key: &str,
    id: &PermitId,
    weight: u32,
    lease_ms: u64,
) -> Admission {
    let req = AcquireRequest {
        keys: &[key],
        id,
        weight,
        lease_ms,
        limits: &[POLICY],
        generated: false,
        ticket: None,
        priority: 0,
        floors: &[],
        holder: None,
        shadow: 0,
    };
    store.acquire(req).await.unwrap()
}

async fn in_flight(store: &RedisStore, key: &str) -> u32 {
    let status = store.status(key, POLICY, OverrideChange::Keep).await;
    status.unwrap().in_flight
}

async fn release(store: &RedisStore, key: &str, id: &PermitId) -> bool {
    store.release(&[Arc::from(key)], id, 0).await.unwrap()
}

/// Holds `n` permits with generated ids on `key`; their ids.
async fn fill(store: &RedisStore, key: &str, n: usize, lease_ms: u64) -> Vec<PermitId> {
    let ids: Vec<PermitId> = (0..n).map(|_| PermitId::generate()).collect();
    for chunk in ids.chunks(500) {
        for admission in join_all(chunk.iter().map(|id| acquire(store, key, id, 1, lease_ms))).await
        {
            assert!(
                matches!(admission, Admission::Admitted { .. }),
                "{admission:?}"
            );
        }
    }
    ids
}

fn keys(c: &mut redis::Connection) -> Vec<String> {
    let mut keys: Vec<String> = redis::cmd("KEYS").arg("*").query(c).unwrap();
    keys.sort();
    keys
}

/// The key's deadline (ms, Redis clock), as Redis has it: one reading, so that a busy machine's delay
/// between two commands cannot make two deadlines set together look apart (Redis 7's PEXPIRETIME).
fn expires_at(c: &mut redis::Connection, key: &str) -> i64 {
    let at: i64 = redis::cmd("PEXPIRETIME").arg(key).query(c).unwrap();
    assert!(at > 0, "{key} has no expiry ({at})");
    at
}

#[tokio::test]
async fn a_held_permit_costs_a_bounded_number_of_bytes_however_many_a_key_holds() {
    let redis = TestRedis::start();
    let store = redis.store();
    let mut c = redis.client();
    let ids = fill(&store, "k", 5_000, 30_000).await;
    assert_eq!(in_flight(&store, "k").await, 5_000);
    let usage = |c: &mut redis::Connection, key: &str| -> u64 {
        let mut sampled = redis::cmd("MEMORY");
        sampled.arg("USAGE").arg(key).arg("SAMPLES").arg(0);
        sampled.query(c).unwrap()
    };
    let usage = usage(&mut c, "inflight:{k}:leases") + usage(&mut c, "inflight:{k}:permits");
    // A sorted set of 17-byte members and a hash of their tokens: about 240 bytes a permit
    // (BENCHMARKS.md has the figures).
    assert!(usage < 400 * 5_000, "{usage} bytes for 5,000 permits");
    assert_eq!(
        keys(&mut c),
        ["inflight:{k}:leases", "inflight:{k}:permits"]
    );

    // Every permit is found where it was put: released, each once; then nothing is left.
    let released = join_all(ids.iter().map(|id| release(&store, "k", id))).await;
    assert!(released.into_iter().all(|held| held));
    assert!(!release(&store, "k", &ids[0]).await);
    assert_eq!(in_flight(&store, "k").await, 0);
    // Left: the key's last token (so that the next admission's is larger), until the leases' deadline.
    assert_eq!(keys(&mut c), ["inflight:{k}:permits"]);
    let ttl: i64 = redis::cmd("PTTL")
        .arg("inflight:{k}:permits")
        .query(&mut c)
        .unwrap();
    assert!((1..=61_000).contains(&ttl), "{ttl}");
}

#[tokio::test]
async fn a_crowded_keys_expired_leases_are_all_reclaimed_and_counted() {
    let redis = TestRedis::start();
    let store = redis.store();
    fill(&store, "k", 300, 5_000).await;
    let lasting = fill(&store, "k", 50, 60_000).await;
    store.advance_clock(Duration::from_secs(6));
    let Admission::Admitted {
        grant, reclaimed, ..
    } = acquire(&store, "k", &PermitId::generate(), 1, 5_000).await
    else {
        panic!("admitted");
    };
    assert_eq!((reclaimed, grant.in_flight), (300, 51));
    for id in &lasting {
        assert!(release(&store, "k", id).await);
    }
}

#[tokio::test]
async fn a_keys_leases_and_permits_expire_together_even_when_emptied_and_refilled_in_one_batch() {
    let redis = TestRedis::start();
    let store = redis.store();
    let mut c = redis.client();
    let ids = fill(&store, "k", 200, 30_000).await;
    let heavy = PermitId::from("heavy");
    // In one batch: empty the key (Redis deletes the set, and its expiry with it), then fill it again
    // with a lease that also needs the permits hash: both need an expiry again.
    let mut batch: Vec<Pin<Box<dyn Future<Output = ()> + '_>>> = Vec::new();
    for id in &ids {
        batch.push(Box::pin(async { assert!(release(&store, "k", id).await) }));
    }
    batch.push(Box::pin(async {
        let admission = acquire(&store, "k", &heavy, 3, 60_000).await;
        assert!(
            matches!(admission, Admission::Admitted { .. }),
            "{admission:?}"
        );
    }));
    join_all(batch).await;
    assert_eq!(in_flight(&store, "k").await, 3);
    let leases = expires_at(&mut c, "inflight:{k}:leases");
    let permits = expires_at(&mut c, "inflight:{k}:permits");
    assert!((leases - permits).abs() <= 2, "{leases} and {permits}");
    let (secs, us): (i64, i64) = redis::cmd("TIME").query(&mut c).unwrap();
    assert!(
        leases > secs * 1000 + us / 1000 + 60_000,
        "past the heavy lease's deadline"
    );
    // A longer lease moves both.
    let long = acquire(&store, "k", &PermitId::from("long"), 2, 200_000).await;
    assert!(matches!(long, Admission::Admitted { .. }));
    let moved = expires_at(&mut c, "inflight:{k}:leases");
    assert!(moved > leases + 100_000);
    assert!((moved - expires_at(&mut c, "inflight:{k}:permits")).abs() <= 2);

    // In one batch: a heavy lease made light empties the hash (Redis deletes it, and its expiry with
    // it), and another heavy one makes it again: it needs its expiry again.
    let (x, y) = (PermitId::from("x"), PermitId::from("y"));
    let (a, b, d) = tokio::join!(
        acquire(&store, "j", &x, 2, 30_000),
        acquire(&store, "j", &x, 1, 30_000),
        acquire(&store, "j", &y, 3, 30_000)
    );
    for admission in [a, b, d] {
        assert!(
            matches!(admission, Admission::Admitted { .. }),
            "{admission:?}"
        );
    }
    assert_eq!(in_flight(&store, "j").await, 4);
    let leases = expires_at(&mut c, "inflight:{j}:leases");
    assert!((leases - expires_at(&mut c, "inflight:{j}:permits")).abs() <= 2);
}
