//! [`RedisStoreBuilder`]: the URL, prefix, timeouts and pipeline of a [`RedisStore`], and opening it.

use std::sync::atomic::AtomicI64;
use std::sync::Arc;
use std::time::Duration;

use super::batch::{Batcher, Durability};
use super::connect::{Conn, ConnOptions};
use super::keeper::{self, Metered};
use super::lane::ListingLane;
use super::overrides::{Names, View};
use super::store::RedisStore;
use super::wakeups;
use crate::error::StoreError;
use crate::store::wake::Wakes;

/// The prefix of every Redis key inflight writes unless [`RedisStoreBuilder::prefix`] says otherwise.
pub const DEFAULT_PREFIX: &str = "inflight:";

/// Builds a [`RedisStore`] (or, through [`RedisStoreBuilder::dify`], a [`DifyStore`](super::DifyStore)).
#[derive(Debug)]
#[must_use]
pub struct RedisStoreBuilder {
    pub(super) conn: ConnOptions,
    prefix: String,
    pipeline: usize,
    max_overrides: usize,
    wait: Option<Durability>,
    listing_lane: ListingLane,
}

impl RedisStore {
    /// Starts building a store for `url`.
    pub fn builder(url: impl Into<String>) -> RedisStoreBuilder {
        RedisStoreBuilder {
            conn: ConnOptions::new(url.into()),
            prefix: DEFAULT_PREFIX.to_owned(),
            pipeline: 3,
            max_overrides: 0,
            wait: None,
            listing_lane: ListingLane::default(),
        }
    }

    /// A store for `url` with the default prefix and timeouts; see [`RedisStoreBuilder::open`].
    pub fn open(url: impl Into<String>) -> Result<Self, StoreError> {
        Self::builder(url).open()
    }
}

impl RedisStoreBuilder {
    /// The prefix of every Redis key (default `inflight:`): stores with different prefixes share nothing.
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// The lane where this store's listings of busy keys take turns (default: a lane of its own): stores
    /// built with clones of one lane send one page of a listing at a time among them, so that Redis,
    /// which runs one command at a time, keeps their admissions waiting behind one short page at most
    /// (a server gives its workers' stores one lane).
    pub fn listing_lane(mut self, lane: ListingLane) -> Self {
        self.listing_lane = lane;
        self
    }

    /// How long to wait for an answer before the store counts as unavailable (default 1 s).
    pub fn response_timeout(mut self, timeout: Duration) -> Self {
        self.conn.response_timeout = timeout;
        self
    }

    /// How long one connection attempt may take (default 1 s).
    pub fn connection_timeout(mut self, timeout: Duration) -> Self {
        self.conn.connection_timeout = timeout;
        self
    }

    /// How many batches of admissions and releases may be out at once (default 3; 0 counts as 1); while
    /// they are, new operations wait and leave together in the next batch (BENCHMARKS.md compares them).
    pub fn pipeline(mut self, batches: usize) -> Self {
        self.pipeline = batches.max(1);
        self
    }

    /// The most keys that may have an override at once (0, the default: no bound, and overrides never
    /// expire); setting one more is [`StoreError::TooManyOverrides`].
    pub fn max_overrides(mut self, max: usize) -> Self {
        self.max_overrides = max;
        self
    }

    /// Makes every batch of admissions and releases wait until `replicas` replicas have acknowledged
    /// it (Redis `WAIT`), for at most `timeout`, before it is answered: a failover then loses only
    /// admissions that fewer replicas had when it came (RELIABILITY.md, "Failover"). Each admission
    /// costs a replica round trip more (BENCHMARKS.md measures it); when fewer replicas acknowledge in
    /// time, the admission is answered anyway. 0 replicas (the default): no waiting.
    pub fn wait_replicas(mut self, replicas: u32, timeout: Duration) -> Self {
        self.wait = (replicas > 0).then_some(Durability { replicas, timeout });
        self
    }

    /// For `rediss://` URLs: trust this CA certificate (PEM) instead of the web's root certificates, as
    /// for a Redis whose certificate a private CA signed.
    #[cfg(feature = "tls")]
    pub fn root_cert(mut self, pem: impl Into<Vec<u8>>) -> Self {
        self.conn.root_cert = Some(pem.into());
        self
    }

    /// Checks the URL and prepares the connection; it is made on first use and remade whenever it is
    /// lost, so a store opened while Redis is down starts working when Redis comes up.
    ///
    /// URLs: `redis://[user:password@]host[:port][/db]`, `rediss://...` (TLS, with the `tls` feature),
    /// `unix:///path/to/redis.sock` or `redis+unix:///path`; a Redis Cluster:
    /// `redis+cluster://[user:password@]host:port,host:port,...` (`rediss+cluster://` for TLS), any of
    /// its nodes; or the primary Sentinel names, followed through failovers:
    /// `redis+sentinel://[user:password@]host:port,host:port/master-name[?db=N]` (`rediss+sentinel://`;
    /// `sentinel_username=` and `sentinel_password=` in the query for the sentinels' own credentials).
    /// RELIABILITY.md ("Failover") says what a failover does to admissions.
    ///
    /// Call it inside a Tokio runtime: the store's connection and its batcher run on that runtime, which
    /// must keep running for as long as the store is used. Outside a runtime it is an error.
    pub fn open(self) -> Result<RedisStore, StoreError> {
        let (conn, target) = Conn::open(&self.conn)?;
        // This handle's waiters hear their turns (queue.lua) on a channel of its own.
        let wakes = wakeups::start(conn.clone(), self.turns_channel());
        let store = self.assemble(conn, target, wakes);
        keeper::start(
            store.conn.clone(),
            Names::clone(&store.overrides),
            &store.view,
        );
        Ok(store)
    }

    /// A channel of this store handle's own, on which its waiters hear their turns.
    pub(super) fn turns_channel(&self) -> String {
        format!("{}turns:{}", self.prefix, uuid::Uuid::new_v4().simple())
    }

    /// The store on `conn`, waking waiters through `wakes`; its view of overrides not started.
    pub(super) fn assemble(self, conn: Conn, target: String, wakes: Arc<Wakes>) -> RedisStore {
        let clock_offset_ms = Arc::new(AtomicI64::new(0));
        let cluster = conn.is_cluster();
        RedisStore {
            batcher: Batcher::start(
                conn.clone(),
                clock_offset_ms.clone(),
                self.pipeline,
                self.wait,
            ),
            overrides: Arc::new(Names::new(&self.prefix, "overrides", cluster)),
            view: Arc::new(View::default()),
            metered: Arc::new(Metered::new(&self.prefix, cluster)),
            conn,
            max_overrides: self.max_overrides,
            prefix: Arc::from(self.prefix),
            target: Arc::from(target),
            wakes,
            clock_offset_ms,
            listing_lane: self.listing_lane,
        }
    }
}
