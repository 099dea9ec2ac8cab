//! A fixture per store: a store to share between limiters (as processes share one) and a way to move its
//! clock forward.

use std::time::Duration;

use inflight::{DifyStore, Limiter, ManualClock, MemoryStore, Policy, RedisStore, Store};

use crate::support::{unique_prefix, TestCluster, TestRedis};

/// What every scenario needs from a store under test.
pub trait Fixture: Send + Sync + 'static {
    /// The store type.
    type S: Store;
    /// The store, shared: each limiter built from it stands for one process.
    fn store(&self) -> Self::S;
    /// Moves the store's clock forward.
    fn advance(&self, by: Duration);

    /// A limiter ("a process") over the shared store.
    fn limiter(&self, policy: Policy) -> Limiter<Self::S> {
        Limiter::builder(self.store())
            .policy(policy)
            .lease(Duration::from_secs(30))
            .build()
    }
}

pub struct MemoryFixture {
    clock: ManualClock,
    store: MemoryStore<ManualClock>,
}

impl MemoryFixture {
    pub fn new() -> Self {
        let clock = ManualClock::new(1_700_000_000_000);
        Self {
            store: MemoryStore::with_clock(clock.clone()),
            clock,
        }
    }
}

impl Fixture for MemoryFixture {
    type S = MemoryStore<ManualClock>;

    fn store(&self) -> Self::S {
        self.store.clone()
    }

    fn advance(&self, by: Duration) {
        self.clock.advance(by);
    }
}

pub struct RedisFixture<S = RedisStore> {
    // Declared first: the store goes before the server it talks to.
    store: S,
    _server: TestRedis,
}

impl RedisFixture {
    pub fn new() -> Self {
        let server = TestRedis::start();
        Self {
            store: server.store(),
            _server: server,
        }
    }
}

impl RedisFixture<DifyStore> {
    /// A store of Dify's key layout.
    pub fn dify() -> Self {
        let server = TestRedis::start();
        Self {
            store: server.store_builder().dify().open().unwrap(),
            _server: server,
        }
    }
}

impl Fixture for RedisFixture<DifyStore> {
    type S = DifyStore;

    fn store(&self) -> Self::S {
        self.store.clone()
    }

    fn advance(&self, by: Duration) {
        self.store.advance_clock(by);
    }
}

impl Fixture for RedisFixture {
    type S = RedisStore;

    fn store(&self) -> Self::S {
        self.store.clone()
    }

    fn advance(&self, by: Duration) {
        self.store.advance_clock(by);
    }
}

/// A store on the test binary's one Redis Cluster (3 primaries, 3 replicas), under a prefix of the
/// test's own, so that the tests sharing the cluster share nothing else.
pub struct ClusterFixture {
    store: RedisStore,
}

impl ClusterFixture {
    pub fn new() -> Self {
        let cluster = TestCluster::shared();
        Self {
            store: cluster
                .store_builder(&unique_prefix("behaviour"))
                .open()
                .expect("cluster url"),
        }
    }
}

impl Fixture for ClusterFixture {
    type S = RedisStore;

    fn store(&self) -> Self::S {
        self.store.clone()
    }

    fn advance(&self, by: Duration) {
        self.store.advance_clock(by);
    }
}
