//! Redis down, restarted empty, paused or stalled: what each failure policy does meanwhile, and how
//! soon admissions work again.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use inflight::store::OverrideChange;
use inflight::{
    AcquireError, ClassLimits, FailurePolicy, Limiter, Policy, RedisStore, RemoteLease, Store,
};

use crate::support::TestRedis;
use crate::timing_sensitive;

fn limiter_for(redis: &TestRedis, failure: FailurePolicy) -> Limiter<RedisStore> {
    Limiter::builder(redis.store())
        .policy(Policy::new(2, 0))
        .lease(Duration::from_millis(900))
        .on_store_failure(failure)
        .build()
}

/// Waits until an admission works again after Redis came back; returns how long it took.
async fn recovery_time(limiter: &Limiter<RedisStore>, key: &str) -> Duration {
    let back = Instant::now();
    loop {
        if let Ok(permit) = limiter.try_acquire(key).await {
            if permit.is_counted() {
                return back.elapsed();
            }
        }
        assert!(back.elapsed() < Duration::from_secs(5), "no recovery");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fail_closed_refuses_while_redis_is_down_and_heals_after() {
    let _machine = timing_sensitive().await;
    let mut redis = TestRedis::start();
    let limiter = limiter_for(&redis, FailurePolicy::FailClosed);
    let held = limiter.try_acquire("app").await.unwrap();
    redis.stop();
    for _ in 0..5 {
        match limiter.try_acquire("app").await {
            Err(AcquireError::Store(e)) => assert!(e.is_transient(), "{e}"),
            other => panic!("expected a store error, got {other:?}"),
        }
    }
    drop(held); // its release fails now and is retried in the background
    redis.restart();
    let took = recovery_time(&limiter, "other").await;
    eprintln!("admissions work again {took:?} after Redis came back");
    assert!(took < Duration::from_secs(1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn live_permits_are_re_registered_after_redis_restarts_empty() {
    let _machine = timing_sensitive().await;
    let mut redis = TestRedis::start();
    let limiter = limiter_for(&redis, FailurePolicy::FailClosed);
    let permit = limiter.try_acquire("app").await.unwrap();
    redis.restart(); // empty
    let back = Instant::now();
    // The renewer counts the re-addition once Redis has answered it: the status may see it first.
    let readded = || limiter.stats().readded.load(Ordering::Relaxed) >= 1;
    loop {
        let in_flight = limiter
            .status("app")
            .await
            .map(|s| s.in_flight)
            .unwrap_or(0);
        if in_flight == 1 && readded() {
            break;
        }
        // (A bound on waiting, not a figure: renewals come every 300 ms; a busy machine may delay some.)
        assert!(
            back.elapsed() < Duration::from_secs(5),
            "the renewal did not re-add the lease"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    eprintln!(
        "live permit re-registered {:?} after the restart",
        back.elapsed()
    );
    assert!(!permit.is_lost());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fail_open_admits_uncounted_while_redis_is_down() {
    let _machine = timing_sensitive().await;
    let mut redis = TestRedis::start();
    let limiter = limiter_for(&redis, FailurePolicy::FailOpen);
    redis.stop();
    for _ in 0..10 {
        let permit = limiter.try_acquire("app").await.expect("fail open");
        assert!(!permit.is_counted());
    }
    redis.restart();
    let took = recovery_time(&limiter, "app").await;
    assert!(took < Duration::from_secs(1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fail_open_local_admits_under_a_per_process_cap_while_redis_is_down() {
    let _machine = timing_sensitive().await;
    let mut redis = TestRedis::start();
    let limiter = limiter_for(&redis, FailurePolicy::FailOpenLocal { limit: 3 });
    redis.stop();
    let mut held = Vec::new();
    for _ in 0..3 {
        held.push(
            limiter
                .try_acquire("app")
                .await
                .expect("under the local cap"),
        );
    }
    assert_eq!(
        limiter.try_acquire("app").await.unwrap_err(),
        AcquireError::Full {
            limit: 3,
            in_flight: 3
        }
    );
    drop(held.pop());
    held.push(
        limiter
            .try_acquire("app")
            .await
            .expect("a local slot came back"),
    );
    // Handed-off permits (what the HTTP API gives out) count against the cap too, until released.
    held.clear();
    let mut leases = Vec::new();
    for _ in 0..3 {
        leases.push(
            limiter
                .try_acquire("handed")
                .await
                .expect("under the cap")
                .detach(),
        );
    }
    assert!(limiter.try_acquire("handed").await.unwrap_err().is_full());
    let handed = RemoteLease::new(&["handed"], leases[0].id.clone(), leases[0].token);
    let released = limiter.release(&handed).await;
    assert!(released.expect("released from the fallback").0);
    let again = limiter
        .try_acquire("handed")
        .await
        .expect("a slot came back");
    drop(again);
    redis.restart();
    let took = recovery_time(&limiter, "app").await;
    assert!(took < Duration::from_secs(1));
}

/// A server's workers each have a limiter and a store of their own; the fail_open_local cap is still one
/// per process, because they share its fallback store.
#[tokio::test]
async fn limiters_that_share_a_fallback_share_the_fail_open_local_cap() {
    let mut redis = TestRedis::start();
    let fallback = inflight::MemoryStore::new();
    let worker = || {
        Limiter::builder(redis.store())
            .policy(Policy::new(5, 0))
            .on_store_failure(FailurePolicy::FailOpenLocal { limit: 2 })
            .fallback(fallback.clone())
            .build()
    };
    let (one, two) = (worker(), worker());
    redis.stop();
    let _a = one.try_acquire("app").await.expect("under the cap");
    let _b = two.try_acquire("app").await.expect("under the cap");
    assert!(one.try_acquire("app").await.unwrap_err().is_full());
    assert!(two.try_acquire("app").await.unwrap_err().is_full());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_explicit_release_cut_short_goes_on_in_the_background() {
    let _machine = timing_sensitive().await;
    let mut redis = TestRedis::start();
    let limiter = Limiter::builder(redis.store())
        .policy(Policy::new(1, 0))
        .build();
    let permit = limiter.try_acquire("app").await.unwrap();
    redis.stop();
    // The caller gives up on the release (a timeout around it), while Redis is away.
    let _ = tokio::time::timeout(Duration::from_millis(50), permit.release()).await;
    redis.restart();
    let started = Instant::now();
    while limiter
        .status("app")
        .await
        .map(|s| s.in_flight)
        .unwrap_or(1)
        != 0
    {
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "the release was not carried on"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// After Redis restarts, the connection the store had is dead; the first admission finds out by writing
/// to it. It must not answer 503 for that: it tries once more on the connection made anew.
#[tokio::test]
async fn the_first_admission_after_redis_restarts_does_not_fail_on_the_dead_connection() {
    let mut redis = TestRedis::start();
    let limiter = Limiter::builder(redis.store())
        .policy(Policy::new(2, 0))
        .on_store_failure(FailurePolicy::FailClosed)
        .build();
    limiter
        .try_acquire("k")
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    redis.restart();
    let admitted = limiter.try_acquire("k").await;
    assert!(admitted.is_ok(), "{admitted:?}");
    assert_eq!(limiter.status("k").await.unwrap().in_flight, 1);
}

#[tokio::test]
async fn the_store_connects_lazily_and_a_dead_server_is_a_transient_error() {
    let mut redis = TestRedis::start();
    let store = redis.store();
    redis.stop();
    let started = Instant::now();
    let err = store.maintain().await.unwrap_err();
    assert!(err.is_transient(), "{err}");
    assert!(started.elapsed() < Duration::from_secs(2));
    let status = store
        .status("k", ClassLimits::new(1, 0), OverrideChange::Keep)
        .await;
    assert!(status.is_err());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_admission_given_up_while_redis_decides_leaves_no_lease() {
    let redis = TestRedis::start();
    let limiter = Limiter::builder(redis.store())
        .policy(Policy::new(1, 0))
        .build();
    // Connected, and the scripts loaded.
    limiter
        .try_acquire("k")
        .await
        .unwrap()
        .release()
        .await
        .unwrap();

    // Redis holds every command for a while: the admission is sent, then its caller gives up.
    redis::cmd("CLIENT")
        .arg("PAUSE")
        .arg(300)
        .arg("ALL")
        .exec(&mut redis.client())
        .unwrap();
    let gave_up = tokio::time::timeout(Duration::from_millis(50), limiter.try_acquire("k")).await;
    assert!(
        gave_up.is_err(),
        "the admission was still waiting for Redis"
    );
    // Once Redis goes on, it admits, and the release queued behind the admission takes the lease back.
    tokio::time::sleep(Duration::from_millis(600)).await;
    let status = limiter.status("k").await.unwrap();
    assert_eq!(status.in_flight, 0, "the abandoned admission holds a slot");
    let permit = limiter.try_acquire("k").await.expect("the slot is free");
    permit.release().await.unwrap();
}

/// An admission that timed out may still be made by Redis once it goes on: its lease must not be left
/// holding a slot that nobody holds.
#[tokio::test]
async fn an_admission_that_timed_out_leaves_no_lease_when_redis_makes_it_late() {
    let redis = TestRedis::start();
    let store = redis
        .store_builder()
        .response_timeout(Duration::from_millis(100))
        .open()
        .unwrap();
    let limiter = Limiter::builder(store)
        .policy(Policy::new(1, 0))
        .lease(Duration::from_secs(60))
        .build();
    // Connected, and the scripts loaded.
    limiter
        .try_acquire("k")
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    // Redis stops for 400 ms (SIGSTOP), as a server stalled by a slow disk or a long command would.
    let info: String = redis::cmd("INFO")
        .arg("server")
        .query(&mut redis.client())
        .unwrap();
    let pid = info
        .lines()
        .find_map(|line| line.strip_prefix("process_id:"))
        .unwrap()
        .trim()
        .to_owned();
    let signal = |name: &str| {
        let status = std::process::Command::new("kill")
            .arg(name)
            .arg(&pid)
            .status();
        assert!(status.unwrap().success());
    };
    signal("-STOP");
    let resume = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(400));
        std::process::Command::new("kill")
            .arg("-CONT")
            .arg(&pid)
            .status()
            .unwrap();
    });
    let timed_out = limiter.try_acquire("k").await.unwrap_err();
    resume.join().unwrap();
    assert!(
        matches!(timed_out, inflight::AcquireError::Store(_)),
        "{timed_out:?}"
    );
    // Redis goes on, makes the admission, and then takes the release retried behind it.
    let started = Instant::now();
    loop {
        tokio::time::sleep(Duration::from_millis(100)).await;
        if let Ok(status) = limiter.status("k").await {
            if status.in_flight == 0 && started.elapsed() > Duration::from_millis(600) {
                break;
            }
        }
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "the late admission holds a slot"
        );
    }
}
