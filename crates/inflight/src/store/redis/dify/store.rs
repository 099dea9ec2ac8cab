//! [`DifyStore`]: leases in Dify's own `RateLimit` keys, so that inflight and unmodified Dify workers
//! enforce one cap on one Redis while a deployment moves over (`docs/dify.md`, section 3).
//!
//! Per app key `K` it shares Dify's hash `dify:rate_limit:K:active_requests` (request id -> epoch
//! seconds; its length is the count, Dify's entries and inflight's together) and the string
//! `dify:rate_limit:K:max_active_requests` (the app's limit, read as the key's override), both named
//! `<prefix>:dify:...` under Dify's `REDIS_KEY_PREFIX`
//! ([`DifyStoreBuilder::key_prefix`](crate::DifyStoreBuilder::key_prefix)); beside them, inflight's
//! leases of its own entries (`scripts/dify.lua` names every key). Against [`RedisStore`]:
//!
//! - Every permit weighs 1; a heavier one is [`StoreError::Unsupported`], and so is a key with `{` or `}`.
//! - No Redis Cluster (an app's two Dify keys hash to different slots); opening one there is refused.
//! - No listing of busy keys ([`BusyKeys`] answers [`StoreError::Unsupported`]).
//! - Waiters queue as on [`RedisStore`], in keys of inflight's own beside Dify's hash (`{H}:queue`, ...),
//!   and a release hands the head the slot as there (its entry written in the hash, token 0); a Dify
//!   worker's request never waits, and so never queues (nor does its exit hand a slot on).
//! - No batches, and every admission asks Redis, unlimited keys included (Dify's workers write limits
//!   that no view in this process hears of).
//! - A Dify worker's entry older than the stale age (default 600 s) is evicted, only by an admission
//!   that needs its slot; inflight's entries are refreshed by every renewal, so Dify never evicts one.
//! - An override set here is written where Dify's workers also write it; theirs wins when they next do.
//! - No fencing tokens: Dify's entries keep none (its workers neither give nor check one), so every
//!   token is 0 and a release or renewal acts on whatever lease the id holds.
//!
//! The rest is the plain store's, under its prefix: the index of remote permits, quotas, the health
//! check and the tests' clock.

use std::sync::Arc;

use redis::ScriptInvocation;

use crate::error::StoreError;
use crate::id::PermitId;
use crate::policy::ClassLimits;
use crate::store::busy::{BusyKeys, BusyList};
use crate::store::holders::{Holders, PermitPage};
use crate::store::redis::answer::Answer;
use crate::store::redis::error::invoke;
use crate::store::redis::scripts;
use crate::store::redis::status::{change_arg, status_of};
use crate::store::redis::store::{admission_of, fields, renewal_of, RedisStore};
use crate::store::wake::{Turn, Wakeups};
use crate::store::{
    AcquireRequest, Admission, IndexOp, KeyStatus, OverrideChange, Recorded, RenewRequest, Renewal,
    Store,
};

/// Leases in Dify's keys, shared with Dify's workers (see the module's doc for the trade-offs). Clones
/// share one connection.
///
/// ```no_run
/// use inflight::{DifyStore, Limiter, Policy};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let store = DifyStore::builder("redis://127.0.0.1:6379").open()?;
/// let limiter = Limiter::builder(store).policy(Policy::new(4, 0)).build();
/// let permit = limiter.try_acquire("5f7c8e4a-app-id").await?;
/// # drop(permit);
/// # Ok(())
/// # }
/// ```
#[derive(Clone, Debug)]
pub struct DifyStore {
    /// The connection, the prefix of inflight's own keys, the waiters' turns and
    /// everything this store does as the plain one does.
    pub(crate) plain: RedisStore,
    /// How old a Dify worker's entry must be to be stale, ms.
    pub(super) stale_ms: u64,
    /// Dify's `REDIS_KEY_PREFIX` and its colon ("" without one), before both of Dify's names.
    pub(super) key_prefix: Arc<str>,
}

/// Dify's hash of `key`'s active requests, as Dify's `RedisClientWrapper` names it: `key_prefix` is
/// `REDIS_KEY_PREFIX` and its colon, or "" (the wrapper prefixes the name given to `hlen`/`hset`/`hdel`).
pub(super) fn active_requests(key_prefix: &str, key: &str) -> String {
    format!("{key_prefix}dify:rate_limit:{key}:active_requests")
}

impl DifyStore {
    /// For tests of leases: as `RedisStore::advance_clock` does.
    #[cfg(feature = "test-util")]
    pub fn advance_clock(&self, by: std::time::Duration) {
        self.plain.advance_clock(by);
    }

    /// Prepares `op` ('a', 'r', 'n', 's' or 'l') on `keys` for `id`; `extra` is ARGV[6] (see `dify.lua`).
    fn call<K: AsRef<str>>(
        &self,
        op: &str,
        keys: &[K],
        id: &PermitId,
        lease_ms: u64,
        extra: &str,
        limits: &[ClassLimits],
    ) -> Result<ScriptInvocation<'static>, StoreError> {
        let mut invocation = scripts::DIFY.prepare_invoke();
        for key in keys {
            let key = key.as_ref();
            if key.contains(['{', '}']) {
                return Err(StoreError::Unsupported(format!(
                    "the Dify layout takes no key with braces: {key:?}"
                )));
            }
            let hash = active_requests(&self.key_prefix, key);
            invocation
                .key(&hash)
                .key(format!("{{{hash}}}:leases"))
                .key(format!("{{{hash}}}:lease_ms"))
                .key(format!(
                    "{}dify:rate_limit:{key}:max_active_requests",
                    self.key_prefix
                ));
        }
        invocation
            .arg(op)
            .arg(id.to_string())
            .arg(self.plain.offset())
            .arg(lease_ms)
            .arg(self.stale_ms)
            .arg(extra);
        for limits in limits {
            invocation.arg(format!("{} {}", limits.default_limit, limits.max_limit));
        }
        Ok(invocation)
    }

    /// Runs a prepared call, retried once on a dead connection.
    async fn run(&self, invocation: ScriptInvocation<'static>) -> Result<Vec<i64>, StoreError> {
        invoke(&self.plain.conn, &invocation).await
    }

    async fn renew_one(&self, req: &RenewRequest) -> Result<Renewal, StoreError> {
        let readd = if req.readd_weight.unwrap_or(0) > 0 {
            "1"
        } else {
            "0"
        };
        let lease_ms = req.lease_ms.unwrap_or(0);
        let call = self.call("n", &req.keys, &req.id, lease_ms, readd, &req.limits)?;
        let [outcome, limit, in_flight, weight, expires_at_ms] = fields(&self.run(call).await?)?;
        // No tokens: Dify's entries keep none (see the module's doc).
        renewal_of([outcome, limit, in_flight, weight, expires_at_ms, 0])
    }
}

impl Store for DifyStore {
    async fn acquire(&self, req: AcquireRequest<'_>) -> Result<Admission, StoreError> {
        if req.weight != 1 {
            return Err(StoreError::Unsupported(
                "the Dify layout counts every permit as one: weights must be 1".into(),
            ));
        }
        if req.shadow != 0 {
            return Err(StoreError::Unsupported(
                "shadow limits under the Dify layout (its hash is Dify's count, which it enforces)"
                    .into(),
            ));
        }
        let mut call = self.call("a", req.keys, req.id, req.lease_ms, "", req.limits)?;
        if let Some(ticket) = &req.ticket {
            call.arg(ticket.name)
                .arg(format!("{}:{}", req.priority, ticket.flow_weight))
                .arg(ticket.flow)
                .arg(ticket.lease_ms);
            // A release may hand it the slot (`dify.lua` admits it as `batch.lua`'s flags 8 do).
            if ticket.handoff && req.keys.len() == 1 {
                call.arg("1");
            }
        }
        let answer = Answer::read(&self.run(call).await?)?;
        self.plain.wakes.count_expired(answer.tickets_expired);
        admission_of(answer, req.weight)
    }

    /// By id alone: Dify's entries keep no token (see the module's doc).
    async fn release(
        &self,
        keys: &[Arc<str>],
        id: &PermitId,
        _token: u64,
    ) -> Result<bool, StoreError> {
        let call = self.call("r", keys, id, 0, "", &[])?;
        let [released] = fields(&self.run(call).await?)?;
        Ok(released == 1)
    }

    async fn renew(&self, batch: &[RenewRequest]) -> Result<Vec<Renewal>, StoreError> {
        let renewals = futures_util::future::join_all(batch.iter().map(|req| self.renew_one(req)));
        renewals.await.into_iter().collect()
    }

    async fn status(
        &self,
        key: &str,
        limits: ClassLimits,
        change: OverrideChange,
    ) -> Result<KeyStatus, StoreError> {
        let id = PermitId::from("");
        let mut call = self.call("s", &[key], &id, 0, &change_arg(change), &[limits])?;
        call.key(&self.plain.overrides.index)
            .arg(self.plain.max_overrides)
            .arg(key);
        status_of(&self.run(call).await?)
    }

    async fn index(&self, id: &PermitId, op: IndexOp<'_>) -> Result<Option<Recorded>, StoreError> {
        self.plain.index(id, op).await
    }

    async fn maintain(&self) -> Result<(), StoreError> {
        self.plain.maintain().await
    }
}

impl Wakeups for DifyStore {
    /// A ticket in the queues beside Dify's hashes (`dify.lua`), as [`RedisStore`]'s.
    fn ticket(&self) -> Option<Turn> {
        self.plain.ticket()
    }

    fn tickets_expired(&self) -> u64 {
        self.plain.tickets_expired()
    }

    /// A lease `handed` names (a slot a release handed the ticket before its waiter heard) is released
    /// when the ticket is no longer queued, as every store does.
    async fn leave(
        &self,
        keys: &[Arc<str>],
        ticket: &str,
        handed: Option<&PermitId>,
    ) -> Result<bool, StoreError> {
        let call = self.call("l", keys, &PermitId::from(ticket), 0, "", &[])?;
        let [left] = fields(&self.run(call).await?)?;
        if let (0, Some(id)) = (left, handed) {
            self.release(keys, id, 0).await?;
        }
        Ok(left == 1)
    }
}

impl BusyKeys for DifyStore {
    /// [`StoreError::Unsupported`]: the count is the length of a hash of Dify's, which no scan reads.
    async fn busy(&self, _prefix: &str, _limit: usize) -> Result<BusyList, StoreError> {
        Err(StoreError::Unsupported(
            "listing busy keys under the Dify layout".into(),
        ))
    }
}

/// [`StoreError::Unsupported`]: Dify's hash holds request ids and times, written by Dify's workers too,
/// which a revocation could not reach.
impl Holders for DifyStore {
    async fn permits(&self, _key: &str, _cursor: Option<&str>) -> Result<PermitPage, StoreError> {
        Err(unsupported())
    }

    async fn revoke(&self, _key: &str, _id: &PermitId) -> Result<bool, StoreError> {
        Err(unsupported())
    }

    async fn revoke_waiter(&self, _key: &str, _ticket: &str) -> Result<bool, StoreError> {
        Err(unsupported())
    }
}

fn unsupported() -> StoreError {
    StoreError::Unsupported("listing and revoking holders under the Dify layout".into())
}
