//! What an admission writes to Redis at least: a lease under an id generated for it keeps no entry in the
//! key's hash (its fencing holds all the same), and a release (or a new limit) is announced only while
//! some process has waiters on the key.

use std::time::Duration;

use tokio::time::Instant;

use inflight::store::{AcquireRequest, Admission, OverrideChange};
use inflight::{AcquireOptions, ClassLimits, Limiter, PermitId, Policy, Store};

use crate::support::TestRedis;

/// The bytes Redis stores for a generated id: 0xFF, then the UUID's 16 bytes.
fn member(id: &PermitId) -> Vec<u8> {
    let uuid = uuid::Uuid::parse_str(&id.to_string()).unwrap();
    std::iter::once(0xFF).chain(*uuid.as_bytes()).collect()
}

/// A first admission under a generated id writes only its lease (and the key's last token); the same
/// admission sent again (a re-sent script) takes the lease over with a new token and records it, so
/// that a release naming the first token leaves it alone, as for any id.
#[tokio::test]
async fn a_generated_ids_lease_keeps_no_entry_until_it_is_admitted_again() {
    let redis = TestRedis::start();
    let store = redis.store();
    let limits = [ClassLimits::new(4, 0)];
    let id = PermitId::generate();
    let acquire = || {
        store.acquire(AcquireRequest {
            keys: &["k"],
            id: &id,
            weight: 1,
            lease_ms: 30_000,
            limits: &limits,
            generated: true,
            ticket: None,
            priority: 0,
            floors: &[],
            holder: None,
            shadow: 0,
        })
    };
    let token_of = |admission| match admission {
        Admission::Admitted { grant, .. } => grant.token,
        other => panic!("{other:?}"),
    };
    let first = token_of(acquire().await.unwrap());
    let mut c = redis.client();
    let entry = |c: &mut redis::Connection| -> Option<String> {
        redis::cmd("HGET")
            .arg("inflight:{k}:permits")
            .arg(member(&id))
            .query(c)
            .unwrap()
    };
    assert_eq!(entry(&mut c), None, "a fresh lease has no entry");
    let last: String = redis::cmd("HGET")
        .arg("inflight:{k}:permits")
        .arg("#")
        .query(&mut c)
        .unwrap();
    assert_eq!(last, first.to_string(), "the key's last token is written");
    let ttl: i64 = redis::cmd("PTTL")
        .arg("inflight:{k}:permits")
        .query(&mut c)
        .unwrap();
    assert!(ttl > 30_000, "the hash expires with the leases, PTTL {ttl}");

    let again = token_of(acquire().await.unwrap());
    assert!(again > first);
    let recorded = entry(&mut c).expect("an id admitted again records its token");
    assert!(recorded.ends_with(&format!(" {again}")), "{recorded}");
    assert_eq!(
        store
            .status("k", limits[0], OverrideChange::Keep)
            .await
            .unwrap()
            .in_flight,
        1
    );
    let keys = [std::sync::Arc::from("k")];
    assert!(!store.release(&keys, &id, first).await.unwrap());
    assert!(store.release(&keys, &id, again).await.unwrap());
    assert_eq!(entry(&mut c), None, "the entry goes with its lease");
    assert_eq!(
        store
            .status("k", limits[0], OverrideChange::Keep)
            .await
            .unwrap()
            .in_flight,
        0
    );
}

/// A limiter of its own (another process's) on `redis`, every key's limit 1.
fn limit_one(redis: &TestRedis) -> Limiter<inflight::RedisStore> {
    Limiter::builder(redis.store())
        .policy(Policy::new(1, 0))
        .build()
}

/// The channels on which waiters hear their turn: one per store handle (`<prefix>turns:<id>`).
const TURNS: &str = "inflight:turns:*";

/// Whether `act` is announced to a waiting store handle: subscribed before it, then a message of this
/// test's own published after it; the first one heard tells (Redis runs the two in order).
async fn announced(redis: &TestRedis, act: impl AsyncFnOnce()) -> bool {
    let mut listener = redis::Client::open(redis.url())
        .unwrap()
        .get_connection()
        .unwrap();
    let mut subscription = listener.as_pubsub();
    subscription.psubscribe(TURNS).unwrap();
    subscription
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    act().await;
    redis::cmd("PUBLISH")
        .arg("inflight:turns:after")
        .arg("after")
        .query::<i64>(&mut redis.client())
        .unwrap();
    let heard: String = subscription.get_message().unwrap().get_payload().unwrap();
    heard != "after"
}

/// A waiter on `k` (limit 1) in another store handle (another process's), once its ticket is in the
/// key's queue.
async fn waiting_elsewhere(redis: &TestRedis) -> tokio::task::JoinHandle<()> {
    let waiter = limit_one(redis);
    let wait = AcquireOptions::new().max_wait(Duration::from_secs(30));
    let waiting = tokio::spawn(async move {
        drop(waiter.acquire("k", wait).await.unwrap());
    });
    let (mut c, deadline) = (redis.client(), Instant::now() + Duration::from_secs(10));
    let queued = |c: &mut redis::Connection| {
        redis::cmd("ZCARD")
            .arg("inflight:{k}:queue")
            .query::<i64>(c)
            .unwrap()
            == 1
    };
    while !queued(&mut c) {
        assert!(
            Instant::now() < deadline,
            "the waiter's ticket is in the queue"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    waiting
}

async fn admitted(waiting: tokio::task::JoinHandle<()>) {
    tokio::time::timeout(Duration::from_secs(10), waiting)
        .await
        .expect("the waiter was admitted")
        .unwrap();
}

/// Nothing waits: a release publishes nothing. A waiter in another process holds a ticket in the key's
/// queue, so the release that frees its slot calls its turn on its process's channel.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_is_announced_only_while_someone_waits() {
    let redis = TestRedis::start();
    let holder = limit_one(&redis);
    let first = holder.try_acquire("k").await.unwrap();
    let release = async || first.release().await.unwrap();
    assert!(
        !announced(&redis, release).await,
        "no waiter: not announced"
    );
    let held = holder.try_acquire("k").await.unwrap();
    let waiting = waiting_elsewhere(&redis).await;
    let release = async || held.release().await.unwrap();
    assert!(announced(&redis, release).await, "a waiter: announced");
    admitted(waiting).await;
}

/// A key's limit raised while a process waits on it: the head of the queue hears its turn, as after a
/// release, and is admitted at once rather than at its next re-check.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_raised_limit_is_announced_to_the_waiters() {
    let redis = TestRedis::start();
    let holder = limit_one(&redis);
    let _held = holder.try_acquire("k").await.unwrap();
    let waiting = waiting_elsewhere(&redis).await;
    let raise = async || {
        let raised = holder.set_limit("k", 2).await.unwrap();
        assert_eq!(raised.limit, inflight::Limit::Limited(2));
    };
    assert!(
        announced(&redis, raise).await,
        "the new limit was announced"
    );
    admitted(waiting).await;
}

/// A worker's lone admission and its release take one script call each, of the lone entry point
/// (`lone.lua`, made of the files the manifest names), not of `batch.lua`.
#[tokio::test]
async fn a_lone_admission_and_its_release_take_one_call_each_of_the_lone_entry_point() {
    let redis = TestRedis::start();
    let limiter = Limiter::builder(redis.store())
        .policy(Policy::new(2, 0))
        .build();
    let mut c = redis.client();
    let calls = |c: &mut redis::Connection| -> u64 {
        let info: String = redis::cmd("INFO").arg("commandstats").query(c).unwrap();
        let line = info
            .lines()
            .find(|line| line.starts_with("cmdstat_evalsha:"));
        let calls = line.and_then(|line| line.split(['=', ',']).nth(1));
        calls.map_or(0, |calls| calls.parse().unwrap())
    };
    // (Each script's first call is refused, NOSCRIPT, and sent again once loaded: counted after.)
    limiter
        .try_acquire("k")
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    limiter.status("k").await.unwrap();
    let before = calls(&mut c);
    let permit = limiter.try_acquire("k").await.unwrap();
    assert_eq!(limiter.status("k").await.unwrap().in_flight, 1);
    let during = calls(&mut c);
    permit.release().await.unwrap();
    assert_eq!(limiter.status("k").await.unwrap().in_flight, 0);
    let lone = concat!(
        include_str!("../../src/store/redis/scripts/base.lua"),
        include_str!("../../src/store/redis/scripts/lone.lua")
    );
    let loaded: Vec<bool> = redis::cmd("SCRIPT")
        .arg("EXISTS")
        .arg(redis::Script::new(lone).get_hash())
        .query(&mut c)
        .unwrap();
    assert_eq!(loaded, [true], "the lone entry point ran");
    // (status() runs a script of its own: one call each.)
    assert_eq!(during - before, 2, "the admission: one call");
    assert_eq!(calls(&mut c) - during, 2, "the release: one call");
}
