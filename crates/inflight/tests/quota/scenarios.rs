//! The settlement matrix, each scenario run on every store (main.rs instantiates them).

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use inflight::quota::{CommitOn, Fund, Quota, QuotaError, RunError, Settle, Settlement};
use inflight::{AcquireError, PermitId, QuotaStore, Store};

use crate::{Fixture, TTL};

/// The key's (balance, reserved).
pub async fn figures<S: Store + QuotaStore>(quota: &Quota<S>, key: &str) -> (u64, u64) {
    let balance = quota.balance(key).await.unwrap().expect("metered");
    (balance.balance, balance.reserved)
}

/// Waits (at most 2 s) until the key's figures are `want`: a settlement in the background has landed.
/// On the memory store it has landed before the drop that started it returned.
pub async fn settles_to<F: Fixture>(f: &F, quota: &Quota<F::S>, key: &str, want: (u64, u64)) {
    let started = Instant::now();
    loop {
        let now = figures(quota, key).await;
        if now == want {
            return;
        }
        assert!(
            !f.settles_in_place() && started.elapsed() < Duration::from_secs(2),
            "{key} stayed at {now:?}, not {want:?}"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Waits (at most 2 s) until nothing is in flight on `key`: a Redis store releases a dropped permit in
/// the background, in a batch that a later status read may overtake.
async fn released<S: Store>(limiter: &inflight::Limiter<S>, key: &str) {
    let started = Instant::now();
    while limiter.status(key).await.unwrap().in_flight > 0 {
        assert!(
            started.elapsed() < Duration::from_secs(2),
            "{key}: slot not back"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

fn ok() -> std::future::Ready<Result<&'static str, &'static str>> {
    std::future::ready(Ok("done"))
}

pub async fn an_exhausted_quota_is_refused_before_any_admission<F: Fixture>(f: F) {
    let (quota, limiter) = (f.quota(), f.limiter(5));
    quota.fund("tenant:t1", Fund::Set(1)).await.unwrap();
    let polled = AtomicBool::new(false);
    let admit = async {
        polled.store(true, Ordering::SeqCst);
        limiter.try_acquire("app:a1").await
    };
    let refused = quota.run("tenant:t1", 2, admit, ok()).await;
    match refused {
        Err(RunError::Quota(QuotaError::Exhausted { balance, amount })) => {
            assert_eq!((balance, amount), (1, 2));
        }
        other => panic!("expected an exhausted quota, got {other:?}"),
    }
    assert!(!polled.load(Ordering::SeqCst), "no admission was attempted");
    assert_eq!(limiter.status("app:a1").await.unwrap().in_flight, 0);
    assert_eq!(figures(&quota, "tenant:t1").await, (1, 0), "nothing taken");
}

pub async fn a_refused_admission_is_refunded<F: Fixture>(f: F) {
    let (quota, limiter) = (f.quota(), f.limiter(1));
    quota.fund("tenant:t1", Fund::Set(5)).await.unwrap();
    let holder = limiter.try_acquire("app:a1").await.unwrap();
    let refused = quota
        .run("tenant:t1", 2, limiter.try_acquire("app:a1"), ok())
        .await;
    assert!(
        matches!(refused, Err(RunError::Refused(AcquireError::Full { .. }))),
        "{refused:?}"
    );
    assert_eq!(
        figures(&quota, "tenant:t1").await,
        (5, 0),
        "back before run returned"
    );
    assert_eq!(quota.stats().refunded.load(Ordering::SeqCst), 1);
    drop(holder);
}

pub async fn work_that_fails_is_refunded<F: Fixture>(f: F) {
    let (quota, limiter) = (f.quota(), f.limiter(1));
    quota.fund("tenant:t1", Fund::Set(5)).await.unwrap();
    let work = async {
        assert_eq!(
            figures(&quota, "tenant:t1").await,
            (3, 2),
            "reserved while it runs"
        );
        Err::<(), _>("upstream failed")
    };
    let failed = quota
        .run("tenant:t1", 2, limiter.try_acquire("app:a1"), work)
        .await;
    assert!(matches!(failed, Err(RunError::Work("upstream failed"))));
    assert_eq!(figures(&quota, "tenant:t1").await, (5, 0));
    released(&limiter, "app:a1").await;
}

pub async fn work_that_succeeds_is_committed<F: Fixture>(f: F) {
    let (quota, limiter) = (f.quota(), f.limiter(1));
    quota.fund("tenant:t1", Fund::Set(5)).await.unwrap();
    let work = async {
        let in_flight = limiter.status("app:a1").await.unwrap().in_flight;
        assert_eq!(in_flight, 1, "admitted before the work runs");
        Ok::<_, ()>(in_flight)
    };
    let done = quota
        .run("tenant:t1", 2, limiter.try_acquire("app:a1"), work)
        .await;
    assert_eq!(done.unwrap(), 1);
    assert_eq!(figures(&quota, "tenant:t1").await, (3, 0), "spent");
    assert_eq!(quota.stats().committed.load(Ordering::SeqCst), 1);
    released(&limiter, "app:a1").await;
}

pub async fn work_whose_future_is_dropped_is_refunded<F: Fixture>(f: F) {
    let (quota, limiter) = (f.quota(), f.limiter(1));
    quota.fund("tenant:t1", Fund::Set(5)).await.unwrap();
    let (started, running) = tokio::sync::oneshot::channel();
    let work = async {
        let _ = started.send(());
        std::future::pending::<Result<(), ()>>().await
    };
    let mut run = Box::pin(quota.run("tenant:t1", 2, limiter.try_acquire("app:a1"), work));
    tokio::select! {
        _ = &mut run => panic!("the work never ends"),
        _ = running => {}
    }
    assert_eq!(figures(&quota, "tenant:t1").await, (3, 2));
    drop(run); // the client went away
    settles_to(&f, &quota, "tenant:t1", (5, 0)).await;
}

pub async fn work_that_panics_is_refunded<F: Fixture>(f: F) {
    let (quota, limiter) = (f.quota(), f.limiter(1));
    quota.fund("tenant:t1", Fund::Set(5)).await.unwrap();
    let (q, l) = (quota.clone(), limiter.clone());
    let task = tokio::spawn(async move {
        let work = async {
            assert_eq!(figures(&q, "tenant:t1").await, (3, 2));
            if q.ttl() > Duration::ZERO {
                panic!("the work panics");
            }
            Ok::<_, ()>(())
        };
        q.run("tenant:t1", 2, l.try_acquire("app:a1"), work).await
    });
    assert!(task.await.unwrap_err().is_panic());
    settles_to(&f, &quota, "tenant:t1", (5, 0)).await;
    released(&limiter, "app:a1").await;
}

pub async fn an_abandoned_reservation_is_refunded_once_its_ttl_passes<F: Fixture>(f: F) {
    let quota = f.quota();
    quota.fund("tenant:t1", Fund::Set(5)).await.unwrap();
    // Handed off and never settled: its holder crashed.
    let lost = quota.reserve("tenant:t1", 3).await.unwrap().detach();
    assert!(lost.expires_at_ms > 0);
    // (A second short of it: Redis's clock moves on by itself too.)
    f.advance(TTL - Duration::from_secs(1));
    assert_eq!(
        figures(&quota, "tenant:t1").await,
        (2, 3),
        "held until its ttl"
    );
    f.advance(Duration::from_secs(1));
    let balance = quota.balance("tenant:t1").await.unwrap().unwrap();
    assert_eq!(
        (balance.balance, balance.reserved, balance.expired),
        (5, 0, 1)
    );
    assert_eq!(quota.stats().expired.load(Ordering::SeqCst), 1);
    for settle in [Settle::Commit, Settle::Refund] {
        let late = quota.settle("tenant:t1", &lost.id, settle).await.unwrap();
        assert!(!late.is_found(), "{settle:?} after it expired: {late:?}");
    }
    assert_eq!(figures(&quota, "tenant:t1").await, (5, 0), "refunded once");
}

pub async fn settling_again_is_a_no_op_that_says_so<F: Fixture>(f: F) {
    let quota = f.quota();
    quota.fund("tenant:t1", Fund::Set(10)).await.unwrap();
    let key = "tenant:t1";
    let spent = quota.reserve(key, 2).await.unwrap();
    let id = spent.id().clone();
    assert!(matches!(spent.commit().await.unwrap(), Settlement::Settled(b) if b.balance == 8));
    let again = quota.settle(key, &id, Settle::Commit).await.unwrap();
    assert!(matches!(again, Settlement::Already(_)), "{again:?}");
    let refund = quota.settle(key, &id, Settle::Refund).await.unwrap();
    assert!(
        matches!(refund, Settlement::NotFound(Some(_))),
        "{refund:?}"
    );
    assert_eq!(
        figures(&quota, key).await,
        (8, 0),
        "a refund after the commit gave nothing"
    );

    let back = quota.reserve(key, 3).await.unwrap();
    let id = back.id().clone();
    assert!(matches!(back.refund().await.unwrap(), Settlement::Settled(b) if b.balance == 8));
    let again = quota.settle(key, &id, Settle::Refund).await.unwrap();
    assert!(matches!(again, Settlement::Already(_)), "{again:?}");
    let commit = quota.settle(key, &id, Settle::Commit).await.unwrap();
    assert!(!commit.is_found(), "{commit:?}");
    assert_eq!(
        figures(&quota, key).await,
        (8, 0),
        "a commit after the refund spent nothing"
    );
    let never = quota
        .settle(key, &PermitId::from("never-made"), Settle::Commit)
        .await;
    assert!(!never.unwrap().is_found());
}

pub async fn an_open_id_is_reserved_once_and_a_settled_one_not_again<F: Fixture>(f: F) {
    let quota = f.quota();
    quota.fund("tenant:t1", Fund::Set(10)).await.unwrap();
    let id = PermitId::from("req-1");
    let first = quota
        .reserve_with("tenant:t1", 4, Some(id.clone()), None)
        .await
        .unwrap();
    f.advance(Duration::from_secs(1));
    // A retry of the same call: the same reservation, its deadline moved, nothing taken twice.
    let retried = quota
        .reserve_with("tenant:t1", 4, Some(id.clone()), None)
        .await
        .unwrap();
    assert_eq!(figures(&quota, "tenant:t1").await, (6, 4));
    // (Redis's clock moves on by itself too.)
    assert!(retried.expires_at_ms() >= first.expires_at_ms() + 1_000);
    let first = first.detach();
    retried.commit().await.unwrap();
    assert_eq!(figures(&quota, "tenant:t1").await, (6, 0));
    let reused = quota
        .reserve_with("tenant:t1", 4, Some(first.id), None)
        .await;
    assert!(matches!(reused, Err(QuotaError::Settled)), "{reused:?}");
    assert_eq!(figures(&quota, "tenant:t1").await, (6, 0));
}

pub async fn committing_on_admission_charges_work_that_fails<F: Fixture>(f: F) {
    let quota = f.quota().with_commit_on(CommitOn::Admission);
    let limiter = f.limiter(1);
    quota.fund("tenant:t1", Fund::Set(5)).await.unwrap();
    let work = async {
        assert_eq!(
            figures(&quota, "tenant:t1").await,
            (4, 0),
            "spent at admission"
        );
        Err::<(), _>("failed")
    };
    let failed = quota
        .run("tenant:t1", 1, limiter.try_acquire("app:a1"), work)
        .await;
    assert!(matches!(failed, Err(RunError::Work("failed"))));
    assert_eq!(figures(&quota, "tenant:t1").await, (4, 0), "still spent");
    // A refused admission is never charged, whenever the commit comes.
    let holder = limiter.try_acquire("app:a1").await.unwrap();
    let refused = quota
        .run("tenant:t1", 1, limiter.try_acquire("app:a1"), ok())
        .await;
    assert!(matches!(refused, Err(RunError::Refused(_))));
    assert_eq!(figures(&quota, "tenant:t1").await, (4, 0));
    drop(holder);
}

pub async fn an_unmetered_key_records_nothing<F: Fixture>(f: F) {
    let (quota, limiter) = (f.quota(), f.limiter(1));
    assert_eq!(quota.balance("free:f1").await.unwrap(), None);
    let reservation = quota.reserve("free:f1", 1_000).await.unwrap();
    assert!(!reservation.is_metered());
    assert_eq!(reservation.expires_at_ms(), 0);
    assert!(!reservation.commit().await.unwrap().is_found());
    let done = quota
        .run("free:f1", 7, limiter.try_acquire("app:a1"), ok())
        .await;
    assert_eq!(done.unwrap(), "done");
    assert_eq!(
        quota.balance("free:f1").await.unwrap(),
        None,
        "still unmetered"
    );
}

/// A reservation dropped where no Tokio runtime runs (a plain thread, a sync caller) is refunded by its
/// quota's limiter, as a permit dropped there is released; before, it stayed reserved for a whole ttl.
pub async fn a_reservation_dropped_off_the_runtime_is_refunded<F: Fixture>(f: F) {
    let quota = f.quota();
    quota.fund("tenant:t1", Fund::Set(5)).await.unwrap();
    let reservation = quota.reserve("tenant:t1", 2).await.unwrap();
    assert_eq!(figures(&quota, "tenant:t1").await, (3, 2));
    std::thread::spawn(move || drop(reservation))
        .join()
        .unwrap();
    let started = Instant::now();
    while figures(&quota, "tenant:t1").await != (5, 0) {
        assert!(started.elapsed() < Duration::from_secs(5), "never refunded");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// A commit whose future is dropped before it is polled (a body that ended as its task went away) is
/// finished in the background: the amount is spent, not left reserved.
pub async fn a_commit_dropped_unpolled_is_finished_in_the_background<F: Fixture>(f: F) {
    let quota = f.quota();
    quota.fund("tenant:t1", Fund::Set(5)).await.unwrap();
    let reservation = quota.reserve("tenant:t1", 2).await.unwrap();
    drop(reservation.commit());
    settles_to(&f, &quota, "tenant:t1", (3, 0)).await;
}
