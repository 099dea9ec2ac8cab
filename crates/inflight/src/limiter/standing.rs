//! [`Standing`]: where an admission stands among others, as the store needs to know it.

use std::sync::Arc;

use super::wait::TICKET_LEASE_MS;
use crate::floors::Floors;
use crate::store::Ticket;

/// Where an admission stands among others: a waiter's ticket (its name) and flow, its priority, and the
/// floors of its keys' classes (none when no class has floors).
#[derive(Clone, Default)]
pub(super) struct Standing {
    pub(super) ticket: Option<(Arc<str>, Option<Arc<str>>)>,
    pub(super) priority: u8,
    pub(super) flow_weight: u32,
    pub(super) floors: Option<Arc<[Floors]>>,
}

impl Standing {
    pub(super) fn ticket(&self) -> Option<Ticket<'_>> {
        self.ticket.as_ref().map(|(name, flow)| Ticket {
            name,
            flow: flow.as_deref().unwrap_or(""),
            flow_weight: self.flow_weight,
            lease_ms: TICKET_LEASE_MS,
        })
    }

    pub(super) fn floors(&self) -> &[Floors] {
        self.floors.as_deref().unwrap_or(&[])
    }
}
