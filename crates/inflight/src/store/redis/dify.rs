//! [`Layout::Dify`]: Dify's own keys, so that inflight and unmodified Dify workers enforce one cap while a
//! deployment moves over (`scripts/dify.lua` describes the keys).

use std::time::Duration;

use redis::ScriptInvocation;

use super::batch::Reply;
use super::error::retried;
use super::status::{change_arg, status_of};
use super::{fields, renewal_of, scripts, RedisStore};
use crate::error::StoreError;
use crate::id::PermitId;
use crate::policy::ClassLimits;
use crate::store::{AcquireRequest, KeyStatus, OverrideChange, RenewRequest, Renewal};

/// How a [`RedisStore`](super::RedisStore) names and keeps its keys.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum Layout {
    /// inflight's own: a sorted set of leases per key, all of a key's names in one hash tag
    /// (`scripts/common.lua`).
    #[default]
    Inflight,
    /// Dify's `RateLimit` keys: `dify:rate_limit:{key}:active_requests` (request id -> epoch seconds;
    /// its length is the count) and `dify:rate_limit:{key}:max_active_requests` (the key's limit, read as
    /// its override), beside inflight's leases for its own entries. Every permit weighs 1; keys may not
    /// contain `{` or `}`. The key layout of a migration: see `docs/dify.md`.
    Dify,
}

/// The age after which a Dify worker's entry (one with no lease of inflight's) is stale: Dify's own.
pub(super) const DEFAULT_STALE_AFTER: Duration = Duration::from_secs(600);

/// One call of `dify.lua`, its keys and arguments so far.
pub(super) struct Call {
    pub(super) invocation: ScriptInvocation<'static>,
}

impl RedisStore {
    /// Prepares `op` ('a', 'r', 'n' or 's') on `keys` for `id`; `extra` is ARGV[6] (see `dify.lua`).
    pub(super) fn dify_call<K: AsRef<str>>(
        &self,
        op: &str,
        keys: &[K],
        id: &PermitId,
        lease_ms: u64,
        extra: &str,
        limits: &[ClassLimits],
    ) -> Result<Call, StoreError> {
        let mut invocation = scripts::DIFY.prepare_invoke();
        for key in keys {
            let key = key.as_ref();
            if key.contains(['{', '}']) {
                return Err(StoreError::Unsupported(format!(
                    "the Dify layout takes no key with braces: {key:?}"
                )));
            }
            let hash = format!("dify:rate_limit:{key}:active_requests");
            invocation
                .key(&hash)
                .key(format!("{{{hash}}}:leases"))
                .key(format!("{{{hash}}}:lease_ms"))
                .key(format!("dify:rate_limit:{key}:max_active_requests"));
        }
        invocation
            .arg(op)
            .arg(id.to_string())
            .arg(self.offset())
            .arg(lease_ms)
            .arg(self.stale_ms)
            .arg(extra);
        for limits in limits {
            invocation.arg(format!("{} {}", limits.default_limit, limits.max_limit));
        }
        Ok(Call { invocation })
    }

    /// Runs a prepared call, retried once on a dead connection.
    pub(super) async fn dify_run(&self, call: Call) -> Result<Vec<i64>, StoreError> {
        let invocation = &call.invocation;
        retried(|| {
            let mut conn = self.conn.clone();
            async move { invocation.invoke_async(&mut conn).await }
        })
        .await
    }
}

/// Where an admission or a release goes: into a batch (inflight's layout), or a call of its own.
pub(super) enum Route {
    Batch(Vec<super::keys::KeyNames>),
    Dify(Result<Call, StoreError>),
}

impl RedisStore {
    /// The call of an admission (weights other than 1 refused: every entry counts one).
    pub(super) fn dify_acquire(&self, req: &AcquireRequest<'_>) -> Result<Call, StoreError> {
        if req.weight != 1 {
            return Err(StoreError::Unsupported(
                "the Dify layout counts every permit as one: weights must be 1".into(),
            ));
        }
        self.dify_call("a", req.keys, req.id, req.lease_ms, "", req.limits)
    }

    /// Runs an admission's or a release's call; its answer as a batch's (a release's first).
    pub(super) async fn dify_reply(&self, call: Call) -> Result<Reply, StoreError> {
        let mut reply = [0; 6];
        let out = self.dify_run(call).await?;
        if out.len() > reply.len() {
            return Err(StoreError::Protocol(format!("dify.lua answered {out:?}")));
        }
        reply[..out.len()].copy_from_slice(&out);
        Ok(reply)
    }

    pub(super) async fn dify_renew(&self, req: &RenewRequest) -> Result<Renewal, StoreError> {
        let readd = if req.readd_weight.unwrap_or(0) > 0 {
            "1"
        } else {
            "0"
        };
        let lease_ms = req.lease_ms.unwrap_or(0);
        let call = self.dify_call("n", &req.keys, &req.id, lease_ms, readd, &req.limits)?;
        renewal_of(fields(&self.dify_run(call).await?)?)
    }

    pub(super) async fn dify_status(
        &self,
        key: &str,
        limits: ClassLimits,
        change: OverrideChange,
    ) -> Result<KeyStatus, StoreError> {
        let id = PermitId::from("");
        let mut call = self.dify_call("s", &[key], &id, 0, &change_arg(change), &[limits])?;
        call.invocation
            .key(&self.names.index)
            .arg(self.max_overrides)
            .arg(key);
        status_of(&self.dify_run(call).await?)
    }
}
