//! [`BusyKeys`] in memory: a walk over at most [`MAX_EXAMINED`] keys, each locked briefly.

use std::future::{ready, Future};
use std::sync::Arc;

use super::cell::Cell;
use super::MemoryStore;
use crate::clock::Clock;
use crate::error::StoreError;
use crate::store::busy::{busiest, BusyKey, BusyKeys, BusyList, MAX_EXAMINED};

impl<C: Clock> MemoryStore<C> {
    fn busy_now(&self, prefix: &str, limit: usize) -> BusyList {
        // The cells first (no cell is locked while the map's shards are), then each one on its own.
        let mut cells: Vec<Arc<Cell<C>>> = Vec::new();
        let mut truncated = false;
        for (examined, entry) in self.inner.keys.iter().enumerate() {
            if examined == MAX_EXAMINED {
                truncated = true;
                break;
            }
            if entry.key().starts_with(prefix) {
                cells.push(entry.value().clone());
            }
        }
        let now = self.inner.time.now_ms();
        let found = cells
            .iter()
            .filter_map(|cell| {
                let state = cell.lock();
                let in_flight = state.live(now);
                (in_flight > 0).then(|| BusyKey {
                    key: cell.key.clone(),
                    in_flight,
                    override_limit: state.override_limit,
                })
            })
            .collect();
        busiest(found, limit, truncated)
    }
}

impl<C: Clock> BusyKeys for MemoryStore<C> {
    /// Counts this process's permits (they hold their slots without a lease) and unexpired leases.
    fn busy(
        &self,
        prefix: &str,
        limit: usize,
    ) -> impl Future<Output = Result<BusyList, StoreError>> + Send {
        ready(Ok(self.busy_now(prefix, limit)))
    }
}
