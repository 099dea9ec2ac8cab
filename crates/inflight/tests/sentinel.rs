//! Sentinel: a primary, its replica and 3 sentinels; the store finds the primary through them and
//! follows a failover. RELIABILITY.md ("Failover") states what these tests back.
#![allow(missing_docs)]

mod support;

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use inflight::{Limiter, Policy, RedisStore};
use support::failover::Probe;
use support::TestSentinel;

/// RELIABILITY.md: admissions work again within down-after + 2 x failover-timeout + 3 s after the
/// primary is killed (a first election that fails is tried again after 2 x failover-timeout); here
/// 400 ms and 1 s.
const BACK_WITHIN: Duration = Duration::from_millis(400 + 2 * 1000 + 3000);
const LIMIT: u32 = 4;

/// Returns once the node that `probe` is connected to no longer answers a PING within 50 ms: its DEBUG
/// SLEEP has begun.
fn wait_asleep(mut probe: redis::Connection) {
    probe
        .set_read_timeout(Some(Duration::from_millis(50)))
        .unwrap();
    let started = Instant::now();
    while redis::cmd("PING").query::<String>(&mut probe).is_ok() {
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "the replica never slept"
        );
        std::thread::sleep(Duration::from_millis(2));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_failover_is_followed_and_renewals_readd_what_the_new_primary_lacks() {
    let topology = TestSentinel::start();
    let store = topology.store_builder().open().unwrap();
    assert!(
        store.target().starts_with("sentinel "),
        "{}",
        store.target()
    );
    let limiter = Limiter::builder(store)
        .policy(Policy::new(LIMIT, 0))
        .lease(Duration::from_millis(900))
        .build();
    // A second process that is idle through the failover: it follows `+switch-master` (or its poll)
    // and its next admission after the failover succeeds at the first try.
    let idle = Limiter::builder(topology.store_builder().open().unwrap())
        .policy(Policy::new(LIMIT, 0))
        .build();
    drop(idle.try_acquire("idle").await.unwrap());
    // Everything works through the primary the sentinels name, overrides included.
    limiter.set_limit("o", 1).await.unwrap();
    let one = limiter.try_acquire("o").await.unwrap();
    assert!(limiter.try_acquire("o").await.unwrap_err().is_full());
    drop(one);

    let probe = Probe::start(&limiter, "k");
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert_eq!(probe.most(), LIMIT, "the workers fill k");

    // Writes the replica never receives: the replica held asleep (so that it cannot connect again
    // and catch up), then its link cut, two permits are taken, and the primary is killed. The new
    // primary will not know them.
    let replica = topology.replica();
    let (mut conn, pinger) = (topology.node(replica), topology.node(replica));
    let sleeper = std::thread::spawn(move || {
        let _: redis::RedisResult<()> =
            redis::cmd("DEBUG").arg("SLEEP").arg("0.3").query(&mut conn);
    });
    wait_asleep(pinger);
    let mut primary = topology.node(topology.primary());
    let _: redis::Value = redis::cmd("CLIENT")
        .arg("KILL")
        .arg("TYPE")
        .arg("replica")
        .query(&mut primary)
        .unwrap();
    let lost = [
        limiter.try_acquire("lost").await.unwrap(),
        limiter.try_acquire("lost").await.unwrap(),
    ];
    let killed = Instant::now();
    topology.kill_primary();
    sleeper.join().unwrap();

    let back = probe.back_after(killed, BACK_WITHIN * 3).await;
    assert_eq!(
        topology.named_primary(),
        Some(replica),
        "the replica was promoted"
    );
    tokio::time::sleep(Duration::from_millis(1100)).await; // one poll, should +switch-master be missed
    let first = idle.try_acquire("idle").await;
    assert!(first.is_ok(), "the idle process did not follow: {first:?}");
    // The lost permits' holders re-add them with their next renewal (every third of the lease).
    let readding = Instant::now();
    while limiter
        .status("lost")
        .await
        .map(|s| s.in_flight)
        .unwrap_or(0)
        < 2
    {
        assert!(
            readding.elapsed() < Duration::from_secs(2),
            "renewals did not re-add the permits"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let readded = limiter.stats().readded.load(Ordering::Relaxed);
    let (most, errors) = probe.stop().await;
    let over = most.saturating_sub(LIMIT);
    eprintln!(
        "sentinel failover: admissions back {back:?} after the kill ({errors} store errors); \
         {readded} leases re-added; holders over the limit at most {over}"
    );
    assert!(back <= BACK_WITHIN, "admissions came back after {back:?}");
    assert!(
        readded >= 2,
        "the lost permits came back by re-adding: {readded}"
    );
    assert!(lost.iter().all(|p| !p.is_lost()));
    assert!(over <= LIMIT, "{over} over the limit");
    // The override set before the failover was replicated and still applies.
    let one = limiter.try_acquire("o").await.unwrap();
    assert!(limiter.try_acquire("o").await.unwrap_err().is_full());
    drop(one);
}

/// `wait_replicas`: an admission is answered once the replica has it (read on the replica at once),
/// and a replica that cannot answer delays admissions by the timeout only.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admissions_wait_for_their_replicas_up_to_the_timeout() {
    let topology = TestSentinel::start();
    let store = RedisStore::builder(format!("redis://127.0.0.1:{}", topology.primary()))
        .response_timeout(Duration::from_secs(2))
        .wait_replicas(1, Duration::from_millis(150))
        .open()
        .unwrap();
    let limiter = Limiter::builder(store).policy(Policy::new(100, 0)).build();
    let mut replica = topology.node(topology.replica());
    for i in 0..20 {
        let _permit = limiter.try_acquire("k").await.unwrap();
        let leases: u32 = redis::cmd("ZCARD")
            .arg("inflight:{k}:leases")
            .query(&mut replica)
            .unwrap();
        assert_eq!(
            leases, 1,
            "admission {i} answered before the replica had it"
        );
    }
    let mut conn = topology.node(topology.replica());
    let sleeper = std::thread::spawn(move || {
        let _: redis::RedisResult<()> = redis::cmd("DEBUG").arg("SLEEP").arg("1").query(&mut conn);
    });
    std::thread::sleep(Duration::from_millis(50));
    let started = Instant::now();
    let permit = limiter.try_acquire("k").await;
    let took = started.elapsed();
    sleeper.join().unwrap();
    assert!(permit.is_ok(), "answered anyway: {permit:?}");
    assert!(
        took >= Duration::from_millis(140) && took < Duration::from_millis(900),
        "waited {took:?} for a replica that could not answer"
    );
}
