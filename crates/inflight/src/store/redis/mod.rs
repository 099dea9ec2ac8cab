//! The Redis store: leases and overrides shared by every process that uses the same Redis.
//!
//! Every operation is one Lua script (`scripts/*.lua`, each with a header naming its KEYS and ARGV and
//! saying why it must be atomic), run with EVALSHA over a multiplexed connection that reconnects by
//! itself. Deadlines come from Redis `TIME`, one clock for every worker. All of a key's Redis keys share
//! one hash tag. Admissions and releases go in batches (`batch.rs`). One server, a Redis Cluster
//! (`cluster.rs`; keys of several slots: `across.rs`) or a primary under Sentinel, through one
//! connection type (`conn.rs`).

mod across;
mod batch;
mod builder;
mod busy;
mod cluster;
mod conn;
mod dify;
mod error;
mod index;
mod keys;
mod overrides;
mod quota;
mod scripts;
mod sentinel;
mod status;
mod wakeups;

use std::future::Future;
use std::sync::atomic::AtomicI64;
use std::sync::Arc;
use std::time::Duration;

use redis::Script;

pub use self::builder::RedisStoreBuilder;
pub use self::dify::Layout;

use self::batch::{Batcher, Op, Reply};
use self::conn::Conn;
use self::dify::Route;
use self::error::retried;
use self::keys::{KeyNames, Member};
use super::{
    AcquireRequest, Admission, Grant, IndexOp, KeyStatus, LocalAdmission, OverrideChange, Recorded,
    RenewRequest, Renewal, Store,
};
use crate::error::StoreError;
use crate::id::PermitId;
use crate::policy::{ClassLimits, Limit};
use crate::store::wake::{Interest, Wakes, Wakeups};

/// The prefix of every Redis key inflight writes unless [`RedisStoreBuilder::prefix`] says otherwise.
pub const DEFAULT_PREFIX: &str = "inflight:";

/// Leases and overrides in Redis. Clones share one connection and one batcher, and may be used from any
/// task of any runtime.
///
/// The data model is described in `scripts/common.lua`. Every process sharing a Redis (and a prefix)
/// must run a version that writes the same model (`CHANGELOG.md` lists changes to it).
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
    conn: Conn,
    batcher: Batcher,
    view: Arc<overrides::View>,
    names: Arc<overrides::Names>,
    /// The view of the keys with a balance (`quota.rs`).
    metered: Arc<quota::Metered>,
    /// The most keys with an override (0: no bound).
    max_overrides: usize,
    prefix: Arc<str>,
    target: Arc<str>,
    layout: Layout,
    wakes: Arc<Wakes>,
    /// How old a Dify worker's entry must be to be stale ([`Layout::Dify`]), ms.
    stale_ms: u64,
    /// Added to Redis `TIME` by every script; moved only by tests (`advance_clock`).
    clock_offset_ms: Arc<AtomicI64>,
}

impl RedisStore {
    /// Starts building a store for `url`.
    pub fn builder(url: impl Into<String>) -> RedisStoreBuilder {
        RedisStoreBuilder {
            url: url.into(),
            prefix: DEFAULT_PREFIX.to_owned(),
            response_timeout: Duration::from_secs(1),
            connection_timeout: Duration::from_secs(1),
            pipeline: 3,
            max_overrides: 0,
            layout: Layout::Inflight,
            stale_after: dify::DEFAULT_STALE_AFTER,
            wait: None,
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
    #[cfg(feature = "test-util")]
    pub fn advance_clock(&self, by: Duration) {
        let by = i64::try_from(crate::clock::millis(by)).unwrap_or(i64::MAX);
        self.clock_offset_ms
            .fetch_add(by, std::sync::atomic::Ordering::SeqCst);
    }

    fn offset(&self) -> i64 {
        self.clock_offset_ms
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    fn names<K: AsRef<str>>(&self, keys: &[K]) -> Vec<KeyNames> {
        keys.iter()
            .map(|key| KeyNames::new(&self.prefix, key.as_ref(), self.conn.is_cluster()))
            .collect()
    }

    /// On a cluster, the slot groups of `names` when they span more than one slot (`across.rs`).
    fn across(&self, names: &[KeyNames]) -> Option<Vec<Vec<usize>>> {
        if !self.conn.is_cluster() || names.len() < 2 {
            return None;
        }
        let groups = across::groups(names);
        (groups.len() > 1).then_some(groups)
    }

    /// Runs `script` on `keys` (declared three names each) with `args`, retried once on a dead connection.
    async fn run<K: AsRef<str>>(
        &self,
        script: &'static Script,
        keys: &[K],
        args: &[&dyn ToArg],
    ) -> Result<Vec<i64>, StoreError> {
        let mut invocation = script.prepare_invoke();
        for names in self.names(keys) {
            names.declare(&mut invocation);
        }
        for arg in args {
            arg.push(&mut invocation);
        }
        let invocation = &invocation;
        retried(|| {
            let mut conn = self.conn.clone();
            async move { invocation.invoke_async(&mut conn).await }
        })
        .await
    }

    async fn renew_one(&self, req: &RenewRequest) -> Result<Renewal, StoreError> {
        if self.layout == Layout::Dify {
            return self.dify_renew(req).await;
        }
        match self.across(&self.names(&req.keys)) {
            Some(groups) => self.renew_across(req, groups).await,
            None => Ok(self.renew_keys(&req.keys, &req.limits, req, None).await?.0),
        }
    }

    /// Renews `req`'s lease on `keys` (all of its keys, or those of one slot), of classes `limits`,
    /// re-adding it with `readd` (else `req`'s) when it is gone; and whether one of `keys` held it.
    async fn renew_keys(
        &self,
        keys: &[Arc<str>],
        limits: &[ClassLimits],
        req: &RenewRequest,
        readd: Option<u32>,
    ) -> Result<(Renewal, bool), StoreError> {
        let limits: Vec<String> = limits
            .iter()
            .map(|limits| format!("{} {}", limits.default_limit, limits.max_limit))
            .collect();
        let (id, lease_ms, readd, offset) = (
            Member(&req.id),
            req.lease_ms.unwrap_or(0),
            readd.or(req.readd_weight).unwrap_or(0),
            self.offset(),
        );
        let mut args: Vec<&dyn ToArg> = vec![&id, &lease_ms, &readd, &offset];
        args.extend(limits.iter().map(|limits| limits as &dyn ToArg));
        let out = self.run(&scripts::RENEW, keys, &args).await?;
        let [outcome, limit, in_flight, weight, expires_at_ms, held] = fields(&out)?;
        let renewal = renewal_of([outcome, limit, in_flight, weight, expires_at_ms])?;
        Ok((renewal, held == 1))
    }
}

/// A renewal's answer (`renew.lua`'s first five numbers, `dify.lua`'s five): outcome (1 renewed,
/// 2 re-added, 0 lost), limit, in_flight, weight, expires_at_ms.
fn renewal_of(
    [outcome, limit, in_flight, weight, expires_at_ms]: [i64; 5],
) -> Result<Renewal, StoreError> {
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

/// A script argument (`ToRedisArgs` itself cannot be a trait object).
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
    fn acquire(
        &self,
        req: AcquireRequest<'_>,
    ) -> impl Future<Output = Result<Admission, StoreError>> + Send {
        let route = match self.layout {
            Layout::Dify => Route::Dify(self.dify_acquire(&req)),
            Layout::Inflight => Route::Batch(self.names(req.keys)),
        };
        let terms = (req.weight, req.lease_ms, req.limits.to_vec());
        let (weight, id) = (req.weight, req.id.clone());
        async move {
            let reply: Reply = match route {
                Route::Dify(call) => self.dify_reply(call?).await?,
                Route::Batch(names) => match self.across(&names) {
                    Some(groups) => self.acquire_across(names, groups, &id, terms).await?,
                    None => self.batcher.run(Op::Acquire { names, id, terms }).await?,
                },
            };
            let [decision, index, limit, in_flight, expires_at_ms, reclaimed] = reply;
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
                    index: number(index)?,
                    limit: number(limit)?,
                    in_flight: number(in_flight)?,
                    reclaimed,
                }),
                2 => Ok(Admission::Unlimited),
                3 => Ok(Admission::TooHeavy {
                    index: number(index)?,
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
        keys: &[Arc<str>],
        id: &PermitId,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send {
        let route = match self.layout {
            Layout::Dify => Route::Dify(self.dify_call("r", keys, id, 0, "", &[])),
            Layout::Inflight => Route::Batch(self.names(keys)),
        };
        let id = id.clone();
        async move {
            let released = match route {
                Route::Dify(call) => self.dify_reply(call?).await?[0],
                Route::Batch(names) => match self.across(&names) {
                    Some(groups) => i64::from(self.release_across(names, groups, &id).await?),
                    None => self.batcher.run(Op::Release { names, id }).await?[0],
                },
            };
            // Heard here at once; other processes hear it through the key's channel.
            if released == 1 {
                keys.iter().for_each(|key| self.wakes.wake(key));
            }
            Ok(released == 1)
        }
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
        limits: ClassLimits,
        change: OverrideChange,
    ) -> impl Future<Output = Result<KeyStatus, StoreError>> + Send {
        self.status_with(key, limits, change)
    }

    /// Keys whose classes are unlimited, none with an override in the view: admitted with no I/O.
    #[inline]
    fn hold(
        &self,
        keys: &[&str],
        limits: &[ClassLimits],
        _weight: u32,
        _given_id: bool,
    ) -> Option<LocalAdmission> {
        // (Dify's workers write limits the view never hears of: every admission asks Redis.)
        let unlimited = self.layout == Layout::Inflight
            && limits.iter().all(ClassLimits::is_unlimited)
            && self.view.none_of(keys);
        unlimited.then_some(LocalAdmission::Decided(Admission::Unlimited))
    }

    fn index(
        &self,
        id: &PermitId,
        op: IndexOp<'_>,
    ) -> impl Future<Output = Result<Option<Recorded>, StoreError>> + Send {
        self.index_op(id, op)
    }

    /// Asks Redis for a PONG.
    fn maintain(&self) -> impl Future<Output = Result<(), StoreError>> + Send {
        retried(|| {
            let mut conn = self.conn.clone();
            async move { redis::cmd("PING").query_async::<()>(&mut conn).await }
        })
    }
}

impl Wakeups for RedisStore {
    /// Woken by releases of this handle at once, and by those of every other process through the key's
    /// channel (subscribed while the interest lives).
    fn interest(&self, key: &str) -> Interest {
        self.wakes.interest(key)
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
