//! One queue per key for every process sharing Redis (`queue.lua`): waiters in different store handles
//! (each a process's: its own connections and its own channel of turns) are admitted in the order of
//! their tickets: priority, then their flow's turn, then arrival; a request without a ticket does not
//! pass them; a waiter that gives up, or whose process is killed, stops holding its place.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use inflight::{AcquireError, AcquireOptions, Limiter, Policy, RedisStore};
use tokio::task::JoinHandle;

use crate::support::child::{env, spawn_child, wait_for_line};
use crate::support::TestRedis;

/// The admissions, in order, by the waiters' names.
type Log = Arc<Mutex<Vec<String>>>;

/// A limiter of its own (another process's) on `redis`, every key's limit 1.
fn handle(redis: &TestRedis) -> Limiter<RedisStore> {
    Limiter::builder(redis.store())
        .policy(Policy::new(1, 0))
        .build()
}

fn wait() -> AcquireOptions {
    AcquireOptions::new().max_wait(Duration::from_secs(60))
}

/// How many tickets `k`'s queue holds.
fn queued(redis: &TestRedis) -> usize {
    redis::cmd("ZCARD")
        .arg("inflight:{k}:queue")
        .query(&mut redis.client())
        .unwrap()
}

async fn until_queued(redis: &TestRedis, n: usize) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while queued(redis) != n {
        assert!(Instant::now() < deadline, "{n} tickets in the queue");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// A waiter on `k` that, admitted, writes its name in the log and releases.
fn waiter(
    limiter: &Limiter<RedisStore>,
    name: &str,
    options: AcquireOptions,
    log: &Log,
) -> JoinHandle<()> {
    let (limiter, name, log) = (limiter.clone(), name.to_owned(), log.clone());
    tokio::spawn(async move {
        let permit = limiter.acquire("k", options).await.unwrap();
        log.lock().unwrap().push(name);
        permit.release().await.unwrap();
    })
}

async fn all_admitted(waiters: Vec<JoinHandle<()>>) {
    for waiter in waiters {
        tokio::time::timeout(Duration::from_secs(60), waiter)
            .await
            .expect("every waiter admitted")
            .unwrap();
    }
}

/// Waiters queued in turn from three handles are admitted in that order, not by handle.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_across_processes_are_admitted_in_arrival_order() {
    let redis = TestRedis::start();
    let handles = [handle(&redis), handle(&redis), handle(&redis)];
    let held = handles[0].try_acquire("k").await.unwrap();
    let log = Log::default();
    let mut names = Vec::new();
    let mut waiters = Vec::new();
    for n in 0..9 {
        let name = format!("{}-{n}", n % 3);
        waiters.push(waiter(&handles[n % 3], &name, wait(), &log));
        names.push(name);
        until_queued(&redis, n + 1).await;
    }
    held.release().await.unwrap();
    all_admitted(waiters).await;
    assert_eq!(*log.lock().unwrap(), names);
    assert_eq!(queued(&redis), 0, "no ticket left");
}

/// Limit 1, flow A queues 100 waiters (from two handles), then flow B one: B is admitted within two
/// admissions, and A's keep their own order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flow_with_one_waiter_is_not_kept_behind_another_flows_hundred() {
    let redis = TestRedis::start();
    let handles = [handle(&redis), handle(&redis)];
    let held = handles[0].try_acquire("k").await.unwrap();
    let log = Log::default();
    let mut waiters = Vec::new();
    for n in 0..100 {
        let options = wait().flow("a");
        waiters.push(waiter(&handles[n % 2], &format!("a{n}"), options, &log));
        until_queued(&redis, n + 1).await;
    }
    waiters.push(waiter(&handles[1], "b", wait().flow("b"), &log));
    until_queued(&redis, 101).await;
    held.release().await.unwrap();
    all_admitted(waiters).await;
    let log = log.lock().unwrap();
    let b = log.iter().position(|name| name == "b").unwrap();
    assert!(b < 2, "B admitted after {b} of A's: {:?}", &log[..5]);
    let a: Vec<&String> = log.iter().filter(|name| *name != "b").collect();
    let expected: Vec<String> = (0..100).map(|n| format!("a{n}")).collect();
    assert_eq!(
        a,
        expected.iter().collect::<Vec<_>>(),
        "A's in arrival order"
    );
}

/// A high-priority waiter passes every low one, whichever process they wait in.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_high_priority_waiter_passes_every_low_one() {
    let redis = TestRedis::start();
    let handles = [handle(&redis), handle(&redis)];
    let held = handles[0].try_acquire("k").await.unwrap();
    let log = Log::default();
    let mut waiters = Vec::new();
    for n in 0..5 {
        waiters.push(waiter(&handles[n % 2], &format!("low{n}"), wait(), &log));
        until_queued(&redis, n + 1).await;
    }
    waiters.push(waiter(&handles[0], "high", wait().priority(5), &log));
    until_queued(&redis, 6).await;
    held.release().await.unwrap();
    all_admitted(waiters).await;
    let log = log.lock().unwrap();
    assert_eq!(log[0], "high", "{log:?}");
    assert_eq!(log[1..], ["low0", "low1", "low2", "low3", "low4"]);
}

/// A slot freed while a waiter queues is kept for it: with limit 2, a waiter of weight 2 queues; one
/// slot is given back, too few for it, yet a request of weight 1 without a wait, from another process,
/// is refused (no barging); the second slot given back admits the waiter.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_without_a_ticket_does_not_pass_the_queue() {
    let redis = TestRedis::start();
    let two = || {
        Limiter::builder(redis.store())
            .policy(Policy::new(2, 0))
            .build()
    };
    let [holder, waiting, newcomer] = [two(), two(), two()];
    let (a, b) = (
        holder.try_acquire("k").await.unwrap(),
        holder.try_acquire("k").await.unwrap(),
    );
    let log = Log::default();
    let queued_waiter = waiter(&waiting, "waiter", wait().weight(2), &log);
    until_queued(&redis, 1).await;
    a.release().await.unwrap();
    let refused = newcomer.try_acquire("k").await.unwrap_err();
    assert!(matches!(refused, AcquireError::Full { .. }), "{refused:?}");
    b.release().await.unwrap();
    all_admitted(vec![queued_waiter]).await;
    drop(newcomer.try_acquire("k").await.expect("no queue: admitted"));
}

/// A waiter that gives up (its future dropped, or its wait ended) leaves the queue at once; the next
/// waiter is not kept behind it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_that_gives_up_leaves_nothing() {
    let redis = TestRedis::start();
    let [holder, other] = [handle(&redis), handle(&redis)];
    let held = holder.try_acquire("k").await.unwrap();
    let log = Log::default();
    let dropped = waiter(&other, "dropped", wait(), &log);
    until_queued(&redis, 1).await;
    let short = AcquireOptions::new().max_wait(Duration::from_millis(300));
    let timed_out = other.acquire("k", short).await.unwrap_err();
    assert!(matches!(timed_out, AcquireError::Full { .. }));
    dropped.abort();
    until_queued(&redis, 0).await;
    let next = waiter(&other, "next", wait(), &log);
    until_queued(&redis, 1).await;
    held.release().await.unwrap();
    all_admitted(vec![next]).await;
    assert_eq!(*log.lock().unwrap(), ["next"]);
}

/// Waits on `k` (limit 1) in a child process, until it is killed.
pub(crate) async fn wait_in_child() {
    let store = RedisStore::open(env("STORE_URL")).unwrap();
    let limiter = Limiter::builder(store).policy(Policy::new(1, 0)).build();
    println!("waiting");
    let permit = limiter.acquire("k", wait()).await;
    println!("admitted: {}", permit.is_ok());
    tokio::time::sleep(Duration::from_secs(600)).await;
}

/// The process whose waiter heads the queue is SIGKILLed: the next waiter, in another process, is
/// admitted once the dead one's ticket lease ends (not at the end of a permit's 30 s lease), whether the
/// release handed the dead waiter the slot (leased for its ticket's lease) or found its ticket expired.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_next_waiter_is_admitted_when_the_head_waiters_process_is_killed() {
    let redis = TestRedis::start();
    let holder = handle(&redis);
    let held = holder.try_acquire("k").await.unwrap();
    let mut child = spawn_child("wait", &[("STORE_URL", redis.url())]);
    wait_for_line(&mut child, "waiting");
    until_queued(&redis, 1).await;
    let log = Log::default();
    let next = waiter(&holder, "next", wait(), &log);
    until_queued(&redis, 2).await;
    child.kill().unwrap();
    child.wait().unwrap();
    let killed = Instant::now();
    held.release().await.unwrap();
    all_admitted(vec![next]).await;
    let took = killed.elapsed();
    eprintln!("admitted {took:?} after the head's process was killed");
    assert!(
        took < Duration::from_secs(20),
        "within the dead ticket's lease ({} ms) and a re-check, not a permit's lease: {took:?}",
        inflight::TICKET_LEASE_MS
    );
    assert_eq!(queued(&redis), 0, "the dead ticket is gone");
    // Either its ticket ended before the release (found expired), or the release handed it the slot,
    // leased for as long as the ticket would have lasted, which the next waiter reclaimed.
    let expired = inflight::Wakeups::tickets_expired(holder.store());
    let reclaimed = holder
        .stats()
        .reclaimed
        .load(std::sync::atomic::Ordering::SeqCst);
    assert_eq!(
        expired + reclaimed,
        1,
        "found expired by the next waiter's process"
    );
}

/// A waiter's re-check renews its ticket and keeps the whole queue with it: the queue's keys expire
/// together, however long the wait (before, only the first ticket gave them their expiry, and a wait
/// past it lost its order).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_renewed_ticket_keeps_the_whole_queue() {
    let redis = TestRedis::start();
    let [holder, other] = [handle(&redis), handle(&redis)];
    let held = holder.try_acquire("k").await.unwrap();
    let log = Log::default();
    let queued_waiter = waiter(&other, "waiter", wait(), &log);
    until_queued(&redis, 1).await;
    let deadline = |c: &mut redis::Connection| -> f64 {
        let ends: Vec<f64> = redis::cmd("ZRANGE")
            .arg("inflight:{k}:expiry")
            .arg(0)
            .arg(0)
            .arg("WITHSCORES")
            .query::<Vec<(String, f64)>>(c)
            .unwrap()
            .into_iter()
            .map(|(_, end)| end)
            .collect();
        ends[0]
    };
    let mut c = redis.client();
    let first = deadline(&mut c);
    let until = Instant::now() + Duration::from_secs(30);
    // A renewal a second on (its re-check), long after the ticket was taken.
    while deadline(&mut c) < first + 900.0 {
        assert!(Instant::now() < until, "the waiter renews its ticket");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let (queue, expiry): (i64, i64) = redis::pipe()
        .atomic()
        .cmd("PTTL")
        .arg("inflight:{k}:queue")
        .cmd("PTTL")
        .arg("inflight:{k}:expiry")
        .query(&mut c)
        .unwrap();
    assert!(
        (queue - expiry).abs() <= 50,
        "renewed together: {queue} ms and {expiry} ms"
    );
    held.release().await.unwrap();
    all_admitted(vec![queued_waiter]).await;
}
