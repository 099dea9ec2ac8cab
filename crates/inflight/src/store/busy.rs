//! Busy keys: the keys with permits in flight now, busiest first, found with bounded work (a capability
//! beyond [`Store`], as [`crate::Wakeups`] is).

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use super::Store;
use crate::error::StoreError;

/// The most keys one listing answers with; a larger `limit` is taken as this.
pub const MAX_BUSY: usize = 1000;

/// The most keys one listing examines before it answers with what it found (`truncated`): in memory,
/// keys of the store; on Redis, names its `SCAN` calls look at (their `COUNT` each), matching or not.
pub const MAX_EXAMINED: usize = 10_000;

/// The longest a listing of a remote store keeps scanning before it answers with what it found
/// (`truncated`); each call to the store has its own timeout besides.
pub const BUSY_TIME_BUDGET: Duration = Duration::from_millis(500);

/// A key with permits in flight, as the store has it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BusyKey {
    /// The user key.
    pub key: Arc<str>,
    /// How many (by weight) are in flight, as [`KeyStatus`](crate::store::KeyStatus) counts; never 0.
    pub in_flight: u32,
    /// The key's override, if it has one: the caller resolves the effective limit with its policy.
    pub override_limit: Option<u32>,
}

/// What [`BusyKeys::busy`] found.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct BusyList {
    /// Busiest first (by in_flight; then by key), at most the `limit` asked for.
    pub keys: Vec<BusyKey>,
    /// True when there may be more busy keys than listed: more than `limit` were found, or the listing
    /// stopped at [`MAX_EXAMINED`] keys or [`BUSY_TIME_BUDGET`].
    pub truncated: bool,
}

/// A store that can list its busy keys.
pub trait BusyKeys: Store {
    /// The keys starting with `prefix` that have permits in flight, busiest first, at most `limit` (at
    /// most [`MAX_BUSY`]). Expired leases do not count; nothing is changed.
    fn busy(
        &self,
        prefix: &str,
        limit: usize,
    ) -> impl Future<Output = Result<BusyList, StoreError>> + Send;
}

/// Sorts `found` busiest first and keeps `limit` (at most [`MAX_BUSY`]); `truncated` when the listing
/// stopped early or more were found.
pub(crate) fn busiest(mut found: Vec<BusyKey>, limit: usize, truncated: bool) -> BusyList {
    let limit = limit.min(MAX_BUSY);
    let order = |a: &BusyKey, b: &BusyKey| b.in_flight.cmp(&a.in_flight).then(a.key.cmp(&b.key));
    let more = found.len() > limit;
    // The first `limit` picked out in linear time: only they are sorted, not all that was found.
    if more && limit > 0 {
        found.select_nth_unstable_by(limit - 1, order);
    }
    found.truncate(limit);
    found.sort_unstable_by(order);
    BusyList {
        keys: found,
        truncated: truncated || more,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn busy(key: &str, in_flight: u32) -> BusyKey {
        BusyKey {
            key: Arc::from(key),
            in_flight,
            override_limit: None,
        }
    }

    #[test]
    fn busiest_first_then_by_key_and_cut_at_the_limit() {
        let found = vec![busy("b", 1), busy("a", 3), busy("c", 3), busy("d", 2)];
        let list = busiest(found.clone(), 3, false);
        let keys: Vec<&str> = list.keys.iter().map(|b| &*b.key).collect();
        assert_eq!(keys, ["a", "c", "d"]);
        assert!(list.truncated, "one more was found");
        let all = busiest(found, 10, false);
        assert_eq!(all.keys.len(), 4);
        assert!(!all.truncated);
        assert!(busiest(Vec::new(), 10, true).truncated);
    }

    #[test]
    fn the_first_ones_picked_out_are_those_a_full_sort_puts_first() {
        let found: Vec<BusyKey> = (0..200u32)
            .map(|n| busy(&format!("k{}", n * 7919 % 200), n * 31 % 13 + 1))
            .collect();
        let mut sorted = found.clone();
        sorted.sort_by(|a, b| b.in_flight.cmp(&a.in_flight).then(a.key.cmp(&b.key)));
        for limit in [0, 1, 2, 13, 199, 200, 500] {
            let list = busiest(found.clone(), limit, false);
            assert_eq!(list.keys[..], sorted[..limit.min(200)], "limit {limit}");
            assert_eq!(list.truncated, limit < 200, "limit {limit}");
        }
    }
}
