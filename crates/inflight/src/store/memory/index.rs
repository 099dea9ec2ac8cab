//! The index of permits handed to remote callers: id -> keys, each entry ending after its ttl.

use dashmap::mapref::entry::Entry;
use dashmap::DashMap;

use super::hash::Hasher;
use crate::error::StoreError;
use crate::id::PermitId;
use crate::store::{IndexOp, Recorded};

/// The most entries the index holds: a bound on what remote callers can make it keep.
pub(super) const MAX_ENTRIES: usize = 1 << 18;

#[derive(Default)]
pub(super) struct Index {
    entries: DashMap<PermitId, (Recorded, u64), Hasher>,
}

impl Index {
    pub(super) fn apply(
        &self,
        id: &PermitId,
        op: IndexOp<'_>,
        now: u64,
    ) -> Result<Option<Recorded>, StoreError> {
        let live = |entry: &(Recorded, u64)| entry.1 > now;
        match op {
            IndexOp::Put {
                keys,
                lease_ms,
                ttl_ms,
                quota,
            } => {
                // Maintenance forgets the entries whose time is up.
                if self.entries.len() >= MAX_ENTRIES && !self.entries.contains_key(id) {
                    return Err(StoreError::Rejected(format!(
                        "the index of permits is full ({MAX_ENTRIES} entries)"
                    )));
                }
                let recorded = Recorded {
                    keys: keys.into(),
                    lease_ms,
                    quota: quota.map(Into::into),
                };
                let entry = (recorded, now.saturating_add(ttl_ms));
                match self.entries.entry(id.clone()) {
                    Entry::Occupied(held) if live(held.get()) && held.get().0.keys[..] != *keys => {
                        Err(StoreError::IdInUse)
                    }
                    Entry::Occupied(mut held) => {
                        held.insert(entry);
                        Ok(None)
                    }
                    Entry::Vacant(vacant) => {
                        vacant.insert(entry);
                        Ok(None)
                    }
                }
            }
            IndexOp::Get => Ok(self
                .entries
                .get(id)
                .filter(|entry| live(entry))
                .map(|entry| entry.0.clone())),
            IndexOp::Remove => {
                self.entries.remove(id);
                Ok(None)
            }
        }
    }

    /// Forgets the entries whose time is up.
    pub(super) fn sweep(&self, now: u64) {
        self.entries.retain(|_, entry| entry.1 > now);
    }
}
