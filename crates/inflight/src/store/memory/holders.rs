//! [`Holders`] in memory: a key's leases and tickets read under its cell's lock, a page at a time.

use super::MemoryStore;
use crate::clock::Clock;
use crate::error::StoreError;
use crate::id::PermitId;
use crate::store::holders::{Holder, Holders, PermitPage, MAX_PAGE, REVOKED_GRACE_MS};

impl<C: Clock> Holders for MemoryStore<C> {
    /// Holders in order of admission (then id); the cursor is the last one listed, `ms:id`.
    async fn permits(&self, key: &str, cursor: Option<&str>) -> Result<PermitPage, StoreError> {
        let after = match cursor {
            None | Some("") => None,
            Some(text) => Some(parse(text).ok_or_else(|| {
                StoreError::Rejected(format!("not a cursor of this listing: {text:?}"))
            })?),
        };
        let page = self.locked(&[key], false, false, |slots, now, _| {
            let Some(slot) = slots.first() else {
                return PermitPage::default();
            };
            let state = &slot.state;
            let mut holders: Vec<(u64, String, Holder)> = state
                .leases(now)
                .map(|(id, lease)| {
                    let holder = Holder {
                        id: id.clone(),
                        token: lease.token,
                        weight: lease.weight,
                        admitted_at_ms: lease.admitted_at_ms,
                        lease_expires_at_ms: lease.expires_at_ms,
                        holder: state.labels.get(id).cloned(),
                    };
                    (lease.admitted_at_ms, id.to_string(), holder)
                })
                .filter(|(at, id, _)| {
                    after
                        .as_ref()
                        .is_none_or(|(after_at, after_id)| (*at, id) > (*after_at, after_id))
                })
                .collect();
            holders.sort_by(|a, b| (a.0, &a.1).cmp(&(b.0, &b.1)));
            let more = holders.len() > MAX_PAGE;
            holders.truncate(MAX_PAGE);
            let cursor = more
                .then(|| holders.last().map(|(at, id, _)| format!("{at}:{id}")))
                .flatten();
            let first = after.is_none();
            PermitPage {
                holders: holders.into_iter().map(|(_, _, holder)| holder).collect(),
                waiters: match (first, state.queue()) {
                    (true, Some(queue)) => queue.waiters().take(MAX_PAGE).collect(),
                    _ => Vec::new(),
                },
                unlisted: if first { state.unleased() } else { 0 },
                cursor,
            }
        });
        Ok(page)
    }

    async fn revoke(&self, key: &str, id: &PermitId) -> Result<bool, StoreError> {
        let mut called = Vec::new();
        let time = &self.inner.time;
        let revoked = self.locked(&[key], false, false, |slots, now, _| {
            let Some(slot) = slots.first_mut() else {
                return false;
            };
            let Some(lease) = slot.state.lease(id) else {
                return false;
            };
            let forget_at = lease.expires_at_ms.saturating_add(REVOKED_GRACE_MS);
            slot.state.revoke(id, now, forget_at);
            let token = || time.token(now);
            called.extend(slot.state.called_after_release(lease.weight, now, token));
            true
        });
        self.inner.wakes.wake_tickets(&called);
        Ok(revoked)
    }

    async fn revoke_waiter(&self, key: &str, ticket: &str) -> Result<bool, StoreError> {
        let mut called = Vec::new();
        let left = self.locked(&[key], false, false, |slots, _, _| {
            let Some(slot) = slots.first_mut() else {
                return false;
            };
            let head = slot.state.leave_ticket(ticket, false);
            if head == Some(true) {
                called.extend(slot.state.called(1));
            }
            head.is_some()
        });
        if left {
            self.inner.wakes.revoke_ticket(ticket);
        }
        self.inner.wakes.wake_tickets(&called);
        Ok(left)
    }
}

/// `ms:id`, as [`Holders::permits`] writes its cursor.
fn parse(text: &str) -> Option<(u64, String)> {
    let (at, id) = text.split_once(':')?;
    Some((at.parse().ok()?, id.to_owned()))
}
