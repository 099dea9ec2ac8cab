//! [`ListingLane`]: where listings of busy keys take turns (`listing.rs`), paced so that together they
//! keep Redis busy about half the time at most.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{Mutex, MutexGuard};
use tokio::time::Instant;

/// The shortest rest a lane takes: the timer's resolution. Shorter pages add up until they owe it.
const MIN_REST: Duration = Duration::from_millis(1);

/// Where listings of busy keys take turns, one page at a time among the stores built with clones of it
/// ([`RedisStoreBuilder::listing_lane`](super::RedisStoreBuilder::listing_lane)), each turn after a rest
/// as long as the turns before it took, so that however many listings are in progress, Redis (which
/// runs one command at a time) is left to admissions at least about half the time. Clones share it.
#[derive(Clone, Debug, Default)]
pub struct ListingLane {
    /// How long the turns since the last rest took.
    owed: Arc<Mutex<Duration>>,
}

/// A turn: the lane is the holder's until it is dropped.
pub(super) struct Turn<'a> {
    owed: MutexGuard<'a, Duration>,
    started: Instant,
}

impl ListingLane {
    /// A turn for one page, after the rest the lane owes; turns are given in the order asked for.
    pub(super) async fn take_turn(&self) -> Turn<'_> {
        let mut owed = self.owed.lock().await;
        if *owed >= MIN_REST {
            tokio::time::sleep(*owed).await;
            *owed = Duration::ZERO;
        }
        Turn {
            owed,
            started: Instant::now(),
        }
    }
}

impl Drop for Turn<'_> {
    fn drop(&mut self) {
        *self.owed += self.started.elapsed();
    }
}

#[cfg(test)]
mod tests {
    use futures_util::FutureExt;

    use super::*;

    #[tokio::test(start_paused = true)]
    async fn one_turn_at_a_time_each_after_a_rest_as_long_as_the_turns_before() {
        let lane = ListingLane::default();
        let other = lane.clone();
        let turn = lane.take_turn().await;
        assert!(
            other.take_turn().now_or_never().is_none(),
            "the lane is taken"
        );
        tokio::time::advance(Duration::from_micros(600)).await;
        drop(turn);
        // 0.6 ms owed: less than a rest, so the next turn is at once.
        let turn = other.take_turn().now_or_never().expect("no rest owed yet");
        tokio::time::advance(Duration::from_millis(2)).await;
        drop(turn);
        let asked = Instant::now();
        drop(lane.take_turn().await);
        // (The timer rounds the rest up to its next millisecond.)
        let rested = asked.elapsed();
        assert!(
            rested >= Duration::from_micros(2_600),
            "the rest owed: {rested:?}"
        );
        let asked = Instant::now();
        drop(lane.take_turn().await);
        assert_eq!(asked.elapsed(), Duration::ZERO, "nothing owed after a rest");
    }
}
