//! A key holding many permits on Redis: its leases are sharded (`scripts/common.lua`), so that each
//! sorted set stays in Redis's compact encoding and a held permit costs under 100 bytes however many
//! there are. What the shards must not change (the decisions) is `stores_agree.rs`'s; here, what
//! Redis holds.
#![allow(missing_docs)]

mod support;

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use futures_util::future::join_all;
use inflight::store::{AcquireRequest, Admission, RenewRequest, Renewal};
use inflight::{PermitId, Policy, RedisStore, Store};
use support::TestRedis;

const POLICY: Policy = Policy::new(10_000, 0);

async fn acquire(store: &RedisStore, key: &str, id: &PermitId, lease_ms: u64) -> Admission {
    let req = AcquireRequest {
        key,
        id,
        weight: 1,
        lease_ms,
        policy: POLICY,
    };
    store.acquire(req).await.unwrap()
}

/// Holds `n` permits with generated ids on `key`; their ids.
async fn fill(store: &RedisStore, key: &str, n: usize, lease_ms: u64) -> Vec<PermitId> {
    let ids: Vec<PermitId> = (0..n).map(|_| PermitId::generate()).collect();
    for chunk in ids.chunks(500) {
        for admission in join_all(chunk.iter().map(|id| acquire(store, key, id, lease_ms))).await {
            assert!(
                matches!(admission, Admission::Admitted { .. }),
                "{admission:?}"
            );
        }
    }
    ids
}

/// Every Redis key of the (one) user key expires with its weights hash, which holds the count of its
/// leases, or a moment after it (a long script sets the expiries a few ms apart), and well ahead: a
/// shard gone before the count would leave the count too high. The weights' expiry.
fn one_expiry(c: &mut redis::Connection) -> i64 {
    let (s, us): (i64, i64) = redis::cmd("TIME").query(c).unwrap();
    let now_ms = s * 1000 + us / 1000;
    let expiry = |c: &mut redis::Connection, key: &str| -> i64 {
        redis::cmd("PEXPIRETIME").arg(key).query(c).unwrap()
    };
    let count = expiry(c, "inflight:{k}:weights");
    assert!(count > now_ms + 30_000, "{} ms left", count - now_ms);
    for key in keys(c) {
        let at = expiry(c, &key);
        assert!(
            (count..=count + 1_000).contains(&at),
            "{key} expires at {at}, the count at {count}"
        );
    }
    count
}

fn keys(c: &mut redis::Connection) -> Vec<String> {
    let mut keys: Vec<String> = redis::cmd("KEYS").arg("*").query(c).unwrap();
    keys.sort();
    keys
}

#[tokio::test]
async fn a_held_permit_costs_under_100_bytes_however_many_a_key_holds() {
    let redis = TestRedis::start();
    let store = redis.store();
    let mut c = redis.client();
    let ids = fill(&store, "k", 5_000, 30_000).await;
    let status = store.status("k", POLICY).await.unwrap();
    assert_eq!(status.in_flight, 5_000);
    let mut bytes = 0;
    for key in keys(&mut c) {
        let usage: u64 = redis::cmd("MEMORY")
            .arg("USAGE")
            .arg(&key)
            .arg("SAMPLES")
            .arg(0)
            .query(&mut c)
            .unwrap();
        bytes += usage;
        let kind: String = redis::cmd("TYPE").arg(&key).query(&mut c).unwrap();
        // The shards; the set of their deadlines (one member a shard) may be larger.
        if kind == "zset" && !key.ends_with(":due") {
            let encoding: String = redis::cmd("OBJECT")
                .arg("ENCODING")
                .arg(&key)
                .query(&mut c)
                .unwrap();
            assert_eq!(encoding, "listpack", "{key}");
        }
    }
    assert!(bytes < 100 * 5_000, "{bytes} bytes for 5,000 permits");

    // Every permit is found where it was put: released, each once; then nothing is left.
    let released = join_all(ids.iter().map(|id| store.release("k", id))).await;
    assert!(released.into_iter().all(|r| r.unwrap()));
    assert!(!store.release("k", &ids[0]).await.unwrap());
    assert_eq!(store.status("k", POLICY).await.unwrap().in_flight, 0);
    assert_eq!(keys(&mut c), Vec::<String>::new());
}

#[tokio::test]
async fn a_crowded_keys_expired_leases_are_reclaimed_from_every_shard() {
    let redis = TestRedis::start();
    let store = redis.store();
    fill(&store, "k", 300, 5_000).await;
    let lasting = fill(&store, "k", 50, 60_000).await;
    store.advance_clock(Duration::from_secs(6));
    let Admission::Admitted { grant, reclaimed } =
        acquire(&store, "k", &PermitId::generate(), 5_000).await
    else {
        panic!("admitted");
    };
    assert_eq!(reclaimed, 300);
    assert_eq!(grant.in_flight, 51);
    for id in &lasting {
        assert!(store.release("k", id).await.unwrap());
    }
}

/// A shard's entry in the due set stays put when a lease as long as any other joins it; a shorter one
/// must move it earlier, or the shorter lease would outlive its deadline.
#[tokio::test]
async fn shorter_leases_among_longer_ones_are_reclaimed_on_time() {
    let redis = TestRedis::start();
    let store = redis.store();
    fill(&store, "k", 300, 60_000).await;
    fill(&store, "k", 300, 5_000).await;
    store.advance_clock(Duration::from_secs(6));
    let Admission::Admitted { grant, reclaimed } =
        acquire(&store, "k", &PermitId::generate(), 60_000).await
    else {
        panic!("admitted");
    };
    assert_eq!((reclaimed, grant.in_flight), (300, 301));
}

/// The permits in shard `i`, read from Redis: as Redis stores them (0xFF and the UUID's 16 bytes), and
/// as ids.
fn shard_ids(c: &mut redis::Connection, i: u32) -> (Vec<Vec<u8>>, Vec<PermitId>) {
    let members: Vec<Vec<u8>> = redis::cmd("ZRANGE")
        .arg(format!("inflight:{{k}}:leases:{i}"))
        .arg(0)
        .arg(-1)
        .query(c)
        .unwrap();
    let ids = members
        .iter()
        .map(|m| PermitId::from(uuid::Uuid::from_slice(&m[1..]).unwrap()))
        .collect();
    (members, ids)
}

/// A shard emptied, forgotten by the due set, then filled again: its new leases are due in their time.
#[tokio::test]
async fn a_shard_emptied_and_filled_again_is_reclaimed_on_time() {
    let redis = TestRedis::start();
    let store = redis.store();
    let mut c = redis.client();
    fill(&store, "k", 300, 60_000).await;
    fill(&store, "k", 200, 120_000).await;
    let (_, ids) = shard_ids(&mut c, 1);
    assert!(!ids.is_empty());
    for id in &ids {
        assert!(store.release("k", id).await.unwrap());
    }
    // The 60 s leases expire; reclaiming them finds shard 1 empty and drops it from the due set.
    store.advance_clock(Duration::from_secs(61));
    let before = store.status("k", POLICY).await.unwrap().in_flight;
    // Shard 1 filled again, with leases as long as the longest.
    for id in &ids {
        let admission = acquire(&store, "k", id, 120_000).await;
        assert!(
            matches!(admission, Admission::Admitted { .. }),
            "{admission:?}"
        );
    }
    store.advance_clock(Duration::from_secs(121));
    let Admission::Admitted { grant, reclaimed } =
        acquire(&store, "k", &PermitId::generate(), 1_000).await
    else {
        panic!("admitted");
    };
    assert_eq!(
        (reclaimed, grant.in_flight),
        (before + u32::try_from(ids.len()).unwrap(), 1)
    );
}

#[tokio::test]
async fn everything_a_crowded_key_leaves_in_redis_expires() {
    let redis = TestRedis::start();
    let store = redis.store();
    let mut c = redis.client();
    fill(&store, "k", 400, 30_000).await;
    let (members, ids) = shard_ids(&mut c, 1);
    assert!(!members.is_empty());
    // In one batch: refresh one of them, empty the shard (Redis deletes the set, and its expiry with
    // it), then fill it again: the new set needs an expiry of its own.
    let again = &ids[0];
    let mut batch: Vec<Pin<Box<dyn Future<Output = ()> + '_>>> = Vec::new();
    batch.push(Box::pin(async {
        let admission = acquire(&store, "k", again, 30_000).await;
        assert!(matches!(admission, Admission::Admitted { .. }));
    }));
    for id in &ids {
        batch.push(Box::pin(async {
            assert!(store.release("k", id).await.unwrap());
        }));
    }
    batch.push(Box::pin(async {
        let admission = acquire(&store, "k", again, 30_000).await;
        assert!(matches!(admission, Admission::Admitted { .. }));
    }));
    join_all(batch).await;
    assert_eq!(shard_ids(&mut c, 1).0, vec![members[0].clone()]);
    assert!(keys(&mut c).len() > 5);
    let before = one_expiry(&mut c);
    // A longer lease moves the key's expiry: every set moves with it.
    let admission = acquire(&store, "k", &PermitId::generate(), 90_000).await;
    assert!(matches!(admission, Admission::Admitted { .. }));
    assert!(one_expiry(&mut c) > before + 60_000);
}

/// Given ids can be chosen to share a hash ("Aa" and "BB" do, and so does any string of such pairs):
/// they all land in one shard, which then grows past the usual size. Slower and larger, still correct.
/// With the prefix "bd" their hash is 258 modulo 512, so at 4,129 leases (258 shards of 16) the split
/// of shard 2 moves all of them at once: more than Lua can unpack into one command.
#[tokio::test]
async fn ids_that_share_a_hash_are_still_counted_and_found() {
    let redis = TestRedis::start();
    let store = redis.store();
    let ids: Vec<PermitId> = (0..5_000u32)
        .map(|n| {
            let pairs = (0..13).map(|bit| if n >> bit & 1 == 1 { "Aa" } else { "BB" });
            let text: String = std::iter::once("bd").chain(pairs).collect();
            PermitId::from(text)
        })
        .collect();
    for chunk in ids.chunks(500) {
        for admission in join_all(chunk.iter().map(|id| acquire(&store, "k", id, 30_000))).await {
            assert!(
                matches!(admission, Admission::Admitted { .. }),
                "{admission:?}"
            );
        }
    }
    assert_eq!(store.status("k", POLICY).await.unwrap().in_flight, 5_000);
    one_expiry(&mut redis.client());
    let released = join_all(ids.iter().map(|id| store.release("k", id))).await;
    assert!(released.into_iter().all(|r| r.unwrap()));
    assert_eq!(store.status("k", POLICY).await.unwrap().in_flight, 0);
}

/// Permits of a crowded key re-registered after Redis lost everything (restarted empty): renewals that
/// re-add their leases make the key crowded again, and renew them there afterwards.
#[tokio::test]
async fn renewals_re_add_a_crowded_keys_lost_leases_into_shards() {
    let redis = TestRedis::start();
    let store = redis.store();
    let mut c = redis.client();
    let ids = fill(&store, "k", 300, 30_000).await;
    redis::cmd("FLUSHALL").exec(&mut c).unwrap();
    let renew = |readd: Option<u32>| -> Vec<RenewRequest> {
        ids.iter()
            .map(|id| RenewRequest {
                key: "k".into(),
                id: id.clone(),
                lease_ms: 30_000,
                policy: POLICY,
                readd_weight: readd,
            })
            .collect()
    };
    let readded = store.renew(&renew(Some(1))).await.unwrap();
    assert!(readded.iter().all(|r| matches!(r, Renewal::Readded(_))));
    assert_eq!(store.status("k", POLICY).await.unwrap().in_flight, 300);
    assert!(keys(&mut c).len() > 5, "sharded again");
    let renewed = store.renew(&renew(None)).await.unwrap();
    assert!(renewed.iter().all(|r| matches!(r, Renewal::Renewed(_))));
    one_expiry(&mut c);
    for id in &ids {
        assert!(store.release("k", id).await.unwrap());
    }
    assert_eq!(keys(&mut c), Vec::<String>::new());
}
