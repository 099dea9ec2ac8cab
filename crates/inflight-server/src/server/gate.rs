//! How many connections a process holds open, over every worker's listener of the served port. At the
//! cap a worker stops accepting, so new connections wait in the kernel's listen queue (1024 long) until
//! one closes; each worker holds at most one more, the last it accepted, until a place comes.
//!
//! `/healthz` keeps answering at the cap: `inflight proxy` answers it on its admin listener, which has a
//! cap of its own ([`ADMIN_CONNECTIONS`]); `inflight serve`, with one port only, accepts up to
//! [`HEALTH_RESERVE`] connections past the cap, which answer only `/healthz`, `/readyz` and `/metrics`
//! (anything else: `503 too_many_connections`) and close after one answer. A connection in the reserve
//! has [`RESERVE_HEAD_TIMEOUT`] to send its request (TLS handshake included), so that connections that
//! send nothing, however many wait in the listen queue, each hold a place there that long at most.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// The connections the proxy's admin listener holds open at once.
pub const ADMIN_CONNECTIONS: usize = 64;

/// `serve`'s connections past `--max-connections` for health checks and metrics.
pub const HEALTH_RESERVE: usize = 16;

/// How long a connection in `serve`'s reserve may take to send its request's head, from its opening.
/// A health checker sends its request at once; 16 places at this bound let 80 idle connections a second
/// through the reserve, so a health check queued behind hundreds of them is answered within seconds.
pub(super) const RESERVE_HEAD_TIMEOUT: Duration = Duration::from_millis(200);

/// File descriptors kept for what is not a client connection: listeners, store connections, the log.
const SPARE_FILES: usize = 64;

/// The connection cap of one listener (or of all the workers' listeners of one port).
#[derive(Clone)]
pub(super) struct Gate {
    open: Arc<Semaphore>,
    /// Past the cap: connections that answer health checks only.
    reserve: Option<Arc<Semaphore>>,
}

/// A connection's place under the cap, given back when it is dropped.
pub(super) struct Slot {
    _permit: OwnedSemaphorePermit,
    /// In the reserve past the cap: health checks only.
    pub(super) reserve: bool,
}

impl Gate {
    /// At most `cap` connections, and with `reserve` that many more for health checks.
    pub(super) fn new(cap: usize, reserve: usize) -> Self {
        Self {
            open: Arc::new(Semaphore::new(cap)),
            reserve: (reserve > 0).then(|| Arc::new(Semaphore::new(reserve))),
        }
    }

    /// A place for the next connection: waits while every place is taken.
    pub(super) async fn enter(&self) -> Slot {
        let slot = |permit: Result<OwnedSemaphorePermit, _>, reserve| Slot {
            _permit: permit.unwrap_or_else(|_| unreachable!("a gate's semaphore is never closed")),
            reserve,
        };
        if let Ok(permit) = self.open.clone().try_acquire_owned() {
            return slot(Ok(permit), false);
        }
        match &self.reserve {
            None => slot(self.open.clone().acquire_owned().await, false),
            Some(reserve) => tokio::select! {
                biased;
                open = self.open.clone().acquire_owned() => slot(open, false),
                spare = reserve.clone().acquire_owned() => slot(spare, true),
            },
        }
    }
}

/// `wanted` connections of `files_each` files (2 for the proxy), lowered to fit the limit of open files
/// less `reserved`; the cap and, when it was lowered, the limit that lowered it.
pub(super) fn cap(wanted: usize, files_each: usize, reserved: usize) -> (usize, Option<u64>) {
    let Some(limit) = open_files_limit() else {
        return (wanted, None);
    };
    let room = usize::try_from(limit)
        .unwrap_or(usize::MAX)
        .saturating_sub(reserved + SPARE_FILES)
        / files_each.max(1);
    match room.max(1) {
        room if room < wanted => (room, Some(limit)),
        _ => (wanted, None),
    }
}

/// The soft limit of open files of this process (Linux; `None` elsewhere or when unlimited).
fn open_files_limit() -> Option<u64> {
    let limits = std::fs::read_to_string("/proc/self/limits").ok()?;
    let line = limits
        .lines()
        .find(|line| line.starts_with("Max open files"))?;
    line["Max open files".len()..]
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cap_leaves_room_under_the_open_files_limit() {
        let limit = open_files_limit().expect("Linux has /proc/self/limits");
        let room = (limit as usize - 64 - SPARE_FILES) / 2;
        assert_eq!(cap(usize::MAX, 2, 64), (room, Some(limit)));
        assert_eq!(cap(3, 2, 64), (3, None));
    }

    #[tokio::test]
    async fn past_the_cap_the_reserve_then_a_wait() {
        let gate = Gate::new(1, 1);
        let first = gate.enter().await;
        assert!(!first.reserve);
        let second = gate.enter().await;
        assert!(second.reserve);
        let waiting = tokio::spawn({
            let gate = gate.clone();
            async move { !gate.enter().await.reserve }
        });
        tokio::task::yield_now().await;
        assert!(!waiting.is_finished(), "every place is taken");
        drop(first);
        assert!(waiting.await.unwrap(), "the place given back");
    }
}
