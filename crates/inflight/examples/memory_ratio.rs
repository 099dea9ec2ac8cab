//! The memory store's cost as a ratio to a per-key tokio semaphore, measured interleaved.
//!
//! Criterion (`benches/memory.rs`) measures each contender for seconds in turn, so a burst of load from
//! elsewhere on a shared machine lands on one of them and skews their ratio. Here the contenders take
//! turns in short slices of the same number of pairs, in a rotating order, and each slice's time is
//! divided by the semaphore's time in the same round: a burst moves one round's ratio, not the median.
//!
//! Prints one line per key count and contender: `keys contender ns_per_pair ratio_median ratio_min
//! ratio_max` (ns and ratios are medians over the rounds; min and max show the spread).
//!
//! `cargo run --release -p inflight --example memory_ratio [rounds]`

#[path = "../benches/common/mod.rs"]
mod common;

use std::hint::black_box;
use std::time::{Duration, Instant};

use common::{Semaphores, LIMIT};
use inflight::store::LocalAdmission;
use inflight::{ClassLimits, Limiter, MemoryStore, Policy, Store};

/// About how long the semaphore's slice takes; the others run the same number of pairs.
const SLICE: Duration = Duration::from_millis(10);

struct Contenders {
    keys: Vec<String>,
    semaphores: Semaphores,
    store: MemoryStore,
    limiter: Limiter<MemoryStore>,
    runtime: tokio::runtime::Runtime,
    next: [usize; 3],
}

impl Contenders {
    /// Runs `pairs` acquire+release pairs of contender `which` (0 semaphore, 1 store, 2 limiter), cycling
    /// over the keys; the time each took.
    fn run(&mut self, which: usize, pairs: usize) -> Duration {
        let n = self.keys.len();
        let mut i = self.next[which];
        let started = Instant::now();
        match which {
            0 => {
                for _ in 0..pairs {
                    i = (i + 1) % n;
                    self.semaphores.pair(&self.keys[i]);
                }
            }
            1 => {
                let policy = [ClassLimits::new(LIMIT, 0)];
                for _ in 0..pairs {
                    i = (i + 1) % n;
                    match self.store.hold(&[&self.keys[i]], &policy, 1, false) {
                        Some(LocalAdmission::Taken { slots, .. }) => slots.give_back(1),
                        _ => panic!("room"),
                    }
                }
            }
            _ => {
                // Awaited inside one async loop, as a request handler awaits it.
                let (limiter, keys) = (&self.limiter, &self.keys);
                self.runtime.block_on(async {
                    for _ in 0..pairs {
                        i = (i + 1) % n;
                        let permit = limiter.try_acquire(&keys[i]).await.expect("room");
                        drop(black_box(permit));
                    }
                });
            }
        }
        self.next[which] = i;
        started.elapsed()
    }
}

fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

fn main() {
    let rounds: usize = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(41)
        .max(1);
    for n_keys in [1usize, 100_000] {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime");
        // The limiter belongs to the runtime its loop runs on.
        let limiter = {
            let _entered = runtime.enter();
            Limiter::builder(MemoryStore::new())
                .policy(Policy::new(LIMIT, 0))
                .build()
        };
        let mut c = Contenders {
            keys: (0..n_keys).map(|n| format!("app-{n:08}")).collect(),
            semaphores: Semaphores::default(),
            store: MemoryStore::new(),
            limiter,
            runtime,
            next: [0; 3],
        };
        // Every key made in every contender, then a slice's size from the semaphore's speed.
        for which in 0..3 {
            c.run(which, n_keys.max(100_000));
        }
        let probe = 100_000;
        let per_pair = c.run(0, probe).as_secs_f64() / probe as f64;
        let pairs = ((SLICE.as_secs_f64() / per_pair) as usize).max(1_000);
        let mut ns = [Vec::new(), Vec::new(), Vec::new()];
        let mut ratios = [Vec::new(), Vec::new()];
        for round in 0..rounds {
            let mut took = [0.0; 3];
            for turn in 0..3 {
                let which = (round + turn) % 3;
                took[which] = c.run(which, pairs).as_secs_f64() * 1e9 / pairs as f64;
            }
            for which in 0..3 {
                ns[which].push(took[which]);
            }
            ratios[0].push(took[1] / took[0]);
            ratios[1].push(took[2] / took[0]);
        }
        let names = [
            "tokio_semaphore_per_key",
            "inflight_memory_store",
            "inflight_limiter",
        ];
        for which in 0..3 {
            let ns = median(&mut ns[which]);
            let (mid, lo, hi) = if which == 0 {
                (1.0, 1.0, 1.0)
            } else {
                let r = &mut ratios[which - 1];
                let mid = median(r);
                (mid, r[0], r[r.len() - 1])
            };
            println!("{n_keys} {} {ns:.1} {mid:.3} {lo:.3} {hi:.3}", names[which]);
        }
    }
}
