//! What only the memory store can show: calls counted, idle keys forgotten.

use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use inflight::store::{AcquireRequest, Admission, KeyStatus, RenewRequest, Renewal};
use inflight::{Limiter, ManualClock, MemoryStore, PermitId, Policy, Store, StoreError};

/// A store that counts the calls that would be I/O in a remote store.
#[derive(Default)]
struct Counting {
    inner: MemoryStore,
    calls: AtomicUsize,
}

impl Counting {
    fn count(&self) {
        self.calls.fetch_add(1, Ordering::SeqCst);
    }
}

impl Store for Counting {
    fn acquire(
        &self,
        req: AcquireRequest<'_>,
    ) -> impl Future<Output = Result<Admission, StoreError>> + Send {
        self.count();
        self.inner.acquire(req)
    }
    fn release(
        &self,
        key: &str,
        id: &PermitId,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send {
        self.count();
        self.inner.release(key, id)
    }
    fn renew(
        &self,
        batch: &[RenewRequest],
    ) -> impl Future<Output = Result<Vec<Renewal>, StoreError>> + Send {
        self.count();
        self.inner.renew(batch)
    }
    fn status(
        &self,
        key: &str,
        policy: Policy,
    ) -> impl Future<Output = Result<KeyStatus, StoreError>> + Send {
        self.count();
        self.inner.status(key, policy)
    }
    fn set_limit(
        &self,
        key: &str,
        limit: Option<u32>,
        policy: Policy,
    ) -> impl Future<Output = Result<KeyStatus, StoreError>> + Send {
        self.count();
        self.inner.set_limit(key, limit, policy)
    }
    fn release_now(&self, key: &str, id: &PermitId) -> Option<Result<bool, StoreError>> {
        self.count();
        self.inner.release_now(key, id)
    }
    fn may_have_override(&self, key: &str) -> bool {
        self.inner.may_have_override(key)
    }
}

#[tokio::test]
async fn an_unlimited_key_is_admitted_without_any_store_io() {
    let limiter = Limiter::builder(Counting::default())
        .policy(Policy::new(0, 0))
        .build();
    for _ in 0..1_000 {
        let permit = limiter.try_acquire("app").await.unwrap();
        assert!(!permit.is_counted());
        drop(permit);
    }
    let streamed = limiter.try_acquire("app").await.unwrap();
    drop(streamed.guard_stream(futures_util::stream::iter([1, 2])));
    limiter.renew_now().await;
    assert_eq!(limiter.store().calls.load(Ordering::SeqCst), 0);

    // Once any key has an override, admissions ask the store again.
    limiter.set_limit("other", 2).await.unwrap();
    let before = limiter.store().calls.load(Ordering::SeqCst);
    let _permit = limiter.try_acquire("app").await.unwrap();
    assert_eq!(limiter.store().calls.load(Ordering::SeqCst), before + 1);
}

#[tokio::test]
async fn a_limited_key_costs_one_store_call_per_acquire_and_per_release() {
    let limiter = Limiter::builder(Counting::default())
        .policy(Policy::new(2, 0))
        .build();
    let permit = limiter.try_acquire("app").await.unwrap();
    assert_eq!(limiter.store().calls.load(Ordering::SeqCst), 1);
    drop(permit);
    assert_eq!(limiter.store().calls.load(Ordering::SeqCst), 2);
    // The release freed the very lease the admission took.
    assert_eq!(
        limiter
            .store()
            .inner
            .status("app", Policy::new(2, 0))
            .await
            .unwrap()
            .in_flight,
        0
    );
}

#[tokio::test]
async fn permits_of_this_process_hold_their_slot_without_a_lease_until_dropped() {
    let clock = ManualClock::new(0);
    let store = Arc::new(MemoryStore::with_clock(clock.clone()));
    let limiter = Limiter::builder(store.clone())
        .policy(Policy::new(1, 0))
        .lease(Duration::from_secs(1))
        .build();
    let permit = limiter.try_acquire("app").await.unwrap();
    assert_eq!(permit.expires_at_ms(), 0, "no lease to expire");
    assert_eq!(limiter.held(), 0, "nothing for the renewal task to do");
    clock.advance(Duration::from_secs(3_600));
    store.maintain().await;
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
    let limiter = Limiter::builder(Arc::new(store))
        .policy(Policy::new(1, 0))
        .build();
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
    store.maintain().await;
    assert_eq!(store.key_count(), 10_002, "not idle long enough yet");
    clock.advance(Duration::from_secs(11));
    store.maintain().await;
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
    let store = Arc::new(MemoryStore::with_clock(clock.clone()));
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
    let store = Arc::new(MemoryStore::new().idle_ttl(Duration::ZERO));
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
                futures_util::FutureExt::now_or_never(store.maintain());
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
async fn a_limiter_lease_is_kept_between_a_millisecond_and_a_day() {
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
    assert_eq!(built(Duration::ZERO).lease(), Duration::from_millis(1));
}

/// A store that queues releases itself, as the Redis store does, and fails the first `failures` of them
/// (queued or awaited) as a store that is briefly away would.
struct Queueing {
    inner: MemoryStore,
    failures: AtomicUsize,
    queued: AtomicUsize,
    awaited: AtomicUsize,
    queues: bool,
}

impl Queueing {
    fn new(failures: usize, queues: bool) -> Self {
        Self {
            inner: MemoryStore::new(),
            failures: AtomicUsize::new(failures),
            queued: AtomicUsize::new(0),
            awaited: AtomicUsize::new(0),
            queues,
        }
    }

    /// Fails while failures are left.
    fn fails(&self) -> bool {
        self.failures
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok()
    }
}

impl Store for Queueing {
    fn acquire(
        &self,
        req: AcquireRequest<'_>,
    ) -> impl Future<Output = Result<Admission, StoreError>> + Send {
        self.inner.acquire(req)
    }
    fn release(
        &self,
        key: &str,
        id: &PermitId,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send {
        self.awaited.fetch_add(1, Ordering::SeqCst);
        // The memory store releases when called, so a failed try must not call it.
        let released =
            (!self.fails()).then(|| self.inner.release_now(key, id).expect("in process"));
        std::future::ready(
            released.unwrap_or_else(|| Err(StoreError::Unavailable("briefly away".into()))),
        )
    }
    fn release_queued(
        &self,
        key: &str,
        id: &PermitId,
        done: inflight::ReleaseDone,
    ) -> Result<(), inflight::ReleaseDone> {
        if !self.queues {
            return Err(done);
        }
        self.queued.fetch_add(1, Ordering::SeqCst);
        if self.fails() {
            done(Err(StoreError::Unavailable("briefly away".into())));
        } else {
            let released = self.inner.release_now(key, id).expect("in process");
            done(released);
        }
        Ok(())
    }
    fn renew(
        &self,
        batch: &[RenewRequest],
    ) -> impl Future<Output = Result<Vec<Renewal>, StoreError>> + Send {
        self.inner.renew(batch)
    }
    fn status(
        &self,
        key: &str,
        policy: Policy,
    ) -> impl Future<Output = Result<KeyStatus, StoreError>> + Send {
        self.inner.status(key, policy)
    }
    fn set_limit(
        &self,
        key: &str,
        limit: Option<u32>,
        policy: Policy,
    ) -> impl Future<Output = Result<KeyStatus, StoreError>> + Send {
        self.inner.set_limit(key, limit, policy)
    }
}

/// Waits (up to 5 s) until `key` has nothing in flight in `limiter`'s store.
async fn wait_released<S: Store>(limiter: &Limiter<S>, key: &str) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while limiter.status(key).await.unwrap().in_flight > 0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{key} never released"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

#[tokio::test]
async fn a_dropped_permit_is_released_through_the_stores_queue_and_retried_when_it_fails() {
    let limiter = Limiter::builder(Queueing::new(2, true))
        .policy(Policy::new(1, 0))
        .build();
    let permit = limiter.try_acquire("app").await.unwrap();
    drop(permit);
    wait_released(&limiter, "app").await;
    let store = limiter.store();
    assert_eq!(store.queued.load(Ordering::SeqCst), 1, "queued once");
    // The queued try failed, the first retry too; the second landed.
    assert_eq!(store.awaited.load(Ordering::SeqCst), 2, "then retried");
    // Nothing is left pending: shutdown has nothing to wait for.
    tokio::time::timeout(Duration::from_millis(100), limiter.release_held())
        .await
        .expect("no release left pending");
}

#[tokio::test]
async fn a_store_that_cannot_queue_gets_its_releases_in_a_task() {
    let limiter = Limiter::builder(Queueing::new(1, false))
        .policy(Policy::new(1, 0))
        .build();
    drop(limiter.try_acquire("app").await.unwrap());
    wait_released(&limiter, "app").await;
    let store = limiter.store();
    assert_eq!(store.queued.load(Ordering::SeqCst), 0);
    assert_eq!(
        store.awaited.load(Ordering::SeqCst),
        2,
        "failed once, then retried"
    );
}
