//! Load on one key through a failover (cluster_failover.rs, sentinel.rs): workers take its permits,
//! hold each 20 ms and release it, counting themselves (an independent probe: not what Redis says) and
//! noting when admissions succeeded and when the store could not answer (refusals for a full key are
//! neither).

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use inflight::{Limiter, RedisStore};

/// When admissions succeeded, and when the store failed.
type Events = (Vec<Instant>, Vec<Instant>);

pub struct Probe {
    most: Arc<AtomicU32>,
    stop: Arc<AtomicBool>,
    events: Arc<Mutex<Events>>,
    workers: Vec<tokio::task::JoinHandle<()>>,
}

impl Probe {
    /// Starts 8 workers on `key`.
    pub fn start(limiter: &Limiter<RedisStore>, key: &'static str) -> Self {
        let holding = Arc::new(AtomicU32::new(0));
        let most = Arc::new(AtomicU32::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let events = Arc::new(Mutex::new(Events::default()));
        let workers = (0..8)
            .map(|_| {
                let (limiter, holding, most, stop) =
                    (limiter.clone(), holding.clone(), most.clone(), stop.clone());
                let events = events.clone();
                tokio::spawn(async move {
                    while !stop.load(Ordering::Relaxed) {
                        match limiter.try_acquire(key).await {
                            Ok(permit) => {
                                events.lock().unwrap().0.push(Instant::now());
                                let now = holding.fetch_add(1, Ordering::SeqCst) + 1;
                                most.fetch_max(now, Ordering::SeqCst);
                                tokio::time::sleep(Duration::from_millis(20)).await;
                                holding.fetch_sub(1, Ordering::SeqCst);
                                let _ = permit.release().await;
                            }
                            Err(err) => {
                                if !err.is_full() {
                                    events.lock().unwrap().1.push(Instant::now());
                                }
                                tokio::time::sleep(Duration::from_millis(10)).await;
                            }
                        }
                    }
                })
            })
            .collect();
        Self {
            most,
            stop,
            events,
            workers,
        }
    }

    /// The most permits the workers held at once so far.
    pub fn most(&self) -> u32 {
        self.most.load(Ordering::SeqCst)
    }

    /// How long after `killed` admissions came back: the first success after the last store error,
    /// once there has been no error for 500 ms. Panics when that has not happened within `within`.
    pub async fn back_after(&self, killed: Instant, within: Duration) -> Duration {
        loop {
            tokio::time::sleep(Duration::from_millis(20)).await;
            {
                let (successes, errors) = &*self.events.lock().unwrap();
                let after = errors
                    .last()
                    .copied()
                    .filter(|t| *t > killed)
                    .unwrap_or(killed);
                if let Some(first) = successes.iter().find(|t| **t > after) {
                    if after.elapsed() > Duration::from_millis(500) {
                        return first.duration_since(killed);
                    }
                }
            }
            assert!(killed.elapsed() < within, "admissions never came back");
        }
    }

    /// Stops the workers; the most they held at once, and how many store errors they met.
    pub async fn stop(self) -> (u32, usize) {
        self.stop.store(true, Ordering::Relaxed);
        for worker in self.workers {
            worker.await.unwrap();
        }
        let errors = self.events.lock().unwrap().1.len();
        (self.most.load(Ordering::SeqCst), errors)
    }
}
