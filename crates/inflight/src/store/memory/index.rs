//! The index of permits handed to remote callers: id -> keys, each entry ending after its ttl.

use dashmap::DashMap;

use super::key::Hasher;
use crate::error::StoreError;
use crate::id::PermitId;
use crate::store::{IndexOp, Keys};

/// The most entries the index holds: a bound on what remote callers can make it keep.
pub(super) const MAX_ENTRIES: usize = 1 << 20;

#[derive(Default)]
pub(super) struct Index {
    entries: DashMap<PermitId, (Keys, u64), Hasher>,
}

impl Index {
    pub(super) fn apply(
        &self,
        id: &PermitId,
        op: IndexOp<'_>,
        now: u64,
    ) -> Result<Option<Keys>, StoreError> {
        let live = |entry: &(Keys, u64)| entry.1 > now;
        match op {
            IndexOp::Put { keys, ttl_ms } => {
                if self.entries.len() >= MAX_ENTRIES && !self.entries.contains_key(id) {
                    self.sweep(now);
                    if self.entries.len() >= MAX_ENTRIES {
                        return Err(StoreError::Rejected(format!(
                            "the index of permits is full ({MAX_ENTRIES} entries)"
                        )));
                    }
                }
                let entry = (Keys::from(keys), now.saturating_add(ttl_ms));
                self.entries.insert(id.clone(), entry);
                Ok(None)
            }
            IndexOp::Get { ttl_ms } => {
                let Some(mut entry) = self.entries.get_mut(id) else {
                    return Ok(None);
                };
                if !live(&entry) {
                    drop(entry);
                    self.entries.remove_if(id, |_, entry| !live(entry));
                    return Ok(None);
                }
                entry.1 = now.saturating_add(ttl_ms);
                Ok(Some(entry.0.clone()))
            }
            IndexOp::Take => Ok(self
                .entries
                .remove(id)
                .filter(|(_, entry)| live(entry))
                .map(|(_, (keys, _))| keys)),
        }
    }

    /// Forgets the entries whose time is up.
    pub(super) fn sweep(&self, now: u64) {
        self.entries.retain(|_, entry| entry.1 > now);
    }
}
