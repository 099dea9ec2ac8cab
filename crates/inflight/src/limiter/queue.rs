//! [`Waiters`]: the queues of this process's waiters, one per key that has any, in arrival order.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use tokio::sync::Notify;

/// The most waiters on one key in one process unless [`crate::LimiterBuilder::max_waiters`] says otherwise.
pub const DEFAULT_MAX_WAITERS: usize = 1024;

/// A key's queue: each waiter's turn, in arrival order, with its priority and flow.
type Queue = VecDeque<(Arc<Notify>, Standing)>;

/// A waiter's priority level and flow, as [`Waiters::groups`] counts them.
type Standing = (u8, Option<Arc<str>>);

/// The most groups [`Waiters::groups`] lists for one key.
const MAX_GROUPS: usize = 16;

/// The queues of this process's waiters, one per key that has any.
pub(super) struct Waiters {
    queues: Mutex<HashMap<Arc<str>, Queue>>,
    pub(super) max_per_key: usize,
}

impl Waiters {
    pub(super) fn new(max_per_key: usize) -> Self {
        Self {
            queues: Mutex::new(HashMap::new()),
            max_per_key,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<Arc<str>, Queue>> {
        self.queues.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// How many of this process's waiters queue on `key`.
    pub(super) fn on(&self, key: &str) -> usize {
        self.lock().get(key).map_or(0, VecDeque::len)
    }

    /// How many of this process's waiters on `key` wait at each priority level in each flow, the
    /// largest groups first, at most 16 groups.
    pub(super) fn groups(&self, key: &str) -> Vec<(u8, Option<Arc<str>>, usize)> {
        let queues = self.lock();
        let Some(queue) = queues.get(key) else {
            return Vec::new();
        };
        let mut groups: Vec<(u8, Option<Arc<str>>, usize)> = Vec::new();
        for (_, (priority, flow)) in queue {
            match groups
                .iter_mut()
                .find(|(p, f, _)| p == priority && f == flow)
            {
                Some(group) => group.2 += 1,
                None => groups.push((*priority, flow.clone(), 1)),
            }
        }
        groups.sort_by(|a, b| b.2.cmp(&a.2).then(b.0.cmp(&a.0)));
        groups.truncate(MAX_GROUPS);
        groups
    }

    /// True when no waiter of this process waits on any of `keys`.
    pub(super) fn idle(&self, keys: &[&str]) -> bool {
        let queues = self.lock();
        keys.iter().all(|key| !queues.contains_key(*key))
    }

    /// A place at the end of `key`'s queue, counted in `waiting` while it lasts; `None`: the queue is full.
    pub(super) fn join<'a>(
        &'a self,
        key: &str,
        waiting: &'a AtomicU64,
        standing: Standing,
    ) -> Option<Place<'a>> {
        let mut queues = self.lock();
        let turn = Arc::new(Notify::new());
        let queue = queues.entry(Arc::from(key)).or_default();
        if queue.len() >= self.max_per_key {
            if queue.is_empty() {
                queues.remove(key);
            }
            return None;
        }
        queue.push_back((turn.clone(), standing));
        if queue.len() == 1 {
            turn.notify_one();
        }
        waiting.fetch_add(1, Ordering::Relaxed);
        Some(Place {
            waiters: self,
            key: Arc::from(key),
            turn,
            waiting,
        })
    }
}

/// A waiter's place in a queue; dropping it lets the next waiter be the head.
pub(super) struct Place<'a> {
    waiters: &'a Waiters,
    key: Arc<str>,
    /// Notified (one stored permit) when this place becomes the head.
    pub(super) turn: Arc<Notify>,
    waiting: &'a AtomicU64,
}

impl Drop for Place<'_> {
    fn drop(&mut self) {
        self.waiting.fetch_sub(1, Ordering::Relaxed);
        let mut queues = self.waiters.lock();
        let Some(queue) = queues.get_mut(&self.key) else {
            return;
        };
        let was_head = queue
            .front()
            .is_some_and(|(head, _)| Arc::ptr_eq(head, &self.turn));
        queue.retain(|(turn, _)| !Arc::ptr_eq(turn, &self.turn));
        match queue.front() {
            None => {
                queues.remove(&self.key);
            }
            Some((next, _)) if was_head => next.notify_one(),
            Some(_) => {}
        }
    }
}
