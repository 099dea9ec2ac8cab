//! [`AcquireOptions`]: what a caller may ask of one admission.

use std::sync::Arc;
use std::time::Duration;

use crate::id::PermitId;

/// The lease of a permit unless [`crate::LimiterBuilder::lease`] or [`AcquireOptions::lease`] says otherwise.
pub const DEFAULT_LEASE: Duration = Duration::from_secs(30);

/// The longest lease a permit may have: renewals keep longer work alive.
pub const MAX_LEASE: Duration = Duration::from_secs(86_400);

/// The shortest lease a permit may have (what `inflight --lease` already required). A held lease is
/// renewed a third of the way through: at 100 ms that leaves about 67 ms for the renewal's round trip and
/// the scheduler, where 1 to 3 ms leases were measured lapsing while held on a busy machine. A lease
/// shorter than the store's response timeout (1 s by default) can still lapse during one slow renewal:
/// take several seconds where Redis may pause (a fork, a failover).
pub const MIN_LEASE: Duration = Duration::from_millis(100);

/// What a caller may ask of one admission; every field has a default.
///
/// ```
/// use inflight::AcquireOptions;
/// use std::time::Duration;
///
/// let options = AcquireOptions::new()
///     .id("request-42")
///     .weight(2)
///     .lease(Duration::from_secs(5));
/// # let _ = options;
/// ```
#[derive(Clone, Debug, Default)]
#[must_use]
pub struct AcquireOptions {
    pub(crate) id: Option<PermitId>,
    pub(crate) weight: Option<u32>,
    pub(crate) lease: Option<Duration>,
    pub(crate) max_wait: Option<Duration>,
    /// Where it queues, when anything of it is set: boxed, since most admissions set none of it and
    /// every future that carries the options (the proxy's, nested several deep) carries this.
    pub(crate) queue: Option<Box<Queueing>>,
    pub(crate) holder: Option<Arc<str>>,
}

/// Where a waiter queues: its priority level, its flow and the flow's weight.
#[derive(Clone, Debug, Default)]
pub(crate) struct Queueing {
    pub(crate) priority: u8,
    pub(crate) flow: Option<Arc<str>>,
    pub(crate) flow_weight: Option<u32>,
}

/// The longest flow name, in bytes.
pub const MAX_FLOW_LEN: usize = 256;

/// The largest weight of a flow ([`AcquireOptions::flow_weight`]).
pub const MAX_FLOW_WEIGHT: u32 = 1000;

impl AcquireOptions {
    /// The defaults: a generated id, weight 1, the limiter's lease.
    pub fn new() -> Self {
        Self::default()
    }

    /// The permit's id (for example the request's own id). Acquiring an id the key already holds counts
    /// once and refreshes its lease, so a retried call cannot count twice.
    pub fn id(mut self, id: impl Into<PermitId>) -> Self {
        self.id = Some(id.into());
        self
    }

    /// How many slots the permit takes (at least 1; default 1).
    pub fn weight(mut self, weight: u32) -> Self {
        self.weight = Some(weight);
        self
    }

    /// How long the lease lasts between renewals (default: the limiter's; outside [`MIN_LEASE`] (100 ms) to
    /// [`MAX_LEASE`] (24 h): [`crate::AcquireError::Invalid`]).
    pub fn lease(mut self, lease: Duration) -> Self {
        self.lease = Some(lease);
        self
    }

    /// How long [`crate::Limiter::acquire`] may wait for a slot (default: not at all).
    pub fn max_wait(mut self, wait: Duration) -> Self {
        self.max_wait = Some(wait);
        self
    }

    /// The waiter's priority level (default 0): where a key's waiters queue, higher levels are admitted
    /// first, and a request without a wait does not pass waiters of any level.
    pub fn priority(mut self, priority: u8) -> Self {
        self.queueing().priority = priority;
        self
    }

    /// The weight of the waiter's flow (default 1): within a round of its priority level, a flow of
    /// weight `w` is admitted up to `w` times for each turn of a flow of weight 1. From 1 to
    /// [`MAX_FLOW_WEIGHT`], else [`crate::AcquireError::Invalid`]. Give a flow the same weight in every
    /// request: each ticket takes the weight it is given.
    pub fn flow_weight(mut self, weight: u32) -> Self {
        self.queueing().flow_weight = Some(weight);
        self
    }

    /// The priority level asked for ([`AcquireOptions::priority`]; 0 unless set).
    pub fn priority_level(&self) -> u8 {
        self.queue.as_ref().map_or(0, |queue| queue.priority)
    }

    /// The waiter's flow (the tenant, say; default: the flow of waiters that name none): within a
    /// priority level, waiting flows are served in turn, so a flow with one waiter is not kept behind
    /// another's hundred. At most [`MAX_FLOW_LEN`] bytes, else [`crate::AcquireError::Invalid`].
    pub fn flow(mut self, flow: impl Into<Arc<str>>) -> Self {
        self.queueing().flow = Some(flow.into());
        self
    }

    /// A label for the permit (a client's address, a user), listed with its lease or its ticket
    /// ([`crate::Limiter::permits`]) so that an operator can tell holders apart: 1 to
    /// [`crate::store::MAX_HOLDER_LEN`] (128) bytes without control characters, else
    /// [`crate::AcquireError::Invalid`]. Shown to whoever may list holders: never a secret. A labelled
    /// permit always takes a lease, also in an in-process store.
    pub fn holder(mut self, holder: impl Into<Arc<str>>) -> Self {
        self.holder = Some(holder.into());
        self
    }

    /// Where it queues, made on first use.
    pub(crate) fn queueing(&mut self) -> &mut Queueing {
        self.queue.get_or_insert_with(Box::default)
    }

    /// Its flow, if set.
    pub(crate) fn flow_name(&self) -> Option<&Arc<str>> {
        self.queue.as_ref().and_then(|queue| queue.flow.as_ref())
    }
}
