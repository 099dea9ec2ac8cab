//! [`Standing`]: where an admission stands among others, as the store needs to know it.

use std::sync::Arc;

use crate::floors::Floors;
use crate::store::Ticket;

/// How long a waiter's place in a store's queue lasts unless it asks again (it does every
/// [`crate::RECHECK`]): a waiter in a process that is killed stops holding its place within this, in
/// milliseconds.
pub const TICKET_LEASE_MS: u64 = 3_000;

/// What the store's answer did with a waiter's ticket.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum TicketState {
    /// No ticket, or one the store did not keep (a store without queues, the failure policy's answer).
    Untaken,
    /// Refused as full: the ticket waits in the refusing key's queue.
    Queued,
    /// Admitted by the store, which took the ticket out of its queue.
    Admitted,
}

/// A waiter's ticket as its admissions carry it: its name, whether a release may hand it the slot
/// ([`Ticket::handoff`]), and whether no ask under the wait's id was made yet (the first is as an
/// admission under an id generated for it: no lease can hold the id).
#[derive(Clone, Debug)]
pub(super) struct Waiting {
    pub(super) name: Arc<str>,
    pub(super) handoff: bool,
    pub(super) fresh: bool,
}

/// Where an admission stands among others: a waiter's ticket and flow, its priority, the floors of its
/// keys' classes (none when no class has floors), and the label it is listed under.
#[derive(Clone, Default)]
pub(super) struct Standing {
    pub(super) ticket: Option<(Waiting, Option<Arc<str>>)>,
    pub(super) priority: u8,
    pub(super) flow_weight: u32,
    pub(super) floors: Option<Arc<[Floors]>>,
    /// The admission's label ([`crate::AcquireOptions::holder`]).
    pub(super) holder: Option<Arc<str>>,
    /// Which keys' classes are in shadow mode (bit i: key i).
    pub(super) shadow: u32,
}

impl Standing {
    pub(super) fn ticket(&self) -> Option<Ticket<'_>> {
        self.ticket.as_ref().map(|(waiting, flow)| Ticket {
            name: &waiting.name,
            handoff: waiting.handoff,
            flow: flow.as_deref().unwrap_or(""),
            flow_weight: self.flow_weight,
            lease_ms: TICKET_LEASE_MS,
        })
    }

    pub(super) fn floors(&self) -> &[Floors] {
        self.floors.as_deref().unwrap_or(&[])
    }
}
