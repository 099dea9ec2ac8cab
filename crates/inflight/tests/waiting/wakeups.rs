//! A waiter woken by a release in another process, or timed out; in arrival order; bounded; dropped
//! at any moment without holding anything; woken by a raised limit at once.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use inflight::{AcquireError, AcquireOptions, Limiter, MemoryStore, Policy, Wakeups, RECHECK};

use crate::{dify, limiter, memory, redis, wait, waiting};

async fn a_waiter_is_admitted_by_a_release_in_another_process_or_times_out<S: Wakeups>(a: S, b: S) {
    let (one, two) = (limiter(a, 1), limiter(b, 1));
    let held = one.try_acquire("model").await.unwrap();
    // Refused after its wait, with try_acquire's error; it held nothing meanwhile.
    let started = Instant::now();
    let refused = two.acquire("model", wait(150)).await.unwrap_err();
    assert!(
        matches!(
            refused,
            AcquireError::Full {
                limit: 1,
                in_flight: 1
            }
        ),
        "{refused:?}"
    );
    assert!(started.elapsed() >= Duration::from_millis(150));
    assert_eq!(two.stats().wait_timeouts.load(Ordering::SeqCst), 1);
    // Admitted when the other process releases: woken by the release, not by the periodic re-check.
    let waiter = {
        let two = two.clone();
        tokio::spawn(async move {
            let started = Instant::now();
            let permit = two.acquire("model", wait(10_000)).await;
            (permit, started.elapsed())
        })
    };
    // Released as soon as it waits, maybe before its subscription is in force: it asks the store only
    // once releases are heard, so it sees this one either way.
    waiting(&two, 1).await;
    drop(held);
    let (permit, waited) = waiter.await.unwrap();
    let permit = permit.unwrap();
    assert!(
        waited < RECHECK,
        "woken after {waited:?}: by the re-check, not the release"
    );
    assert_eq!(one.status("model").await.unwrap().in_flight, 1);
    drop(permit);
}

#[tokio::test]
async fn memory_a_waiter_is_admitted_by_a_release_in_another_process_or_times_out() {
    let (a, b) = memory();
    a_waiter_is_admitted_by_a_release_in_another_process_or_times_out(a, b).await;
}

#[tokio::test]
async fn redis_a_waiter_is_admitted_by_a_release_in_another_process_or_times_out() {
    let (a, b, _server) = redis();
    a_waiter_is_admitted_by_a_release_in_another_process_or_times_out(a, b).await;
}

/// Waiters of one process are admitted in the order they came, a heavy one included.
async fn waiters_are_admitted_in_arrival_order<S: Wakeups>(a: S, b: S) {
    let (holder, queue) = (limiter(a, 3), limiter(b, 3));
    let held = holder
        .try_acquire_with("model", AcquireOptions::new().weight(3))
        .await
        .unwrap();
    let order = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for n in 0..6u64 {
        // The second waits for all three slots: those behind it (weight 1) must not overtake it.
        let weight = if n == 1 { 3 } else { 1 };
        let (waiter, order) = (queue.clone(), order.clone());
        tasks.push(tokio::spawn(async move {
            let options = wait(10_000).weight(weight);
            let permit = waiter.acquire("model", options).await.unwrap();
            order.lock().unwrap().push(n);
            tokio::time::sleep(Duration::from_millis(20)).await;
            drop(permit);
        }));
        waiting(&queue, n + 1).await;
    }
    drop(held);
    for task in tasks {
        task.await.unwrap();
    }
    assert_eq!(*order.lock().unwrap(), vec![0, 1, 2, 3, 4, 5]);
    assert_eq!(queue.status("model").await.unwrap().in_flight, 0);
}

#[tokio::test]
async fn dify_a_waiter_is_admitted_by_a_release_in_another_process_or_times_out() {
    let (a, b, _server) = dify();
    a_waiter_is_admitted_by_a_release_in_another_process_or_times_out(a, b).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dify_dropped_waiters_hold_nothing() {
    let (a, b, _server) = dify();
    dropped_waiters_hold_nothing(a, b).await;
}

#[tokio::test]
async fn memory_waiters_are_admitted_in_arrival_order() {
    let (a, b) = memory();
    waiters_are_admitted_in_arrival_order(a, b).await;
}

#[tokio::test]
async fn redis_waiters_are_admitted_in_arrival_order() {
    let (a, b, _server) = redis();
    waiters_are_admitted_in_arrival_order(a, b).await;
}

/// Past the cap of waiters on a key, an admission is refused at once.
async fn the_waiters_of_a_key_are_bounded<S: Wakeups>(store: S) {
    let limiter = Limiter::builder(store)
        .policy(Policy::new(1, 0))
        .max_waiters(2)
        .build();
    let held = limiter.try_acquire("model").await.unwrap();
    let mut tasks = Vec::new();
    for n in 1..=2 {
        let waiter = limiter.clone();
        tasks.push(tokio::spawn(async move {
            waiter.acquire("model", wait(10_000)).await.map(drop)
        }));
        waiting(&limiter, n).await;
    }
    let refused = limiter.acquire("model", wait(10_000)).await.unwrap_err();
    assert!(matches!(refused, AcquireError::Full { .. }), "{refused:?}");
    assert_eq!(
        limiter.stats().waiting.load(Ordering::SeqCst),
        2,
        "both still wait"
    );
    drop(held);
    for task in tasks {
        task.await.unwrap().unwrap();
    }
}

#[tokio::test]
async fn memory_the_waiters_of_a_key_are_bounded() {
    the_waiters_of_a_key_are_bounded(MemoryStore::new()).await;
}

#[tokio::test]
async fn redis_the_waiters_of_a_key_are_bounded() {
    let (store, _, _server) = redis();
    the_waiters_of_a_key_are_bounded(store).await;
}

/// Waiting futures dropped at random moments (while queued, while the head asks the store) leave
/// nothing held and nobody queued; the others are all admitted in the end.
async fn dropped_waiters_hold_nothing<S: Wakeups>(a: S, b: S) {
    let (holder, queue) = (limiter(a, 2), limiter(b, 2));
    let admitted = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for n in 0..40u64 {
        let (queue, admitted) = (queue.clone(), admitted.clone());
        tasks.push(tokio::spawn(async move {
            // Every third waits to the end; the others are dropped after 1..25 ms.
            let give_up = if n % 3 == 0 { 60_000 } else { 1 + (n * 7) % 25 };
            let attempt = queue.acquire("model", wait(30_000));
            if let Ok(Ok(permit)) =
                tokio::time::timeout(Duration::from_millis(give_up), attempt).await
            {
                admitted.fetch_add(1, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(2)).await;
                drop(permit);
            }
        }));
    }
    // Holders come and go meanwhile, freeing slots at random.
    for _ in 0..30 {
        if let Ok(permit) = holder.try_acquire("model").await {
            tokio::time::sleep(Duration::from_millis(3)).await;
            drop(permit);
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    for task in tasks {
        task.await.unwrap();
    }
    assert!(
        admitted.load(Ordering::SeqCst) >= 14,
        "every patient waiter got in"
    );
    assert_eq!(queue.stats().waiting.load(Ordering::SeqCst), 0);
    for _ in 0..200 {
        if queue.status("model").await.unwrap().in_flight == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(
        queue.status("model").await.unwrap().in_flight,
        0,
        "nothing held"
    );
    // The queue is empty: a newcomer is admitted at once, twice.
    let (x, y) = (
        queue.acquire("model", wait(100)).await,
        queue.acquire("model", wait(100)).await,
    );
    assert!(x.is_ok() && y.is_ok());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_dropped_waiters_hold_nothing() {
    let (a, b) = memory();
    dropped_waiters_hold_nothing(a, b).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_dropped_waiters_hold_nothing() {
    let (a, b, _server) = redis();
    dropped_waiters_hold_nothing(a, b).await;
}

#[tokio::test]
async fn a_waiter_whose_subscription_was_killed_is_admitted_by_the_recheck() {
    let (a, b, server) = redis();
    let (one, two) = (limiter(a, 1), limiter(b, 1));
    let held = one.try_acquire("model").await.unwrap();
    let waiter = {
        let two = two.clone();
        tokio::spawn(async move { two.acquire("model", wait(10_000)).await })
    };
    waiting(&two, 1).await;
    tokio::time::sleep(Duration::from_millis(100)).await; // subscribed by now
    let killed: i64 = redis::cmd("CLIENT")
        .arg("KILL")
        .arg("TYPE")
        .arg("pubsub")
        .query(&mut server.client())
        .unwrap();
    assert!(killed >= 1, "the waiter's subscription was there to kill");
    drop(held);
    let permit = waiter.await.unwrap().unwrap();
    assert_eq!(one.status("model").await.unwrap().in_flight, 1);
    drop(permit);
}

/// A limit raised while an admission waits admits it at once, not at its next re-check: an override
/// (the store tells its waiters, on Redis every process's) or a new policy (a reload). On a paused
/// clock, which moves only when every task waits: a waiter that is not woken waits until RECHECK.
async fn a_raised_limit_admits_a_waiter_at_once(raise: impl AsyncFnOnce(&Limiter<MemoryStore>)) {
    let limiter = limiter(MemoryStore::new(), 1);
    let held = limiter.try_acquire("model").await.unwrap();
    let started = tokio::time::Instant::now();
    let waiter = {
        let limiter = limiter.clone();
        tokio::spawn(async move { limiter.acquire("model", wait(30_000)).await })
    };
    waiting(&limiter, 1).await;
    raise(&limiter).await;
    let permit = waiter.await.unwrap().unwrap();
    assert!(
        started.elapsed() < RECHECK,
        "admitted after {:?}, at a re-check",
        started.elapsed()
    );
    drop((held, permit));
}

#[tokio::test(start_paused = true)]
async fn memory_a_raised_override_admits_a_waiter_at_once() {
    a_raised_limit_admits_a_waiter_at_once(async |limiter: &Limiter<MemoryStore>| {
        limiter.set_limit("model", 2).await.unwrap();
    })
    .await;
}

#[tokio::test(start_paused = true)]
async fn memory_a_new_policy_admits_a_waiter_at_once() {
    a_raised_limit_admits_a_waiter_at_once(async |limiter: &Limiter<MemoryStore>| {
        limiter.set_policy(Policy::new(2, 0));
    })
    .await;
}
