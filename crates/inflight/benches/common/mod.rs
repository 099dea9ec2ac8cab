//! The baseline both memory benchmarks compare against: what a Rust user would otherwise write, a per-key
//! tokio semaphore in a `DashMap<String, Arc<Semaphore>>`, `try_acquire_owned` then drop.

use std::sync::Arc;

use dashmap::DashMap;
use tokio::sync::Semaphore;

/// The limit of every key in the memory benchmarks (never reached: one permit is held at a time).
pub(crate) const LIMIT: u32 = 64;

/// One semaphore per key, made on first use.
#[derive(Default)]
pub(crate) struct Semaphores {
    map: DashMap<String, Arc<Semaphore>>,
}

impl Semaphores {
    /// One acquire+release on `key`.
    pub(crate) fn pair(&self, key: &str) {
        let sem = match self.map.get(key) {
            Some(sem) => sem.clone(),
            None => self
                .map
                .entry(key.to_owned())
                .or_insert_with(|| Arc::new(Semaphore::new(LIMIT as usize)))
                .clone(),
        };
        let permit = sem.try_acquire_owned().expect("room");
        drop(permit);
    }
}
