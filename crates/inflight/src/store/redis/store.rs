//! [`RedisStore`]: leases in inflight's own keys (`scripts/common.lua`), admissions and releases in
//! batches (`batch.rs`).

use std::fmt::Write;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;

use super::answer::{decision, Answer};
use super::batch::Batcher;
use super::connect::Conn;
use super::error::{invoke, retried};
use super::keeper::Metered;
use super::lane::ListingLane;
use super::naming::{KeyNames, Member};
use super::overrides::{Names, View};
use super::records::{Op, WaitArgs};
use super::scripts;
use crate::error::StoreError;
use crate::floors::Floors;
use crate::id::PermitId;
use crate::policy::{ClassLimits, Limit};
use crate::store::wake::{Turn, Wakes, Wakeups};
use crate::store::{
    AcquireRequest, Admission, Grant, IndexOp, KeyStatus, LocalAdmission, OverrideChange, Recorded,
    RenewRequest, Renewal, Store,
};

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
    pub(super) conn: Conn,
    pub(super) batcher: Batcher,
    /// The view of the keys with an override (`overrides.rs`), and the names of their index in Redis.
    pub(super) view: Arc<View>,
    pub(super) overrides: Arc<Names>,
    /// The view of the keys with a balance (`quota.rs`).
    pub(super) metered: Arc<Metered>,
    /// The most keys with an override (0: no bound).
    pub(super) max_overrides: usize,
    pub(super) prefix: Arc<str>,
    pub(super) target: Arc<str>,
    pub(super) wakes: Arc<Wakes>,
    /// Added to Redis `TIME` by every script; moved only by tests (`advance_clock`).
    pub(super) clock_offset_ms: Arc<AtomicI64>,
    /// Taken by a listing of busy keys for each page (`listing.rs`).
    pub(super) listing_lane: ListingLane,
}

impl RedisStore {
    /// Where the store connects (host:port or socket path; never credentials), for logs.
    pub fn target(&self) -> &str {
        &self.target
    }

    /// For tests of leases: every script of this handle and its clones reads Redis `TIME` plus `by` more
    /// than before (other handles on the same Redis are not moved).
    #[cfg(feature = "test-util")]
    pub fn advance_clock(&self, by: std::time::Duration) {
        let by = i64::try_from(crate::clock::millis(by)).unwrap_or(i64::MAX);
        self.clock_offset_ms.fetch_add(by, Ordering::SeqCst);
    }

    pub(super) fn offset(&self) -> i64 {
        self.clock_offset_ms.load(Ordering::Relaxed)
    }

    pub(super) fn names<K: AsRef<str>>(&self, keys: &[K]) -> Vec<KeyNames> {
        keys.iter()
            .map(|key| KeyNames::new(&self.prefix, key.as_ref(), self.conn.is_cluster()))
            .collect()
    }

    async fn renew_one(&self, req: &RenewRequest) -> Result<Renewal, StoreError> {
        match self.across(&self.names(&req.keys)) {
            Some(groups) => self.renew_across(req, groups).await,
            None => {
                let renewed = self.renew_keys(&req.keys, &req.limits, req, (None, req.counted));
                Ok(renewed.await?.0)
            }
        }
    }

    /// Renews `req`'s lease on `keys` (all of its keys, or those of one slot), of classes `limits`,
    /// re-adding it with `readd` (else `req`'s) when it is gone, `counted` saying which of `keys`
    /// recorded it at admission; and whether one of `keys` held it.
    pub(super) async fn renew_keys(
        &self,
        keys: &[Arc<str>],
        limits: &[ClassLimits],
        req: &RenewRequest,
        (readd, counted): (Option<u32>, u32),
    ) -> Result<(Renewal, bool), StoreError> {
        let mut invocation = scripts::RENEW.prepare_invoke();
        for names in self.names(keys) {
            names.declare(&mut invocation);
        }
        invocation
            .arg(Member(&req.id))
            .arg(req.lease_ms.unwrap_or(0))
            .arg(readd.or(req.readd_weight).unwrap_or(0))
            .arg(self.offset())
            .arg(req.token);
        for limits in limits {
            invocation.arg(format!("{} {}", limits.default_limit, limits.max_limit));
        }
        invocation.arg(counted);
        let out: Vec<i64> = invoke(&self.conn, &invocation).await?;
        let [outcome, limit, in_flight, weight, expires_at_ms, held, token] = fields(&out)?;
        let renewal = renewal_of([outcome, limit, in_flight, weight, expires_at_ms, token])?;
        Ok((renewal, held == 1))
    }
}

/// A renewal's answer (`renew.lua`'s numbers but `held`, `dify.lua`'s six): outcome (1 renewed,
/// 2 re-added, 0 lost), limit, in_flight, weight, expires_at_ms, token.
pub(super) fn renewal_of(
    [outcome, limit, in_flight, weight, expires_at_ms, token]: [i64; 6],
) -> Result<Renewal, StoreError> {
    let grant = Grant {
        limit: Limit::from_u32(number(limit)?),
        in_flight: number(in_flight)?,
        weight: number(weight)?,
        expires_at_ms: number(expires_at_ms)?,
        token: number(token)?,
        counted: 0,
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
pub(super) trait ToArg: Sync {
    fn push(&self, invocation: &mut redis::ScriptInvocation<'_>);
}

impl<T: redis::ToRedisArgs + Sync> ToArg for T {
    fn push(&self, invocation: &mut redis::ScriptInvocation<'_>) {
        invocation.arg(self);
    }
}

pub(super) fn fields<const N: usize>(out: &[i64]) -> Result<[i64; N], StoreError> {
    out.try_into().map_err(|_| {
        StoreError::Protocol(format!("expected {N} numbers from a script, got {out:?}"))
    })
}

pub(super) fn number<T: TryFrom<i64>>(n: i64) -> Result<T, StoreError> {
    T::try_from(n).map_err(|_| StoreError::Protocol(format!("number out of range: {n}")))
}

/// The most tickets in one key's queue (`queue.lua`'s MAX_TICKETS).
const MAX_TICKETS: u32 = 10_000;

/// An admission's answer (`batch.lua`'s, `dify.lua`'s), for a permit of `weight`.
pub(super) fn admission_of(answer: Answer, weight: u32) -> Result<Admission, StoreError> {
    let reclaimed = number(answer.reclaimed)?;
    let (index, limit, in_flight) = (answer.index, answer.limit, answer.in_flight);
    match answer.decision {
        decision::ADMITTED => Ok(Admission::Admitted {
            grant: Grant {
                limit: Limit::from_u32(number(limit)?),
                in_flight: number(in_flight)?,
                weight,
                expires_at_ms: number(answer.expires_at_ms)?,
                token: number(answer.token)?,
                counted: number(answer.counted)?,
            },
            reclaimed,
            shadowed: number(answer.shadowed)?,
        }),
        decision::FULL => Ok(Admission::Full {
            index: number(index)?,
            limit: number(limit)?,
            in_flight: number(in_flight)?,
            reclaimed,
        }),
        decision::WAITS => Ok(Admission::Queued {
            index: number(index)?,
            limit: number(limit)?,
            in_flight: number(in_flight)?,
            reclaimed,
        }),
        decision::WAITERS_BOUND => Err(StoreError::TooManyWaiters { max: MAX_TICKETS }),
        decision::UNLIMITED => Ok(Admission::Unlimited),
        decision::TOO_HEAVY => Ok(Admission::TooHeavy {
            index: number(index)?,
            limit: number(limit)?,
        }),
        other => Err(StoreError::Protocol(format!(
            "acquire answered decision {other}"
        ))),
    }
}

/// A waiter's ticket and the floors of `floors` (the classes of some of its keys, in their order) as
/// `batch.lua` takes them; `None` when it has neither.
pub(super) fn wait_args(req: &AcquireRequest<'_>, floors_of: &[Floors]) -> Option<WaitArgs> {
    let floored = floors_of.iter().any(|floors| !floors.is_empty());
    if req.ticket.is_none() && !floored {
        return None;
    }
    let mut floors = String::new();
    if floored {
        for (i, class) in floors_of.iter().enumerate() {
            if i > 0 {
                String::push(&mut floors, ';');
            }
            for (level, slots) in class.levels() {
                let _ = write!(floors, "{level}:{slots} ");
            }
        }
    }
    let ticket = req.ticket.as_ref();
    let handoff = ticket.is_some_and(|ticket| ticket.handoff) && req.keys.len() == 1 && !floored;
    Some(WaitArgs {
        ticket: ticket.map_or_else(String::new, |ticket| ticket.name.to_owned()),
        handoff,
        priority: req.priority,
        flow: ticket.map_or_else(String::new, |ticket| ticket.flow.to_owned()),
        flow_weight: ticket.map_or(1, |ticket| ticket.flow_weight),
        lease_ms: ticket.map_or(0, |ticket| ticket.lease_ms),
        floors,
    })
}

impl Store for RedisStore {
    async fn acquire(&self, req: AcquireRequest<'_>) -> Result<Admission, StoreError> {
        let names = self.names(req.keys);
        let terms = (req.weight, req.lease_ms, req.limits.to_vec());
        let id = req.id.clone();
        let reply = match self.across(&names) {
            Some(groups) => self.acquire_across(names, groups, &req, terms).await?,
            None => {
                self.batcher
                    .admit(Op::Acquire {
                        names,
                        id,
                        terms,
                        keep: 0,
                        generated: req.generated,
                        wait: wait_args(&req, req.floors),
                        holder: req.holder.map(Box::from),
                        shadow: req.shadow,
                    })
                    .await?
            }
        };
        self.wakes.count_expired(reply.tickets_expired);
        admission_of(reply, req.weight)
    }

    async fn release(
        &self,
        keys: &[Arc<str>],
        id: &PermitId,
        token: u64,
    ) -> Result<bool, StoreError> {
        let names = self.names(keys);
        let released = match self.across(&names) {
            Some(groups) => self.release_across(names, groups, id, token).await?,
            None => {
                let id = id.clone();
                self.batcher.run(Op::Release { names, id, token }).await?
            }
        };
        Ok(released)
    }

    async fn renew(&self, batch: &[RenewRequest]) -> Result<Vec<Renewal>, StoreError> {
        // Sent together over the multiplexed connection: one pipelined burst, not one round trip each.
        let renewals = futures_util::future::join_all(batch.iter().map(|req| self.renew_one(req)));
        renewals.await.into_iter().collect()
    }

    async fn status(
        &self,
        key: &str,
        limits: ClassLimits,
        change: OverrideChange,
    ) -> Result<KeyStatus, StoreError> {
        if self.conn.is_cluster() {
            return self.status_cluster(key, limits, change).await;
        }
        let (status, version) = self.status_in_slot(key, limits, change).await?;
        // Heard here at once, as of the index's version it left (the view never goes back); other
        // processes hear it through the index's channel.
        if change != OverrideChange::Keep {
            self.view
                .note(key, status.override_limit.is_some(), version);
        }
        Ok(status)
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
        let unlimited = limits.iter().all(ClassLimits::is_unlimited) && self.view.none_of(keys);
        unlimited.then_some(LocalAdmission::Decided(Admission::Unlimited))
    }

    async fn index(&self, id: &PermitId, op: IndexOp<'_>) -> Result<Option<Recorded>, StoreError> {
        self.index_op(id, op).await
    }

    async fn maintain(&self) -> Result<(), StoreError> {
        retried(|| {
            let mut conn = self.conn.clone();
            async move { redis::cmd("PING").query_async::<()>(&mut conn).await }
        })
        .await
    }
}

impl Wakeups for RedisStore {
    /// A ticket in the keys' queues (`queue.lua`), whose turn this handle hears on a channel of its own.
    fn ticket(&self) -> Option<Turn> {
        Some(self.wakes.ticket())
    }

    fn tickets_expired(&self) -> u64 {
        self.wakes.tickets_expired()
    }

    async fn leave(
        &self,
        keys: &[Arc<str>],
        ticket: &str,
        handed: Option<&PermitId>,
    ) -> Result<bool, StoreError> {
        let names = self.names(keys);
        match self.across(&names) {
            // (A waiter on keys of several slots is handed no slot.)
            Some(groups) => self.leave_across(&names, &groups, ticket).await,
            None => {
                let (ticket, handed) = (ticket.to_owned(), handed.cloned());
                let leave = Op::Leave {
                    names,
                    ticket,
                    handed,
                };
                self.batcher.run(leave).await
            }
        }
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
