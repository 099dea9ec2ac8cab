//! The Redis store: leases and overrides shared by every process that uses the same Redis.
//!
//! Every operation is one Lua script (`scripts/*.lua`, each with a header naming its KEYS and ARGV and
//! saying why it must be atomic), run with EVALSHA over a multiplexed connection that reconnects by
//! itself. Deadlines come from Redis `TIME`, one clock for every worker. All of a key's Redis keys share
//! one hash tag, so each script touches one slot.
//!
//! The store's connection lives on the Tokio runtime the store was opened in (its home): every command
//! is sent from a task there, so the store can be used from other runtimes too (a thread-per-core
//! server's workers) without its connection ending with whichever runtime happened to use it first.
//! With [`RedisStoreBuilder::batches_per_runtime`], admissions and releases are the exception: each
//! runtime that makes them from its tasks batches its own, over a connection of its own, made and driven
//! on that runtime and ending with it. A worker then never hands an admission to another thread and waits
//! to be woken with the answer: behind `inflight proxy` that hand-off cost a wake-up of each side's
//! runtime (an eventfd write, a system call) per operation. Renewals, status reads, limit changes and
//! whatever a stopped runtime left queued go from home.

mod batch;
mod error;
mod keys;
mod scripts;

use std::borrow::Cow;
use std::future::Future;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use dashmap::DashMap;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::io::tcp::TcpSettings;
use redis::{Client, IntoConnectionInfo, Script};
use tokio::runtime::{Handle, Id as RuntimeId};

use self::batch::{Batcher, Op};
use self::keys::{KeyNames, Member};
use super::{
    AcquireRequest, Admission, Grant, KeyStatus, ReleaseDone, RenewRequest, Renewal, Store,
};
use crate::clock::millis;
use crate::error::StoreError;
use crate::id::PermitId;
use crate::policy::{Limit, Policy};

/// The prefix of every Redis key inflight writes unless [`RedisStoreBuilder::prefix`] says otherwise.
pub const DEFAULT_PREFIX: &str = "inflight:";

/// Leases and overrides in Redis.
///
/// The data model is described in `scripts/common.lua`. Every process sharing a Redis (and a prefix)
/// must run a version that writes the same model: a generated permit id is stored as the byte 0xFF and
/// the UUID's 16 bytes, a given id as its text (`CHANGELOG.md` lists changes to the model).
///
/// ```no_run
/// use inflight::{Limiter, Policy, RedisStore};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let store = RedisStore::open("redis://127.0.0.1:6379")?;
/// let limiter = Limiter::builder(store).policy(Policy::new(4, 0)).build();
/// let permit = limiter.try_acquire("app-1").await?; // one EVALSHA round trip
/// # drop(permit);
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct RedisStore {
    conn: ConnectionManager,
    /// For the connections of other runtimes' batches.
    client: Client,
    config: ConnectionManagerConfig,
    prefix: Arc<str>,
    target: Arc<str>,
    /// Added to Redis `TIME` by every script; moved only by tests ([`RedisStore::advance_clock`]).
    clock_offset_ms: Arc<AtomicI64>,
    /// Admissions and releases, batched; started on first use, on `home`.
    batcher: Arc<OnceLock<Batcher>>,
    /// With `batches_per_runtime`: the batches of other runtimes, each started on its runtime's first
    /// admission or release there.
    away: Option<Arc<DashMap<RuntimeId, Batcher, foldhash::fast::RandomState>>>,
    /// Batches out at once, at most.
    pipeline: usize,
    /// The runtime the store was opened in: its connection and its tasks run there.
    home: Handle,
}

/// Builds a [`RedisStore`].
#[derive(Debug)]
#[must_use]
pub struct RedisStoreBuilder {
    url: String,
    prefix: String,
    response_timeout: Duration,
    connection_timeout: Duration,
    pipeline: usize,
    batches_per_runtime: bool,
    #[cfg(feature = "tls")]
    root_cert: Option<Vec<u8>>,
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

    /// How many batches of admissions and releases may be out at once (default 3; 0 counts as 1), for each
    /// runtime that makes them (see the module docs). While they are, new operations wait and leave
    /// together in the next batch.
    ///
    /// More keeps Redis busy while answers travel, which suits clients that wait on each answer and do
    /// little else: in one run of `scripts/bench.sh`, `inflight bench --tasks 64` made 126,717 pairs/s
    /// with 3 and 89,660 with 1. Fewer makes the batches larger and the script calls fewer, which suits
    /// clients that have other work for the CPU, such as an HTTP server beside Redis on one machine: in the
    /// same run, behind `inflight proxy`, 1 served 2-3 % more requests/s than 3 for 14 % less Redis CPU
    /// per request (BENCHMARKS.md, "Redis pipeline").
    pub fn pipeline(mut self, batches: usize) -> Self {
        self.pipeline = batches.max(1);
        self
    }

    /// Lets each Tokio runtime other than the store's own batch the admissions and releases its tasks make,
    /// over a Redis connection of its own (default: off, everything goes through the store's runtime). For
    /// runtimes that keep being driven, such as the worker threads of `inflight proxy`, which this spares
    /// a hand-off to another thread and back for every operation; an operation queued on a runtime that
    /// is not being driven waits until it is (or, once it is dropped, goes from the store's runtime).
    pub fn batches_per_runtime(mut self, on: bool) -> Self {
        self.batches_per_runtime = on;
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
    /// `unix:///path/to/redis.sock` or `redis+unix:///path`.
    ///
    /// Call it inside a Tokio runtime: the store's connection and tasks run on that runtime, which must
    /// keep running for as long as the store is used (a multi-thread runtime, or a current-thread one that
    /// is being driven: the store's commands wait for it). Outside a runtime it is an error.
    pub fn open(self) -> Result<RedisStore, StoreError> {
        let home = Handle::try_current()
            .map_err(|_| StoreError::Rejected("open a RedisStore inside a Tokio runtime".into()))?;
        let info = self
            .url
            .as_str()
            .into_connection_info()
            .map_err(|e| StoreError::Rejected(format!("invalid Redis URL: {e}")))?;
        let target = info.addr().to_string();
        let info = info.set_tcp_settings(TcpSettings::default().set_nodelay(true));
        #[cfg(feature = "tls")]
        let client = match self.root_cert {
            Some(pem) => Client::build_with_tls(
                info,
                redis::TlsCertificates {
                    client_tls: None,
                    root_cert: Some(pem),
                },
            ),
            None => Client::open(info),
        };
        #[cfg(not(feature = "tls"))]
        let client = Client::open(info);
        let client = client.map_err(|e| StoreError::Rejected(format!("invalid Redis URL: {e}")))?;
        let config = ConnectionManagerConfig::new()
            .set_response_timeout(Some(self.response_timeout))
            .set_connection_timeout(Some(self.connection_timeout))
            .set_number_of_retries(1)
            .set_min_delay(Duration::from_millis(10))
            .set_max_delay(Duration::from_millis(100));
        let conn = ConnectionManager::new_lazy_with_config(client.clone(), config.clone())
            .map_err(StoreError::from)?;
        Ok(RedisStore {
            conn,
            client,
            config,
            away: self.batches_per_runtime.then(Arc::default),
            prefix: Arc::from(self.prefix),
            target: Arc::from(target),
            clock_offset_ms: Arc::new(AtomicI64::new(0)),
            batcher: Arc::new(OnceLock::new()),
            pipeline: self.pipeline,
            home,
        })
    }
}

impl RedisStore {
    /// Starts building a store for `url`.
    pub fn builder(url: impl Into<String>) -> RedisStoreBuilder {
        RedisStoreBuilder {
            url: url.into(),
            prefix: DEFAULT_PREFIX.to_owned(),
            response_timeout: Duration::from_secs(1),
            connection_timeout: Duration::from_secs(1),
            pipeline: batch::DEFAULT_PIPELINE,
            batches_per_runtime: false,
            #[cfg(feature = "tls")]
            root_cert: None,
        }
    }

    /// A store for `url` with the default prefix and timeouts; see [`RedisStoreBuilder::open`].
    pub fn open(url: impl Into<String>) -> Result<Self, StoreError> {
        Self::builder(url).open()
    }

    /// Where the store connects (host:port or socket path; never credentials), for logs.
    pub fn target(&self) -> &str {
        &self.target
    }

    /// For tests of leases: every script of this handle (and its clones) reads Redis `TIME` plus `by` more
    /// than before, as if that much time had passed. Other handles on the same Redis are not moved.
    pub fn advance_clock(&self, by: Duration) {
        let by = i64::try_from(millis(by)).unwrap_or(i64::MAX);
        self.clock_offset_ms.fetch_add(by, Ordering::SeqCst);
    }

    fn offset(&self) -> i64 {
        self.clock_offset_ms.load(Ordering::SeqCst)
    }

    /// The batcher of the runtime whose task calls this, with `batches_per_runtime` (see the module docs);
    /// else home's. (Outside a task, say in a `block_on` of a runtime that may not be driven again, it is
    /// home's. Home's is lent; another runtime's is a clone (the map's guard must not be held across an
    /// await).
    fn batcher(&self) -> Cow<'_, Batcher> {
        if let Some(away) = &self.away {
            if tokio::task::try_id().is_some() {
                if let Ok(here) = Handle::try_current() {
                    if here.id() != self.home.id() {
                        return Cow::Owned(self.away_batcher(away, &here));
                    }
                }
            }
        }
        Cow::Borrowed(self.home_batcher())
    }

    fn home_batcher(&self) -> &Batcher {
        self.batcher.get_or_init(|| {
            Batcher::start(
                &self.home,
                self.conn.clone(),
                self.clock_offset_ms.clone(),
                self.pipeline,
            )
        })
    }

    /// The batcher of `here`, a runtime other than home, started on first use with a connection of its
    /// own (made lazily, inside `here`, whose task drives it). One whose dispatcher has stopped is
    /// replaced; the batchers of runtimes that have ended are forgotten then, so there are never more
    /// than runtimes alive.
    fn away_batcher(
        &self,
        away: &DashMap<RuntimeId, Batcher, foldhash::fast::RandomState>,
        here: &Handle,
    ) -> Batcher {
        if let Some(batcher) = away.get(&here.id()) {
            if !batcher.is_closed() {
                return batcher.clone();
            }
        }
        away.retain(|_, batcher| !batcher.is_closed());
        let _entered = here.enter();
        let started = away.entry(here.id()).or_try_insert_with(|| {
            ConnectionManager::new_lazy_with_config(self.client.clone(), self.config.clone())
                .map(|conn| Batcher::start(here, conn, self.clock_offset_ms.clone(), self.pipeline))
        });
        match started {
            Ok(batcher) => batcher.clone(),
            Err(error) => {
                tracing::debug!(%error, "no connection of this runtime's own; batching at home");
                self.home_batcher().clone()
            }
        }
    }

    fn names(&self, key: &str) -> KeyNames {
        KeyNames::new(&self.prefix, key)
    }

    async fn run(
        &self,
        script: &'static Script,
        names: &KeyNames,
        args: &[&dyn ToArg],
    ) -> Result<Vec<i64>, StoreError> {
        let mut invocation = script.key(names.leases());
        invocation.key(names.weights()).key(names.limit());
        for arg in args {
            arg.push(&mut invocation);
        }
        let mut conn = self.conn.clone();
        self.at_home(async move { Ok(invocation.invoke_async(&mut conn).await?) })
            .await
    }

    /// Runs `command` in a task on the store's home runtime (see the module docs).
    async fn at_home<T: Send + 'static>(
        &self,
        command: impl Future<Output = Result<T, StoreError>> + Send + 'static,
    ) -> Result<T, StoreError> {
        match self.home.spawn(command).await {
            Ok(result) => result,
            Err(error) if error.is_panic() => std::panic::resume_unwind(error.into_panic()),
            Err(_) => Err(StoreError::Unavailable(
                "the runtime the store was opened in has stopped".into(),
            )),
        }
    }

    async fn renew_one(&self, req: &RenewRequest) -> Result<Renewal, StoreError> {
        let names = self.names(&req.key);
        let out = self
            .run(
                &scripts::RENEW,
                &names,
                &[
                    &Member(&req.id),
                    &req.lease_ms,
                    &req.policy.default_limit,
                    &req.policy.max_limit,
                    &req.readd_weight.unwrap_or(0),
                    &self.offset(),
                ],
            )
            .await?;
        let [outcome, limit, in_flight, weight, expires_at_ms] = fields(&out)?;
        let grant = Grant {
            limit: Limit::from_u32(number(limit)?),
            in_flight: number(in_flight)?,
            weight: number(weight)?,
            expires_at_ms: number(expires_at_ms)?,
        };
        match outcome {
            1 => Ok(Renewal::Renewed(grant)),
            2 => Ok(Renewal::Readded(grant)),
            0 => Ok(Renewal::Lost),
            other => Err(StoreError::Protocol(format!(
                "renew answered outcome {other}"
            ))),
        }
    }

    async fn status_with(
        &self,
        key: &str,
        policy: Policy,
        new_limit: &str,
    ) -> Result<KeyStatus, StoreError> {
        let names = self.names(key);
        let out = self
            .run(
                &scripts::STATUS,
                &names,
                &[
                    &policy.default_limit,
                    &policy.max_limit,
                    &new_limit,
                    &self.offset(),
                ],
            )
            .await?;
        let [limit, override_limit, in_flight] = fields(&out)?;
        let override_limit: u32 = number(override_limit)?;
        Ok(KeyStatus {
            limit: Limit::from_u32(number(limit)?),
            override_limit: (override_limit > 0).then_some(override_limit),
            in_flight: number(in_flight)?,
        })
    }
}

/// A script argument.
trait ToArg: Sync {
    fn push(&self, invocation: &mut redis::ScriptInvocation<'_>);
}

impl<T: redis::ToRedisArgs + Sync> ToArg for T {
    fn push(&self, invocation: &mut redis::ScriptInvocation<'_>) {
        invocation.arg(self);
    }
}

fn fields<const N: usize>(out: &[i64]) -> Result<[i64; N], StoreError> {
    out.try_into().map_err(|_| {
        StoreError::Protocol(format!("expected {N} numbers from a script, got {out:?}"))
    })
}

fn number<T: TryFrom<i64>>(n: i64) -> Result<T, StoreError> {
    T::try_from(n).map_err(|_| StoreError::Protocol(format!("number out of range: {n}")))
}

impl Store for RedisStore {
    /// Asks Redis for a PONG.
    fn ping(&self) -> impl Future<Output = Result<(), StoreError>> + Send {
        let mut conn = self.conn.clone();
        self.at_home(async move {
            redis::cmd("PING").query_async::<()>(&mut conn).await?;
            Ok(())
        })
    }

    fn acquire(
        &self,
        req: AcquireRequest<'_>,
    ) -> impl Future<Output = Result<Admission, StoreError>> + Send {
        let weight = req.weight;
        let op = Op::Acquire {
            names: self.names(req.key),
            id: req.id.clone(),
            weight,
            lease_ms: req.lease_ms,
            policy: req.policy,
        };
        async move {
            let [decision, limit, in_flight, expires_at_ms, reclaimed] =
                self.batcher().run(op).await?;
            let reclaimed = number(reclaimed)?;
            match decision {
                1 => Ok(Admission::Admitted {
                    grant: Grant {
                        limit: Limit::from_u32(number(limit)?),
                        in_flight: number(in_flight)?,
                        weight,
                        expires_at_ms: number(expires_at_ms)?,
                    },
                    reclaimed,
                }),
                0 => Ok(Admission::Full {
                    limit: number(limit)?,
                    in_flight: number(in_flight)?,
                    reclaimed,
                }),
                2 => Ok(Admission::Unlimited),
                3 => Ok(Admission::TooHeavy {
                    limit: number(limit)?,
                }),
                other => Err(StoreError::Protocol(format!(
                    "acquire answered decision {other}"
                ))),
            }
        }
    }

    fn release(
        &self,
        key: &str,
        id: &PermitId,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send {
        let op = Op::Release {
            names: self.names(key),
            id: id.clone(),
        };
        async move {
            let [released, ..] = self.batcher().run(op).await?;
            Ok(released == 1)
        }
    }

    /// Queues the release for the next batch, like [`Store::release`] without a waiting caller.
    fn release_queued(
        &self,
        key: &str,
        id: &PermitId,
        done: ReleaseDone,
    ) -> Result<(), ReleaseDone> {
        let op = Op::Release {
            names: self.names(key),
            id: id.clone(),
        };
        self.batcher().queue_release(op, done);
        Ok(())
    }

    fn renew(
        &self,
        batch: &[RenewRequest],
    ) -> impl Future<Output = Result<Vec<Renewal>, StoreError>> + Send {
        // Sent together over the multiplexed connection: one pipelined burst, not one round trip each.
        let renewals = futures_util::future::join_all(batch.iter().map(|req| self.renew_one(req)));
        async move { renewals.await.into_iter().collect() }
    }

    fn status(
        &self,
        key: &str,
        policy: Policy,
    ) -> impl Future<Output = Result<KeyStatus, StoreError>> + Send {
        self.status_with(key, policy, "")
    }

    fn set_limit(
        &self,
        key: &str,
        limit: Option<u32>,
        policy: Policy,
    ) -> impl Future<Output = Result<KeyStatus, StoreError>> + Send {
        let new_limit = limit.unwrap_or(0).to_string();
        async move { self.status_with(key, policy, &new_limit).await }
    }
}

impl std::fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisStore")
            .field("target", &self.target)
            .field("prefix", &self.prefix)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A store used from runtime after runtime (each ended before the next starts) keeps one batcher.
    #[test]
    fn the_batchers_of_ended_runtimes_are_forgotten() {
        let home = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        // Nothing listens there; nothing here connects (connections are made on first use).
        let store = home.block_on(async {
            RedisStore::builder("redis://127.0.0.1:1")
                .batches_per_runtime(true)
                .open()
                .unwrap()
        });
        for _ in 0..3 {
            let store = store.clone();
            std::thread::spawn(move || {
                let runtime = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .unwrap();
                runtime.block_on(async {
                    let from_a_task = tokio::spawn(async move {
                        let batcher = store.batcher().into_owned();
                        tokio::task::yield_now().await; // its dispatcher runs
                        batcher
                    });
                    assert!(!from_a_task.await.unwrap().is_closed());
                });
            })
            .join()
            .unwrap();
        }
        let away = store.away.as_ref().unwrap();
        assert_eq!(
            away.len(),
            1,
            "only the last runtime's, until the next one comes"
        );
        assert!(away.iter().all(|batcher| batcher.is_closed()));
    }
}
