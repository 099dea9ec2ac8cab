//! What only the memory store can show: calls counted, idle keys forgotten.

use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use inflight::store::{
    AcquireRequest, Admission, IndexOp, KeyStatus, LocalAdmission, OverrideChange, Recorded,
    RenewRequest, Renewal,
};
use inflight::{
    AcquireError, AcquireOptions, ClassLimits, FailurePolicy, Limiter, ManualClock, MemoryStore,
    PermitId, Policy, RemoteLease, Store, StoreError, Wakeups,
};

/// A memory store that counts the calls that would be I/O in a remote store, fails the first `failures`
/// releases as a store that is briefly away would, loses the answers of the next `lost` admissions (made
/// all the same, as a timed-out call's), and, unless `local`, has no in-process fast path; `gated`, its
/// renewals wait for `gate` (and say so on `entered`), as a slow store's would, and so does the next
/// release after `gate_release` is set (saying on `passed` when it is done).
#[derive(Clone, Default)]
struct Double {
    inner: MemoryStore,
    calls: Arc<AtomicUsize>,
    failures: Arc<AtomicUsize>,
    lost: Arc<AtomicUsize>,
    local: bool,
    gated: bool,
    gate_release: Arc<std::sync::atomic::AtomicBool>,
    gate: Arc<tokio::sync::Notify>,
    entered: Arc<tokio::sync::Notify>,
    passed: Arc<tokio::sync::Notify>,
}

impl Double {
    fn calls(&self) -> usize {
        self.calls.load(Ordering::SeqCst)
    }

    fn count(&self) {
        self.calls.fetch_add(1, Ordering::SeqCst);
    }
}

impl Store for Double {
    async fn acquire(&self, req: AcquireRequest<'_>) -> Result<Admission, StoreError> {
        self.count();
        let answer = self.inner.acquire(req).await;
        let lost = (self.lost)
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok();
        match lost {
            true => Err(StoreError::Unavailable("the answer was lost".into())),
            false => answer,
        }
    }
    async fn release(
        &self,
        keys: &[Arc<str>],
        id: &PermitId,
        token: u64,
    ) -> Result<bool, StoreError> {
        self.count();
        let failed = self
            .failures
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok();
        if failed {
            return Err(StoreError::Unavailable("briefly away".into()));
        }
        if self.gate_release.swap(false, Ordering::SeqCst) {
            self.entered.notify_one();
            self.gate.notified().await;
            let released = self.inner.release(keys, id, token).await;
            self.passed.notify_one();
            return released;
        }
        self.inner.release(keys, id, token).await
    }
    async fn renew(&self, batch: &[RenewRequest]) -> Result<Vec<Renewal>, StoreError> {
        self.count();
        if self.gated {
            self.entered.notify_one();
            self.gate.notified().await;
        }
        self.inner.renew(batch).await
    }
    fn status(
        &self,
        key: &str,
        limits: ClassLimits,
        change: OverrideChange,
    ) -> impl Future<Output = Result<KeyStatus, StoreError>> + Send {
        self.count();
        self.inner.status(key, limits, change)
    }
    fn hold(
        &self,
        keys: &[&str],
        limits: &[ClassLimits],
        weight: u32,
        given_id: bool,
    ) -> Option<LocalAdmission> {
        self.local
            .then(|| self.inner.hold(keys, limits, weight, given_id))
            .flatten()
    }
    fn index(
        &self,
        id: &PermitId,
        op: IndexOp<'_>,
    ) -> impl Future<Output = Result<Option<Recorded>, StoreError>> + Send {
        self.count();
        self.inner.index(id, op)
    }
}

impl Wakeups for Double {
    fn ticket(&self) -> Option<inflight::store::Turn> {
        self.inner.ticket()
    }
    fn leave(
        &self,
        keys: &[Arc<str>],
        ticket: &str,
        handed: Option<&PermitId>,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send {
        self.inner.leave(keys, ticket, handed)
    }
}

/// A [`Double`] whose renewals wait at its gate, and a limiter of limit 1 on it.
fn gated() -> (Double, Limiter<Double>) {
    let store = Double {
        gated: true,
        ..Double::default()
    };
    let limiter = Limiter::builder(store.clone()).policy(Policy::new(1, 0));
    (store, limiter.build())
}

/// Waits (up to 5 s) until `key` has `want` in flight in `limiter`'s store.
async fn settle<S: Store>(limiter: &Limiter<S>, key: &str, want: u32) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while limiter.status(key).await.unwrap().in_flight != want {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{key} never got to {want}"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// A permit detached while its renewal is on its way keeps its lease for whoever holds the detached lease:
/// the renewal's answer does not release it (it did: detaching marked the permit released, as a release
/// does, and a renewal that answers after a release gives the lease back).
#[tokio::test]
async fn a_permit_detached_while_its_renewal_is_on_its_way_keeps_its_lease() {
    let (store, limiter) = gated();
    let permit = limiter.try_acquire("app").await.unwrap();
    let renewing = {
        let limiter = limiter.clone();
        tokio::spawn(async move { limiter.renew_now().await })
    };
    store.entered.notified().await;
    let lease = permit.detach();
    store.gate.notify_one();
    renewing.await.unwrap();
    let status = store
        .inner
        .status("app", ClassLimits::new(1, 0), OverrideChange::Keep);
    assert_eq!(
        status.await.unwrap().in_flight,
        1,
        "still held for {lease:?}"
    );
}

/// A lease a release handed a waiter, detached and released by its new holder before the claim that
/// takes it to its own length arrives: the claim finds it gone and leaves it gone (a renewal re-adds a
/// lease it finds gone), and no lease is counted lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handed_lease_released_before_its_claim_stays_released() {
    let (store, limiter) = gated();
    let held = limiter.try_acquire("app").await.unwrap();
    let waiter = {
        let limiter = limiter.clone();
        let wait = AcquireOptions::new().max_wait(Duration::from_secs(60));
        tokio::spawn(async move { limiter.acquire("app", wait).await })
    };
    while limiter.stats().waiting.load(Ordering::SeqCst) == 0 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    held.release().await.unwrap();
    let handed = tokio::time::timeout(Duration::from_secs(30), waiter);
    let handed = handed.await.unwrap().unwrap().unwrap();
    store.entered.notified().await; // the claim, held at the gate
    let lease = handed.detach();
    let remote = RemoteLease::new(&[&lease.key], lease.id.clone(), lease.token);
    limiter.release(&remote).await.unwrap();
    settle(&limiter, "app", 0).await;
    store.gate.notify_one();
    for _ in 0..50 {
        tokio::time::sleep(Duration::from_millis(5)).await;
        assert_eq!(
            limiter.status("app").await.unwrap().in_flight,
            0,
            "not re-added"
        );
    }
    assert_eq!(limiter.stats().lost.load(Ordering::SeqCst), 0);
    assert_eq!(limiter.stats().readded.load(Ordering::SeqCst), 0);
}

/// A wait whose ask the store made but never answered (under `FailOpenLocal`, its fallback full) may
/// still see that ask decided under the wait's id, and its release by that id, sent when the answer was
/// lost, arrive late: the wait takes nothing more under that id (no slot handed to it), so the late
/// release frees no permit the waiter holds. Before, the waiter took the slot a release handed its id,
/// and the late release then freed it: the key counted 0 while the waiter held its permit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wait_whose_ask_went_unanswered_takes_nothing_more_under_its_id() {
    let store = Double::default();
    let limiter = Limiter::builder(store.clone())
        .policy(Policy::new(1, 0))
        .on_store_failure(FailurePolicy::FailOpenLocal { limit: 1 })
        .store_breaker(false)
        .build();
    let held = limiter.try_acquire("app").await.unwrap();
    // Admitted by the fallback (the store's answer lost), which is then full; its release by id is
    // settled at once.
    store.lost.store(1, Ordering::SeqCst);
    let calls = store.calls();
    let fallback = limiter.try_acquire("app").await.unwrap();
    for _ in 0..400 {
        if store.calls() >= calls + 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(
        store.calls(),
        calls + 2,
        "the fallback's lost admission released"
    );
    // The waiter's first ask: queued in the store, its answer lost, its release by id held at the gate.
    store.lost.store(1, Ordering::SeqCst);
    store.gate_release.store(true, Ordering::SeqCst);
    let waiter = {
        let limiter = limiter.clone();
        let wait = AcquireOptions::new().max_wait(Duration::from_secs(20));
        tokio::spawn(async move { limiter.acquire("app", wait).await })
    };
    store.entered.notified().await;
    held.release().await.unwrap();
    let permit = tokio::time::timeout(Duration::from_secs(30), waiter);
    let permit = permit.await.unwrap().unwrap().unwrap();
    store.gate.notify_one();
    store.passed.notified().await;
    assert_eq!(
        limiter.status("app").await.unwrap().in_flight,
        1,
        "the waiter's permit counted"
    );
    assert!(limiter.try_acquire("app").await.is_err(), "the key is full");
    drop((permit, fallback));
}

#[tokio::test]
async fn an_unlimited_key_is_admitted_without_any_store_io() {
    let store = Double {
        local: true,
        ..Double::default()
    };
    let limiter = Limiter::builder(store).policy(Policy::new(0, 0)).build();
    for _ in 0..1_000 {
        let permit = limiter.try_acquire("app").await.unwrap();
        assert!(!permit.is_counted());
        drop(permit);
    }
    let streamed = limiter.try_acquire("app").await.unwrap();
    drop(streamed.guard_stream(futures_util::stream::iter([1, 2])));
    limiter.renew_now().await;
    assert_eq!(limiter.store().calls(), 0);
    assert_eq!(limiter.store().inner.key_count(), 0, "not even a key made");

    // Once any key has an override, admissions look at their key again.
    limiter.set_limit("other", 2).await.unwrap();
    let _permit = limiter.try_acquire("app").await.unwrap();
    assert_eq!(limiter.store().inner.key_count(), 2);
}

#[tokio::test]
async fn a_remote_store_costs_one_call_per_acquire_and_one_per_release() {
    let limiter = Limiter::builder(Double::default())
        .policy(Policy::new(2, 0))
        .build();
    let permit = limiter.try_acquire("app").await.unwrap();
    assert_eq!(limiter.store().calls(), 1);
    drop(permit);
    // The release is started before the drop returns.
    assert_eq!(limiter.store().calls(), 2);
    // It freed the very lease the admission took.
    settle(&limiter, "app", 0).await;
}

#[tokio::test]
async fn a_dropped_permit_is_released_in_the_background_and_retried_while_the_store_is_away() {
    let store = Double::default();
    store.failures.store(2, Ordering::SeqCst);
    let limiter = Limiter::builder(store).policy(Policy::new(1, 0)).build();
    drop(limiter.try_acquire("app").await.unwrap());
    settle(&limiter, "app", 0).await;
    assert_eq!(
        limiter.store().failures.load(Ordering::SeqCst),
        0,
        "failed twice, then released"
    );
    // Nothing is left pending: shutdown has nothing to wait for.
    tokio::time::timeout(Duration::from_millis(100), limiter.release_leases())
        .await
        .expect("no release left pending");
}

#[tokio::test]
async fn permits_of_this_process_hold_their_slot_without_a_lease_until_dropped() {
    let clock = ManualClock::new(0);
    let store = MemoryStore::with_clock(clock.clone());
    let limiter = Limiter::builder(store.clone())
        .policy(Policy::new(1, 0))
        .lease(Duration::from_secs(1))
        .build();
    let permit = limiter.try_acquire("app").await.unwrap();
    assert_eq!(permit.expires_at_ms(), 0, "no lease to expire");
    assert_eq!(limiter.renewing(), 0, "nothing for the renewal task to do");
    clock.advance(Duration::from_secs(3_600));
    store.maintain().await.unwrap();
    assert!(
        limiter.try_acquire("app").await.unwrap_err().is_full(),
        "still held an hour later"
    );
    // Handing it off turns it into a lease that then expires like any other.
    let lease = permit.detach();
    assert_eq!(lease.expires_at_ms, 3_601_000);
    assert_eq!(limiter.status("app").await.unwrap().in_flight, 1);
    clock.advance(Duration::from_secs(1));
    let again = limiter
        .try_acquire("app")
        .await
        .expect("the detached lease expired");
    assert_eq!(again.in_flight(), 1);
    assert_eq!(limiter.stats().reclaimed.load(Ordering::Relaxed), 1);
}

#[tokio::test]
async fn idle_keys_are_forgotten_so_memory_stays_bounded() {
    let clock = ManualClock::new(0);
    let store = MemoryStore::with_clock(clock.clone()).idle_ttl(Duration::from_secs(10));
    let limiter = Limiter::builder(store).policy(Policy::new(1, 0)).build();
    for n in 0..10_000 {
        let permit = limiter.try_acquire(&format!("key-{n}")).await.unwrap();
        drop(permit);
    }
    // A key with a crashed holder and one with an override.
    let _ = limiter
        .try_acquire_with(
            "crashed",
            inflight::AcquireOptions::new().lease(Duration::from_secs(5)),
        )
        .await
        .unwrap()
        .detach();
    limiter.set_limit("configured", 3).await.unwrap();
    let store = limiter.store().clone();
    assert_eq!(store.key_count(), 10_002);
    store.maintain().await.unwrap();
    assert_eq!(store.key_count(), 10_002, "not idle long enough yet");
    clock.advance(Duration::from_secs(11));
    store.maintain().await.unwrap();
    assert_eq!(
        store.key_count(),
        1,
        "only the key with an override is kept"
    );
    assert_eq!(
        limiter.status("configured").await.unwrap().override_limit,
        Some(3)
    );
}

#[tokio::test(start_paused = true)]
async fn the_renewal_task_renews_held_permits_by_itself() {
    // The store's clock follows tokio's paused clock, so the background task's timers and the leases
    // move together.
    let clock = ManualClock::new(0);
    let store = MemoryStore::with_clock(clock.clone());
    let holder = Limiter::builder(store.clone())
        .policy(Policy::new(1, 0))
        .lease(Duration::from_secs(3))
        .build();
    let other = Limiter::builder(store).policy(Policy::new(1, 0)).build();
    let permit = holder
        .try_acquire_with("app", inflight::AcquireOptions::new().id("leased"))
        .await
        .unwrap();
    for _ in 0..100 {
        tokio::time::sleep(Duration::from_millis(500)).await;
        clock.advance(Duration::from_millis(500));
        assert!(other.try_acquire("app").await.unwrap_err().is_full());
    }
    assert!(!permit.is_lost());
    assert!(
        permit.expires_at_ms() >= 48_000,
        "renewed: {}",
        permit.expires_at_ms()
    );
}

#[test]
fn maintenance_racing_admissions_never_lets_a_key_over_its_limit() {
    // Forgetting idle keys while admissions come and go must not leave two cells for one key.
    let store = MemoryStore::new().idle_ttl(Duration::ZERO);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let limiter = rt.block_on(async {
        Limiter::builder(store.clone())
            .policy(Policy::new(1, 0))
            .build()
    });
    let in_flight = Arc::new(AtomicUsize::new(0));
    let max_seen = Arc::new(AtomicUsize::new(0));
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let maintainer = {
        let (store, stop) = (store.clone(), stop.clone());
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                let _ = futures_util::FutureExt::now_or_never(store.maintain());
            }
        })
    };
    let workers: Vec<_> = (0..2)
        .map(|_| {
            let (limiter, in_flight, max_seen) =
                (limiter.clone(), in_flight.clone(), max_seen.clone());
            std::thread::spawn(move || {
                for _ in 0..50_000 {
                    let admitted = futures_util::FutureExt::now_or_never(limiter.try_acquire("k"));
                    if let Some(Ok(permit)) = admitted {
                        let now = in_flight.fetch_add(1, Ordering::SeqCst) + 1;
                        max_seen.fetch_max(now, Ordering::SeqCst);
                        for _ in 0..200 {
                            std::hint::spin_loop(); // hold it a moment, so that holders can overlap
                        }
                        in_flight.fetch_sub(1, Ordering::SeqCst);
                        drop(permit);
                    }
                }
            })
        })
        .collect();
    for worker in workers {
        worker.join().unwrap();
    }
    stop.store(true, Ordering::Relaxed);
    maintainer.join().unwrap();
    assert_eq!(max_seen.load(Ordering::SeqCst), 1);
    let status = rt.block_on(limiter.status("k")).unwrap();
    assert_eq!(status.in_flight, 0);
}

#[tokio::test]
async fn a_limiter_lease_is_kept_between_the_minimum_and_a_day() {
    let built = |lease| {
        Limiter::builder(MemoryStore::new())
            .policy(Policy::new(1, 0))
            .lease(lease)
            .build()
    };
    let long = built(Duration::from_secs(3 * 86_400));
    assert_eq!(long.lease(), Duration::from_secs(86_400));
    let _admitted = long
        .try_acquire("app")
        .await
        .expect("admitted with a day's lease");
    assert_eq!(built(Duration::ZERO).lease(), Duration::from_millis(100));
}

/// Issue 28, item 7: a lease shorter than the renewal task can serve (1 ms was accepted, and lapsed while
/// held) is refused, naming the minimum; one of the minimum arriving while the task ticks at the default
/// lease's pace is renewed in time.
#[tokio::test(start_paused = true)]
async fn leases_under_the_minimum_are_refused_and_the_minimum_is_renewed_in_time() {
    let clock = ManualClock::new(0);
    let store = MemoryStore::with_clock(clock.clone());
    let holder = Limiter::builder(store.clone())
        .policy(Policy::new(1, 0))
        .build();
    let other = Limiter::builder(store).policy(Policy::new(1, 0)).build();
    let lease = |ms| {
        AcquireOptions::new()
            .id("leased")
            .lease(Duration::from_millis(ms))
    };
    for ms in [1, 99] {
        let refused = holder.try_acquire_with("app", lease(ms)).await;
        assert!(
            matches!(refused, Err(AcquireError::Invalid(why)) if why.contains("100 ms")),
            "{ms} ms: {refused:?}"
        );
    }
    // Half way through the renewal task's sleep of 1 s (the tick of the default lease), a 100 ms lease.
    for _ in 0..50 {
        tokio::time::sleep(Duration::from_millis(10)).await;
        clock.advance(Duration::from_millis(10));
    }
    let permit = holder.try_acquire_with("app", lease(100)).await.unwrap();
    for _ in 0..300 {
        tokio::time::sleep(Duration::from_millis(10)).await;
        clock.advance(Duration::from_millis(10));
        assert!(other.try_acquire("app").await.unwrap_err().is_full());
    }
    assert!(!permit.is_lost());
}
