//! [`RedisStoreBuilder`]: the URL, prefix, timeouts and pipeline of a [`RedisStore`], and opening it.

use std::sync::atomic::AtomicI64;
use std::sync::Arc;
use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::io::tcp::TcpSettings;
use redis::{Client, IntoConnectionInfo};

use super::batch::{Batcher, Durability};
use super::conn::Conn;
use super::{cluster, overrides, quota, sentinel, wakeups, Layout, RedisStore};
use crate::error::StoreError;

/// Builds a [`RedisStore`].
#[derive(Debug)]
#[must_use]
pub struct RedisStoreBuilder {
    pub(super) url: String,
    pub(super) prefix: String,
    pub(super) response_timeout: Duration,
    pub(super) connection_timeout: Duration,
    pub(super) pipeline: usize,
    pub(super) max_overrides: usize,
    pub(super) layout: Layout,
    pub(super) stale_after: Duration,
    pub(super) wait: Option<Durability>,
    #[cfg(feature = "tls")]
    pub(super) root_cert: Option<Vec<u8>>,
}

impl RedisStoreBuilder {
    /// The prefix of every Redis key (default `inflight:`): stores with different prefixes share nothing.
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// How long to wait for an answer before the store counts as unavailable (default 1 s).
    pub fn response_timeout(mut self, timeout: Duration) -> Self {
        self.response_timeout = timeout;
        self
    }

    /// How long one connection attempt may take (default 1 s).
    pub fn connection_timeout(mut self, timeout: Duration) -> Self {
        self.connection_timeout = timeout;
        self
    }

    /// How many batches of admissions and releases may be out at once (default 3; 0 counts as 1). While
    /// they are, new operations wait and leave together in the next batch: more keeps Redis busy while
    /// answers travel, fewer makes batches larger and script calls fewer (BENCHMARKS.md compares them).
    pub fn pipeline(mut self, batches: usize) -> Self {
        self.pipeline = batches.max(1);
        self
    }

    /// The most keys that may have an override at once (0, the default: no bound); setting one more is
    /// [`StoreError::TooManyOverrides`]. Overrides have no expiry: without a bound, whoever may set them
    /// may fill Redis.
    pub fn max_overrides(mut self, max: usize) -> Self {
        self.max_overrides = max;
        self
    }

    /// The key layout (default [`Layout::Inflight`]); [`Layout::Dify`] shares Dify's own keys with its
    /// workers during a migration.
    pub fn layout(mut self, layout: Layout) -> Self {
        self.layout = layout;
        self
    }

    /// Under [`Layout::Dify`]: how old a Dify worker's entry must be before an admission that needs its
    /// slot evicts it (default 600 s, Dify's own age).
    pub fn dify_stale_after(mut self, age: Duration) -> Self {
        self.stale_after = age;
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
        self.root_cert = Some(pem.into());
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
        if tokio::runtime::Handle::try_current().is_err() {
            return Err(StoreError::Rejected(
                "open a RedisStore inside a Tokio runtime".into(),
            ));
        }
        let (conn, target) = if let Some((rest, tls)) = cluster::strip_scheme(&self.url) {
            cluster::open(&self, rest, tls)?
        } else if let Some((rest, tls)) = sentinel::strip_scheme(&self.url) {
            sentinel::Follower::open(&self, rest, tls, self.manager_config())?
        } else {
            self.single()?
        };
        if self.layout == Layout::Dify && conn.is_cluster() {
            return Err(StoreError::Rejected(
                "the Dify layout is not supported on Redis Cluster: an app's two Dify keys hash to \
                 different slots, so no script can count and admit against both (docs/dify.md)"
                    .into(),
            ));
        }
        let clock_offset_ms = Arc::new(AtomicI64::new(0));
        let names = overrides::Names::new(&self.prefix, "overrides", conn.is_cluster());
        let view = Arc::new(overrides::View::default());
        let metered = Arc::new(quota::Metered::new(&self.prefix, conn.is_cluster()));
        let wakes = wakeups::start(conn.clone(), self.layout, &self.prefix);
        if self.layout == Layout::Inflight {
            overrides::start(conn.clone(), names.clone(), &view);
        }
        Ok(RedisStore {
            batcher: Batcher::start(
                conn.clone(),
                clock_offset_ms.clone(),
                self.pipeline,
                self.wait,
            ),
            conn,
            view,
            names: Arc::new(names),
            metered,
            max_overrides: self.max_overrides,
            prefix: Arc::from(self.prefix),
            target: Arc::from(target),
            layout: self.layout,
            wakes,
            stale_ms: u64::try_from(self.stale_after.as_millis()).unwrap_or(u64::MAX),
            clock_offset_ms,
        })
    }

    /// One server: `redis://`, `rediss://`, `unix://`, `redis+unix://`.
    fn single(&self) -> Result<(Conn, String), StoreError> {
        let info = self
            .url
            .as_str()
            .into_connection_info()
            .map_err(|e| StoreError::Rejected(format!("invalid Redis URL: {e}")))?;
        let target = info.addr().to_string();
        let client = self.client(info)?;
        let manager =
            ConnectionManager::new_lazy_with_config(client.clone(), self.manager_config())
                .map_err(StoreError::from)?;
        let client = Arc::new(client);
        Ok((Conn::Single { manager, client }, target))
    }

    /// The connection manager's timeouts and reconnection (one server, or the primary Sentinel names).
    fn manager_config(&self) -> ConnectionManagerConfig {
        ConnectionManagerConfig::new()
            .set_response_timeout(Some(self.response_timeout))
            .set_connection_timeout(Some(self.connection_timeout))
            .set_number_of_retries(1)
            .set_min_delay(Duration::from_millis(10))
            .set_max_delay(Duration::from_millis(100))
    }

    /// A client of one server, with TCP_NODELAY and this builder's CA certificate.
    pub(super) fn client(&self, info: impl IntoConnectionInfo) -> Result<Client, StoreError> {
        #[cfg(feature = "tls")]
        let root_cert = self.root_cert.as_deref();
        #[cfg(not(feature = "tls"))]
        let root_cert = None;
        client(info, root_cert)
    }
}

/// A client of one server, with TCP_NODELAY, trusting `root_cert` (PEM) if given.
pub(super) fn client(
    info: impl IntoConnectionInfo,
    root_cert: Option<&[u8]>,
) -> Result<Client, StoreError> {
    let invalid = |e: redis::RedisError| StoreError::Rejected(format!("invalid Redis URL: {e}"));
    let info = info
        .into_connection_info()
        .map_err(invalid)?
        .set_tcp_settings(TcpSettings::default().set_nodelay(true));
    #[cfg(feature = "tls")]
    let client = match root_cert {
        Some(pem) => Client::build_with_tls(
            info,
            redis::TlsCertificates {
                client_tls: None,
                root_cert: Some(pem.to_vec()),
            },
        ),
        None => Client::open(info),
    };
    #[cfg(not(feature = "tls"))]
    let client = {
        let _ = root_cert;
        Client::open(info)
    };
    client.map_err(invalid)
}
