//! [`ListingLane`]: where listings of busy keys take turns (`listing.rs`).

use std::sync::Arc;

use tokio::sync::{Mutex, MutexGuard};

/// Where listings of busy keys take turns, one page at a time among the stores built with clones of it
/// ([`RedisStoreBuilder::listing_lane`](super::RedisStoreBuilder::listing_lane)). Clones share it.
#[derive(Clone, Debug, Default)]
pub struct ListingLane(Arc<Mutex<()>>);

impl ListingLane {
    /// A turn for one page, until the guard is dropped; turns are given in the order asked for.
    pub(super) async fn take_turn(&self) -> MutexGuard<'_, ()> {
        self.0.lock().await
    }
}
