//! `DifyStore` beside a worker that does exactly what Dify's `RateLimit` does (HLEN, then HSET of the
//! request id to `time.time()` as a float's text; HDEL on exit; entries older than 600 s evicted).
#![allow(missing_docs)]

mod support;

use std::time::Duration;

use inflight::store::Wakeups;
use inflight::{AcquireError, AcquireOptions, DifyStore, Limiter, Policy, RemoteLease, Renewal};
use redis::Commands;
use support::TestRedis;

const HASH: &str = "dify:rate_limit:app-1:active_requests";
const MAX: &str = "dify:rate_limit:app-1:max_active_requests";

fn store(redis: &TestRedis) -> DifyStore {
    redis.store_builder().dify().open().unwrap()
}

fn limiter(store: DifyStore, default_limit: u32) -> Limiter<DifyStore> {
    Limiter::builder(store)
        .policy(Policy::new(default_limit, 0))
        .build()
}

/// The Redis clock, in seconds (what Dify's workers' clocks are assumed to agree with).
fn redis_seconds(conn: &mut redis::Connection) -> f64 {
    let (secs, micros): (u64, u64) = redis::cmd("TIME").query(conn).unwrap();
    secs as f64 + micros as f64 / 1e6
}

/// Dify's `enter`: HLEN, then HSET if below the limit (two round trips, as Dify does).
fn dify_enter(conn: &mut redis::Connection, id: &str, limit: usize, at: f64) -> bool {
    let n: usize = conn.hlen(HASH).unwrap();
    if n >= limit {
        return false;
    }
    let _: () = conn.hset(HASH, id, at.to_string()).unwrap();
    true
}

/// Dify's `flush_cache` eviction: entries older than 600 s by the worker's clock.
fn dify_flush(conn: &mut redis::Connection, now: f64) -> Vec<String> {
    let entries: Vec<(String, String)> = conn.hgetall(HASH).unwrap();
    let stale: Vec<String> = entries
        .into_iter()
        .filter(|(_, at)| now - at.parse::<f64>().unwrap() > 600.0)
        .map(|(id, _)| id)
        .collect();
    for id in &stale {
        let _: () = conn.hdel(HASH, id).unwrap();
    }
    stale
}

#[tokio::test]
async fn dify_workers_and_inflight_share_one_cap() {
    let redis = TestRedis::start();
    let mut conn = redis.client();
    let limiter = limiter(store(&redis), 4);
    let now = redis_seconds(&mut conn);
    assert!(dify_enter(&mut conn, "d1", 4, now));
    assert!(dify_enter(&mut conn, "d2", 4, now));
    let a = limiter.try_acquire("app-1").await.unwrap();
    let b = limiter.try_acquire("app-1").await.unwrap();
    assert_eq!(b.in_flight(), 4, "Dify's entries count");
    let full = limiter.try_acquire("app-1").await.unwrap_err();
    assert!(
        matches!(
            full,
            AcquireError::Full {
                limit: 4,
                in_flight: 4
            }
        ),
        "{full:?}"
    );
    // Dify's workers see inflight's entries too.
    assert!(!dify_enter(&mut conn, "d3", 4, now));
    let len: usize = conn.hlen(HASH).unwrap();
    assert_eq!(len, 4);
    // Dify's exit frees a slot for inflight, inflight's release one for Dify.
    let _: () = conn.hdel(HASH, "d1").unwrap();
    let c = limiter.try_acquire("app-1").await.unwrap();
    drop(a);
    support_settle(&limiter, 3).await;
    assert!(dify_enter(&mut conn, "d4", 4, now));
    drop((b, c));
    support_settle(&limiter, 2).await;
    let left: Vec<String> = conn.hkeys(HASH).unwrap();
    assert_eq!(left.len(), 2, "{left:?}");
    assert!(left.iter().all(|id| id.starts_with('d')), "{left:?}");
}

async fn support_settle(limiter: &Limiter<DifyStore>, want: u32) {
    for _ in 0..200 {
        if limiter.status("app-1").await.unwrap().in_flight == want {
            return;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    panic!("in_flight did not settle at {want}");
}

#[tokio::test]
async fn the_max_active_requests_key_is_the_apps_limit_and_setting_one_writes_it() {
    let redis = TestRedis::start();
    let mut conn = redis.client();
    let limiter = limiter(store(&redis), 10);
    // As a Dify worker writes it (SETEX, one day).
    let _: () = conn.set_ex(MAX, "2", 86_400).unwrap();
    let _one = limiter.try_acquire("app-1").await.unwrap();
    let two = limiter.try_acquire("app-1").await.unwrap();
    assert_eq!(two.limit().get(), Some(2));
    assert!(limiter.try_acquire("app-1").await.is_err());
    // Set through inflight: written where Dify's workers read it, without expiry.
    let status = limiter.set_limit("app-1", 3).await.unwrap();
    assert_eq!((status.override_limit, status.in_flight), (Some(3), 2));
    let written: String = conn.get(MAX).unwrap();
    assert_eq!(written, "3");
    let ttl: i64 = conn.ttl(MAX).unwrap();
    assert_eq!(ttl, -1);
    let _three = limiter.try_acquire("app-1").await.unwrap();
    // Cleared: the class default again.
    limiter.clear_limit("app-1").await.unwrap();
    let exists: bool = conn.exists(MAX).unwrap();
    assert!(!exists);
    assert_eq!(limiter.status("app-1").await.unwrap().limit.get(), Some(10));
}

#[tokio::test]
async fn inflights_entries_carry_the_redis_clock_and_renewals_keep_them_from_difys_eviction() {
    let redis = TestRedis::start();
    let mut conn = redis.client();
    let store = store(&redis);
    let limiter = limiter(store.clone(), 4);
    let permit = limiter.try_acquire("app-1").await.unwrap();
    let id = permit.id().to_string();
    let written: f64 = conn
        .hget::<_, _, String>(HASH, &id)
        .unwrap()
        .parse()
        .unwrap();
    let now = redis_seconds(&mut conn);
    assert!((now - written).abs() < 5.0, "{written} vs {now}");
    // A stream of 20 minutes: renewed every 20 s of its (moved) clock, never evicted by Dify's flush.
    let lease = permit.detach();
    let remote = RemoteLease::new(&["app-1"], lease.id, lease.token);
    for step in 1..=60u32 {
        store.advance_clock(Duration::from_secs(20));
        let renewal = limiter.renew(&remote, None).await.unwrap().0;
        assert!(matches!(renewal, Renewal::Renewed(_)), "{renewal:?}");
        let dify_now = now + f64::from(step) * 20.0;
        assert!(dify_flush(&mut conn, dify_now).is_empty(), "step {step}");
    }
    let refreshed: f64 = conn
        .hget::<_, _, String>(HASH, &id)
        .unwrap()
        .parse()
        .unwrap();
    assert!(refreshed - written > 1_100.0, "{refreshed} vs {written}");
    assert!(limiter.release(&remote).await.unwrap().0);
    let left: usize = conn.hlen(HASH).unwrap();
    assert_eq!(left, 0);
}

#[tokio::test]
async fn an_expired_lease_takes_its_entry_with_it() {
    let redis = TestRedis::start();
    let mut conn = redis.client();
    let store = store(&redis);
    let limiter = limiter(store.clone(), 1);
    let lost = limiter.try_acquire("app-1").await.unwrap().detach();
    store.advance_clock(Duration::from_secs(31));
    let next = limiter.try_acquire("app-1").await.unwrap();
    assert_ne!(next.id(), &lost.id);
    let ids: Vec<String> = conn.hkeys(HASH).unwrap();
    assert_eq!(ids, vec![next.id().to_string()]);
}

#[tokio::test]
async fn stale_dify_entries_are_evicted_only_when_they_stand_in_the_way() {
    let redis = TestRedis::start();
    let mut conn = redis.client();
    let now = redis_seconds(&mut conn);
    // Two entries of crashed Dify workers (11 minutes old), one of a live one (10 s old).
    assert!(dify_enter(&mut conn, "crashed-1", 3, now - 660.0));
    assert!(dify_enter(&mut conn, "crashed-2", 3, now - 660.0));
    assert!(dify_enter(&mut conn, "live", 3, now - 10.0));
    let limiter = limiter(store(&redis), 4);
    // Room for one: nothing evicted.
    let _a = limiter.try_acquire("app-1").await.unwrap();
    assert_eq!(conn.hlen::<_, usize>(HASH).unwrap(), 4);
    // Full: the stale ones go, the live one stays.
    let b = limiter.try_acquire("app-1").await.unwrap();
    assert_eq!(b.in_flight(), 3);
    let mut ids: Vec<String> = conn.hkeys(HASH).unwrap();
    ids.sort();
    assert!(!ids.iter().any(|id| id.starts_with("crashed")), "{ids:?}");
    assert!(ids.contains(&"live".to_owned()));

    // The age is configurable.
    let redis = TestRedis::start();
    let mut conn = redis.client();
    let now = redis_seconds(&mut conn);
    assert!(dify_enter(&mut conn, "old", 1, now - 100.0));
    let strict = redis
        .store_builder()
        .dify()
        .stale_after(Duration::from_secs(60))
        .open()
        .unwrap();
    let _c = self::limiter(strict, 1).try_acquire("app-1").await.unwrap();
    assert!(!conn.hexists::<_, _, bool>(HASH, "old").unwrap());
}

#[tokio::test]
async fn weights_and_keys_with_braces_are_refused_clearly() {
    let redis = TestRedis::start();
    let limiter = limiter(store(&redis), 4);
    let err = limiter
        .try_acquire_with("app-1", AcquireOptions::new().weight(2))
        .await
        .unwrap_err();
    assert!(err.to_string().contains("weights must be 1"), "{err}");
    let err = limiter.try_acquire("{app}").await.unwrap_err();
    assert!(err.to_string().contains("braces"), "{err}");
    assert_eq!(limiter.status("app-1").await.unwrap().in_flight, 0);
}

/// Issue 28, item 8: a short lease must not cut the expiry of the lease set below a longer lease's
/// deadline. Here the set is left to expire (a second stale age makes a lease-less entry evictable at
/// once, as 600 s does to an hour-long lease): the long lease must still count, 2 held on a limit of 2.
#[tokio::test]
async fn a_short_lease_never_shortens_the_expiry_of_a_longer_one() {
    let redis = TestRedis::start();
    let mut conn = redis.client();
    let store = redis
        .store_builder()
        .dify()
        .stale_after(Duration::from_millis(1))
        .open()
        .unwrap();
    let limiter = limiter(store, 2);
    let long = AcquireOptions::new().lease(Duration::from_secs(60));
    let _long = limiter.try_acquire_with("app-1", long).await.unwrap();
    let short = AcquireOptions::new().lease(Duration::from_millis(100));
    let short = limiter.try_acquire_with("app-1", short).await.unwrap();
    short.release().await.unwrap();
    // The set now expires with the long lease (past a minute) or, shortened, within moments: wait
    // for either.
    let leases = format!("{{{HASH}}}:leases");
    let started = std::time::Instant::now();
    loop {
        let ttl: i64 = conn.pttl(&leases).unwrap();
        if ttl > 60_000 || ttl == -2 {
            break;
        }
        assert!(started.elapsed() < Duration::from_secs(10), "ttl {ttl}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let _second = limiter.try_acquire("app-1").await.unwrap();
    let third = limiter.try_acquire("app-1").await;
    assert!(
        third.as_ref().is_err_and(AcquireError::is_full),
        "3 held on a limit of 2: {third:?}"
    );
}

/// Issue 28, item 10, in Dify's layout: a `max_active_requests` no client can read (past 2^32 - 1) is
/// read as none.
#[tokio::test]
async fn an_unreadable_max_active_requests_is_read_as_none() {
    let redis = TestRedis::start();
    let mut conn = redis.client();
    let limiter = limiter(store(&redis), 1);
    let _: () = conn.set(MAX, "4294967296").unwrap();
    let status = limiter.status("app-1").await.unwrap();
    assert_eq!((status.override_limit, status.limit.get()), (None, Some(1)));
    let _held = limiter.try_acquire("app-1").await.unwrap();
    assert!(limiter.try_acquire("app-1").await.unwrap_err().is_full());
}

/// A permit whose lease is longer than Dify's eviction age (a 30 min stream) is not evicted by Dify's
/// flush at any time before its lease ends, renewed or not: its entry's start time is its lease's end
/// less the stale age. (Before, the entry carried its admission's time, and a flush 11 minutes later,
/// before the first renewal at a third of the lease, removed it: Dify then admitted past the limit.)
#[tokio::test]
async fn a_lease_longer_than_difys_eviction_age_is_never_evicted_before_it_ends() {
    let redis = TestRedis::start();
    let mut conn = redis.client();
    let limiter = limiter(store(&redis), 4);
    let now = redis_seconds(&mut conn);
    let long = AcquireOptions::new().lease(Duration::from_secs(30 * 60));
    let permit = limiter.try_acquire_with("app-1", long).await.unwrap();
    for minutes in [1.0, 11.0, 20.0, 29.5] {
        let evicted = dify_flush(&mut conn, now + minutes * 60.0);
        assert!(evicted.is_empty(), "evicted at {minutes} min: {evicted:?}");
    }
    let evicted = dify_flush(&mut conn, now + 30.0 * 60.0 + 601.0);
    assert_eq!(
        evicted,
        [permit.id().to_string()],
        "stale once the lease is long over"
    );
}

/// An admission keeps Dify's limit key alive as Dify's workers do when they flush (a day), so the
/// limit they wrote outlives the last of them; an override inflight set (no expiry) stays without one.
#[tokio::test]
async fn an_admission_keeps_difys_limit_key_alive() {
    let redis = TestRedis::start();
    let mut conn = redis.client();
    let limiter = limiter(store(&redis), 4);
    let _: () = conn.set_ex(MAX, "3", 86_400 - 3_600).unwrap();
    let _permit = limiter.try_acquire("app-1").await.unwrap();
    let ttl: i64 = conn.ttl(MAX).unwrap();
    assert!(ttl > 86_400 - 60, "{ttl}");
    let _: () = conn.set(MAX, "3").unwrap();
    let _again = limiter.try_acquire("app-1").await.unwrap();
    let ttl: i64 = conn.ttl(MAX).unwrap();
    assert_eq!(ttl, -1, "inflight's own override keeps no expiry");
}

/// With Dify's `REDIS_KEY_PREFIX`, every name is Dify's prefixed one: the hash, the limit key, the side
/// keys after the hash, and the queue of waiters beside it.
#[tokio::test]
async fn with_a_key_prefix_every_name_follows_the_prefixed_hash() {
    let redis = TestRedis::start();
    let mut conn = redis.client();
    let hash = format!("acme:{HASH}");
    let store = redis
        .store_builder()
        .dify()
        .key_prefix(" acme\u{1f}")
        .open()
        .unwrap();
    let _: () = conn.set(format!("acme:{MAX}"), 1).unwrap();
    let limiter = limiter(store, 5);
    let permit = limiter.try_acquire("app-1").await.unwrap();
    assert_eq!(
        permit.limit(),
        inflight::Limit::Limited(1),
        "the prefixed limit key is the app's"
    );
    let waiter = {
        let limiter = limiter.clone();
        let wait = AcquireOptions::new().max_wait(Duration::from_secs(30));
        tokio::spawn(async move { limiter.acquire("app-1", wait).await })
    };
    let queue = format!("{{{hash}}}:queue");
    for _ in 0..400 {
        if conn.zcard::<_, usize>(&queue).unwrap() == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let len: usize = conn.hlen(&hash).unwrap();
    let keys: Vec<String> = conn.keys("*").unwrap();
    assert_eq!(len, 1);
    assert!(keys.contains(&queue), "{keys:?}");
    assert!(
        keys.iter()
            .all(|key| key.contains("acme:dify:rate_limit:app-1:")),
        "{keys:?}"
    );
    permit.release().await.unwrap();
    let admitted = waiter.await.unwrap().unwrap();
    let left: usize = conn.zcard(&queue).unwrap();
    assert_eq!(left, 0, "the ticket left the queue");
    drop(admitted);
}

/// The registered id of the one ticket in `app-1`'s queue (its `'>'` field, `queue.lua`'s
/// `take_ticket`), once there (bounded).
async fn registered_waiter(conn: &mut redis::Connection) -> String {
    let tickets = format!("{{{HASH}}}:tickets");
    for _ in 0..2000 {
        let fields: Vec<(String, String)> = conn.hgetall(&tickets).unwrap();
        if let Some((_, id)) = fields.into_iter().find(|(field, _)| field.starts_with('>')) {
            return id;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    panic!("no waiter registered for a hand-off");
}

/// A release hands the freed slot to the head waiter under the Dify layout too, in its own step: the
/// waiter's entry is in Dify's hash once the release returns, leased for its ticket's length (as only a
/// hand-off leases it), and the waiter, in another process, holds it without asking again (token 0, as
/// every Dify-layout permit); its claim renews it to its own lease, and its release empties the hash.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_hands_the_slot_to_the_head_waiter() {
    let redis = TestRedis::start();
    let mut conn = redis.client();
    let (holder, other) = (limiter(store(&redis), 1), limiter(store(&redis), 1));
    // The waiter's process hears turns before it waits, so that its wait asks once (no ask again in case
    // a turn went unheard), and nothing but the release writes its lease.
    let subscribed = other.store().ticket().expect("a store with queues");
    subscribed.heard().await;
    drop(subscribed);
    let held = holder.try_acquire("app-1").await.unwrap();
    let waiter = {
        let other = other.clone();
        let wait = AcquireOptions::new().max_wait(Duration::from_secs(30));
        tokio::spawn(async move { other.acquire("app-1", wait).await })
    };
    let id = registered_waiter(&mut conn).await;
    // Waiting for its turn (its ask's answer read): a slot handed from now on is heard as such, never
    // while its ask comes back (it would then ask once more, at once, and take the lease its id holds).
    for _ in 0..2000 {
        if other
            .stats()
            .waiting
            .load(std::sync::atomic::Ordering::SeqCst)
            == 1
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    held.release().await.unwrap();
    let ids: Vec<String> = conn.hkeys(HASH).unwrap();
    assert_eq!(
        ids,
        std::slice::from_ref(&id),
        "handed in the release's step"
    );
    let lease_ms: Option<u64> = conn.hget(format!("{{{HASH}}}:lease_ms"), &id).unwrap();
    assert_eq!(
        lease_ms,
        Some(inflight::TICKET_LEASE_MS),
        "the ticket's length"
    );
    let queued: usize = conn.zcard(format!("{{{HASH}}}:queue")).unwrap();
    assert_eq!(queued, 0, "the ticket left the queue");
    let permit = tokio::time::timeout(Duration::from_secs(30), waiter)
        .await
        .expect("admitted")
        .unwrap()
        .unwrap();
    assert_eq!(permit.id().to_string(), id);
    assert_eq!((permit.token(), permit.in_flight()), (0, 1));
    // Claimed (`dify.lua`'s renewal) for the limiter's default lease, whose length goes unrecorded.
    let claimed = |conn: &mut redis::Connection| {
        let length: Option<u64> = conn.hget(format!("{{{HASH}}}:lease_ms"), &id).unwrap();
        let deadline: Option<f64> = conn.zscore(format!("{{{HASH}}}:leases"), &id).unwrap();
        let now_ms = redis_seconds(conn) * 1000.0;
        length.is_none() && deadline.is_some_and(|at| at > now_ms + 10_000.0)
    };
    for _ in 0..2000 {
        if claimed(&mut conn) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert!(claimed(&mut conn), "the handed lease renewed to 30 s");
    permit.release().await.unwrap();
    assert_eq!(conn.hlen::<_, usize>(HASH).unwrap(), 0);
}

/// A wait that ended before it heard of the slot a release handed it (its ask queued and registered,
/// as `wait.rs` makes it, then given up after the release): its leave finds the ticket gone and gives
/// the slot back, so Dify's hash holds its holders only.
#[tokio::test]
async fn a_slot_handed_to_a_waiter_gone_before_hearing_is_given_back() {
    use inflight::store::{AcquireRequest, Admission, Store, Ticket};
    let redis = TestRedis::start();
    let mut conn = redis.client();
    let store = store(&redis);
    let limiter = limiter(store.clone(), 2);
    let now = redis_seconds(&mut conn);
    assert!(dify_enter(&mut conn, "d1", 2, now));
    let held = limiter.try_acquire("app-1").await.unwrap();
    let turn = store.ticket().expect("a store with queues");
    let id = inflight::PermitId::generate();
    let limits = [inflight::ClassLimits::new(2, 0)];
    let ask = AcquireRequest {
        keys: &["app-1"],
        id: &id,
        weight: 1,
        lease_ms: 30_000,
        limits: &limits,
        generated: true,
        ticket: Some(Ticket {
            name: turn.name(),
            flow: "",
            flow_weight: 1,
            lease_ms: inflight::TICKET_LEASE_MS,
            handoff: true,
        }),
        priority: 0,
        floors: &[],
        holder: None,
        shadow: 0,
    };
    let asked = store.acquire(ask).await.unwrap();
    assert!(matches!(asked, Admission::Queued { .. }), "{asked:?}");
    held.release().await.unwrap();
    let handed: bool = conn.hexists(HASH, id.to_string()).unwrap();
    assert!(handed, "the release handed the slot");
    let keys = [std::sync::Arc::from("app-1")];
    let left = store.leave(&keys, turn.name(), Some(&id)).await.unwrap();
    assert!(!left, "no longer queued");
    let ids: Vec<String> = conn.hkeys(HASH).unwrap();
    assert_eq!(ids, ["d1"], "the holders only");
    let leases: usize = conn.zcard(format!("{{{HASH}}}:leases")).unwrap();
    assert_eq!(leases, 0);
}

/// The same through the limiter: a waiting future dropped once queued, the holder's release right
/// after. Whichever reaches Redis first (the release's hand-off, or the wait's leave, deferred to the
/// settler), nothing stays held but Dify's entry (bounded).
#[tokio::test]
async fn a_dropped_waiter_holds_nothing_after_a_release() {
    let redis = TestRedis::start();
    let mut conn = redis.client();
    let (holder, other) = (limiter(store(&redis), 2), limiter(store(&redis), 2));
    let now = redis_seconds(&mut conn);
    assert!(dify_enter(&mut conn, "d1", 2, now));
    let held = holder.try_acquire("app-1").await.unwrap();
    let waiter = {
        let other = other.clone();
        let wait = AcquireOptions::new().max_wait(Duration::from_secs(30));
        tokio::spawn(async move { other.acquire("app-1", wait).await })
    };
    registered_waiter(&mut conn).await;
    waiter.abort();
    assert!(waiter.await.unwrap_err().is_cancelled());
    held.release().await.unwrap();
    for _ in 0..2000 {
        let ids: Vec<String> = conn.hkeys(HASH).unwrap();
        let queued: usize = conn.zcard(format!("{{{HASH}}}:queue")).unwrap();
        if ids == ["d1"] && queued == 0 {
            return;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    panic!("the waiter's slot or ticket stayed");
}
