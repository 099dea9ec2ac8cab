//! The cap on listings of busy keys (`GET /v1/keys`) in progress: one per process, every worker's
//! listings together, so that clients listing at once cannot take the workers' threads (and, on Redis,
//! the store) from admissions. A listing past it is refused at once (`429 too_many_listings`), never
//! queued.

use std::sync::Arc;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// How many listings of busy keys a process runs at once.
pub const MAX_LISTINGS: usize = 4;

/// The places of the listings in progress. Clones share them.
#[derive(Clone, Debug)]
pub struct Listings {
    places: Arc<Semaphore>,
    max: usize,
}

/// A listing's place, given back when dropped.
pub type ListingPlace = OwnedSemaphorePermit;

impl Listings {
    /// Room for `max` listings at once.
    pub fn new(max: usize) -> Self {
        Self {
            places: Arc::new(Semaphore::new(max)),
            max,
        }
    }

    /// A place, if one is free.
    pub fn try_enter(&self) -> Option<ListingPlace> {
        self.places.clone().try_acquire_owned().ok()
    }

    /// How many places are free now.
    pub fn free(&self) -> usize {
        self.places.available_permits()
    }

    /// How many listings may run at once.
    pub fn max(&self) -> usize {
        self.max
    }
}

impl Default for Listings {
    /// Room for [`MAX_LISTINGS`].
    fn default() -> Self {
        Self::new(MAX_LISTINGS)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_place_past_the_cap_is_refused_until_one_is_given_back() {
        let listings = Listings::new(2);
        let first = listings.try_enter().expect("a place");
        let second = listings
            .clone()
            .try_enter()
            .expect("a place, through a clone");
        assert!(listings.try_enter().is_none(), "both places taken");
        drop(first);
        assert_eq!(listings.free(), 1);
        let third = listings.try_enter().expect("the place given back");
        assert!(listings.try_enter().is_none());
        drop((second, third));
        assert_eq!(listings.free(), 2);
    }
}
