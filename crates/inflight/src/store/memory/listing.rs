//! [`BusyKeys`] in memory: a walk over at most [`MAX_EXAMINED`] keys that never holds the admission
//! path for long. One pass over the map copies out the cells under the prefix (each shard read-locked
//! only while it is walked, no cell locked meanwhile); then the cells are read in turns of
//! [`CELLS_PER_TURN`], each locked briefly, the task yielding to the runtime between turns, so that the
//! admissions its thread serves go on while a listing runs.

use std::sync::Arc;

use super::cell::Cell;
use super::MemoryStore;
use crate::clock::Clock;
use crate::error::StoreError;
use crate::store::busy::{busiest, BusyKey, BusyKeys, BusyList, MAX_EXAMINED};

/// How many cells a listing reads between two yields to the runtime (tens of microseconds of work).
pub(crate) const CELLS_PER_TURN: usize = 256;

impl<C: Clock> MemoryStore<C> {
    /// The cells of the keys under `prefix` among the first [`MAX_EXAMINED`] keys of the map, and
    /// whether the walk stopped there.
    fn cells_under(&self, prefix: &str) -> (Vec<Arc<Cell<C>>>, bool) {
        let mut cells: Vec<Arc<Cell<C>>> = Vec::new();
        for (examined, entry) in self.inner.keys.iter().enumerate() {
            if examined == MAX_EXAMINED {
                return (cells, true);
            }
            if entry.key().starts_with(prefix) {
                cells.push(entry.value().clone());
            }
        }
        (cells, false)
    }
}

impl<C: Clock> BusyKeys for MemoryStore<C> {
    /// Counts this process's permits (they hold their slots without a lease) and unexpired leases.
    async fn busy(&self, prefix: &str, limit: usize) -> Result<BusyList, StoreError> {
        let (cells, truncated) = self.cells_under(prefix);
        let mut found = Vec::new();
        for turn in cells.chunks(CELLS_PER_TURN) {
            tokio::task::yield_now().await;
            let now = self.inner.time.now_ms();
            found.extend(turn.iter().filter_map(|cell| {
                let state = cell.lock();
                let in_flight = state.live(now);
                (in_flight > 0).then(|| BusyKey {
                    key: cell.key.clone(),
                    in_flight,
                    override_limit: state.override_limit,
                })
            }));
        }
        Ok(busiest(found, limit, truncated))
    }
}
