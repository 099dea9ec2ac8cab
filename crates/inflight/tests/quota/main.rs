//! Quotas settled around the work, on every store: the settlement matrix (scenarios.rs), reservations
//! extended while their holders work (extend.rs), bounds and an independent ledger under contention
//! (ledger.rs), and, on a real Redis, holders in other processes
//! killed with SIGKILL and processes churning at once (processes.rs), the view of metered keys
//! (view.rs), and fundings that apply once however often they are sent (resend.rs).
#![allow(missing_docs, unreachable_pub)]

mod extend;
mod ledger;
mod processes;
mod resend;
mod scenarios;
#[path = "../support/mod.rs"]
mod support;
mod view;

use std::time::Duration;

use inflight::quota::Quota;
use inflight::{Limiter, ManualClock, MemoryStore, Policy, QuotaStore, RedisStore, Store};
use support::TestRedis;

/// The ttl of the scenarios' reservations.
pub const TTL: Duration = Duration::from_secs(60);

/// What every scenario needs from a store under test.
pub trait Fixture: Send + Sync + 'static {
    type S: Store + QuotaStore;
    /// The store, shared by every quota and limiter of the scenario (as processes share one).
    fn store(&self) -> Self::S;
    /// Moves the store's clock forward (for the handles this fixture gives out).
    fn advance(&self, by: Duration);
    /// True when settlements in the background finish before the drop that starts them returns.
    fn settles_in_place(&self) -> bool;

    /// Quotas over the store, with reservations of [`TTL`].
    fn quota(&self) -> Quota<Self::S> {
        Quota::new(self.store()).with_ttl(TTL)
    }

    /// A limiter over the store: `limit` in flight per key.
    fn limiter(&self, limit: u32) -> Limiter<Self::S> {
        Limiter::builder(self.store())
            .policy(Policy::new(limit, 0))
            .build()
    }
}

pub(crate) struct Memory {
    clock: ManualClock,
    store: MemoryStore<ManualClock>,
}

impl Memory {
    pub fn new() -> Self {
        let clock = ManualClock::new(1_700_000_000_000);
        Self {
            store: MemoryStore::with_clock(clock.clone()),
            clock,
        }
    }
}

impl Fixture for Memory {
    type S = MemoryStore<ManualClock>;

    fn store(&self) -> Self::S {
        self.store.clone()
    }

    fn advance(&self, by: Duration) {
        self.clock.advance(by);
    }

    fn settles_in_place(&self) -> bool {
        true
    }
}

pub(crate) struct Redis {
    // Declared first: the store goes before the server it talks to.
    store: RedisStore,
    _server: TestRedis,
}

impl Redis {
    pub fn new() -> Self {
        let server = TestRedis::start();
        Self {
            store: server.store(),
            _server: server,
        }
    }
}

impl Fixture for Redis {
    type S = RedisStore;

    fn store(&self) -> Self::S {
        self.store.clone()
    }

    fn advance(&self, by: Duration) {
        self.store.advance_clock(by);
    }

    fn settles_in_place(&self) -> bool {
        false
    }
}

/// Instantiates every scenario on the memory store and on a fresh redis-server.
macro_rules! per_store {
    ($($module:ident::$name:ident),* $(,)?) => {
        mod memory { $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $name() { crate::$module::$name(crate::Memory::new()).await }
        )* }
        mod redis { $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $name() { crate::$module::$name(crate::Redis::new()).await }
        )* }
    };
}

per_store!(
    scenarios::an_exhausted_quota_is_refused_before_any_admission,
    scenarios::a_refused_admission_is_refunded,
    scenarios::work_that_fails_is_refunded,
    scenarios::work_that_succeeds_is_committed,
    scenarios::work_whose_future_is_dropped_is_refunded,
    scenarios::work_that_panics_is_refunded,
    scenarios::an_abandoned_reservation_is_refunded_once_its_ttl_passes,
    scenarios::settling_again_is_a_no_op_that_says_so,
    scenarios::an_open_id_is_reserved_once_and_a_settled_one_not_again,
    scenarios::committing_on_admission_charges_work_that_fails,
    scenarios::an_unmetered_key_records_nothing,
    scenarios::a_reservation_dropped_off_the_runtime_is_refunded,
    scenarios::a_commit_dropped_unpolled_is_finished_in_the_background,
    extend::extending_moves_only_an_open_reservations_deadline,
    extend::a_held_reservation_extends_itself_while_its_holder_works,
    ledger::balances_are_set_and_topped_up_within_bounds,
    ledger::balance_is_conserved_and_never_negative_under_contention,
    ledger::a_permits_record_keeps_its_quota_key_across_renewals,
    resend::a_funding_applies_once_per_idempotency_key,
);

/// A key holds at most `MAX_OPEN_RESERVATIONS` open (memory only: on Redis it takes that many calls).
#[tokio::test]
async fn a_key_holds_a_bounded_number_of_open_reservations() {
    use inflight::quota::{Fund, MAX_OPEN_RESERVATIONS};
    use inflight::StoreError;
    let quota = Memory::new().quota();
    quota
        .fund("busy", Fund::Set(u64::from(MAX_OPEN_RESERVATIONS) + 1))
        .await
        .unwrap();
    let mut held = Vec::new();
    for _ in 0..MAX_OPEN_RESERVATIONS {
        held.push(quota.reserve("busy", 1).await.unwrap());
    }
    let refused = quota.reserve("busy", 1).await.unwrap_err();
    let bound = StoreError::TooManyReservations {
        max: MAX_OPEN_RESERVATIONS,
    };
    assert_eq!(refused, inflight::quota::QuotaError::Store(bound));
    drop(held.pop());
    let _another = quota.reserve("busy", 1).await.unwrap();
    let balance = quota.balance("busy").await.unwrap().unwrap();
    assert_eq!(
        (balance.balance, balance.reserved),
        (1, u64::from(MAX_OPEN_RESERVATIONS))
    );
}

/// The body of the child processes of processes.rs; does nothing unless started by one of its tests.
#[test]
#[ignore = "entry point of child processes, started by processes.rs"]
fn child_process() {
    processes::child();
}

/// Stats made with `with_balances` keep the last balance answered for each key, of a bounded number.
#[tokio::test]
async fn stats_keep_the_last_balance_of_a_bounded_number_of_keys() {
    use inflight::quota::{Fund, QuotaStats};
    let stats = std::sync::Arc::new(QuotaStats::with_balances(2));
    let quota = Memory::new().quota().with_stats(stats.clone());
    for (key, n) in [("tenant:a", 5), ("tenant:b", 3), ("tenant:c", 1)] {
        quota.fund(key, Fund::Set(n)).await.unwrap();
    }
    let held = quota.reserve("tenant:a", 2).await.unwrap();
    let figures = |stats: &QuotaStats| {
        let mut seen: Vec<(String, u64, u64)> = stats
            .balances()
            .into_iter()
            .map(|(key, b)| (key.into(), b.balance, b.reserved))
            .collect();
        seen.sort();
        seen
    };
    let want = [("tenant:a", 3, 2), ("tenant:b", 3, 0)];
    let want: Vec<(String, u64, u64)> = want
        .iter()
        .map(|(k, b, r)| (k.to_string(), *b, *r))
        .collect();
    assert_eq!(figures(&stats), want, "tenant:c is past the bound");
    held.commit().await.unwrap();
    assert_eq!(figures(&stats)[0], ("tenant:a".to_owned(), 3, 0));
    assert!(QuotaStats::default().balances().is_empty());
}
