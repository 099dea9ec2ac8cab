//! [`Waiters`]: this process's waiters, by the key that refused them, as counted and bounded here (the
//! order they are admitted in is the store's queue's).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// The most waiters on one key in one process unless [`crate::LimiterBuilder::max_waiters`] says otherwise.
pub const DEFAULT_MAX_WAITERS: usize = 1024;

/// A key's waiters: each one's number and its priority and flow.
type Queue = Vec<(u64, Group)>;

/// A waiter's priority level and flow, as [`Waiters::groups`] counts them.
type Group = (u8, Option<Arc<str>>);

/// The most groups [`Waiters::groups`] lists for one key.
const MAX_GROUPS: usize = 16;

/// This process's waiters, by key, for every key that has any.
pub(super) struct Waiters {
    queues: Mutex<HashMap<Arc<str>, Queue>>,
    next: AtomicU64,
    pub(super) max_per_key: usize,
}

impl Waiters {
    pub(super) fn new(max_per_key: usize) -> Self {
        Self {
            queues: Mutex::new(HashMap::new()),
            next: AtomicU64::new(0),
            max_per_key,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<Arc<str>, Queue>> {
        self.queues.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// How many of this process's waiters queue on `key`.
    pub(super) fn on(&self, key: &str) -> usize {
        self.lock().get(key).map_or(0, Vec::len)
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

    /// A place among `key`'s waiters, counted in `waiting` while it lasts; `None`: the key has as many
    /// as it may.
    pub(super) fn join<'a>(
        &'a self,
        key: &str,
        waiting: &'a AtomicU64,
        group: Group,
    ) -> Option<Place<'a>> {
        let mut queues = self.lock();
        let queue = queues.entry(Arc::from(key)).or_default();
        if queue.len() >= self.max_per_key {
            if queue.is_empty() {
                queues.remove(key);
            }
            return None;
        }
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        queue.push((n, group));
        waiting.fetch_add(1, Ordering::Relaxed);
        Some(Place {
            waiters: self,
            key: Arc::from(key),
            n,
            waiting,
        })
    }
}

/// A waiter's place; dropping it leaves.
pub(super) struct Place<'a> {
    waiters: &'a Waiters,
    key: Arc<str>,
    n: u64,
    waiting: &'a AtomicU64,
}

impl Drop for Place<'_> {
    fn drop(&mut self) {
        self.waiting.fetch_sub(1, Ordering::Relaxed);
        let mut queues = self.waiters.lock();
        let Some(queue) = queues.get_mut(&self.key) else {
            return;
        };
        queue.retain(|(n, _)| *n != self.n);
        if queue.is_empty() {
            queues.remove(&self.key);
        }
    }
}
