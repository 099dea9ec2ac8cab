//! Instructions per acquire+release pair on the memory store, for callgrind: the per-key tokio semaphore
//! (the baseline of `memory_ratio`), the store itself, and `Limiter::try_acquire` + drop. Only the loop
//! inside `measured` is meant to be counted (`--toggle-collect='*measured*'`); a first pass over the keys
//! makes them beforehand. `scripts/bench/memory_instructions.sh` runs it and divides.
//!
//! `memory_instructions {sem|store|limiter} KEYS PAIRS`

#[path = "../benches/common/mod.rs"]
mod common;

use std::hint::black_box;

use common::{Semaphores, LIMIT};
use inflight::store::LocalAdmission;
use inflight::{ClassLimits, Limiter, MemoryStore, Policy, Store};

#[inline(never)]
fn semaphore_pairs(semaphores: &Semaphores, keys: &[String], pairs: usize) {
    for i in 0..pairs {
        semaphores.pair(&keys[i % keys.len()]);
    }
}

#[inline(never)]
fn store_pairs(store: &MemoryStore, keys: &[String], pairs: usize) {
    let limits = [ClassLimits::new(LIMIT, 0)];
    for i in 0..pairs {
        match store.hold(&[&keys[i % keys.len()]], &limits, 1, false) {
            Some(LocalAdmission::Taken { slots, .. }) => slots.give_back(1),
            _ => panic!("the limit is never reached"),
        }
    }
}

#[inline(never)]
fn limiter_pairs(
    runtime: &tokio::runtime::Runtime,
    limiter: &Limiter<MemoryStore>,
    keys: &[String],
    pairs: usize,
) {
    runtime.block_on(async {
        for i in 0..pairs {
            let permit = limiter.try_acquire(&keys[i % keys.len()]).await;
            drop(black_box(permit.expect("the limit is never reached")));
        }
    });
}

/// What callgrind counts.
#[inline(never)]
fn measured(pairs: impl FnOnce()) {
    pairs()
}

fn main() {
    let mut args = std::env::args().skip(1);
    let which = args.next().unwrap_or_default();
    let n_keys: usize = args.next().and_then(|s| s.parse().ok()).unwrap_or(1);
    let pairs: usize = args.next().and_then(|s| s.parse().ok()).unwrap_or(100_000);
    let keys: Vec<String> = (0..n_keys).map(|n| format!("app-{n:08}")).collect();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    match which.as_str() {
        "sem" => {
            let semaphores = Semaphores::default();
            semaphore_pairs(&semaphores, &keys, n_keys);
            measured(|| semaphore_pairs(&semaphores, &keys, pairs));
        }
        "store" => {
            let store = MemoryStore::new();
            store_pairs(&store, &keys, n_keys);
            measured(|| store_pairs(&store, &keys, pairs));
        }
        "limiter" => {
            let limiter = {
                let _inside = runtime.enter();
                Limiter::builder(MemoryStore::new())
                    .policy(Policy::new(LIMIT, 0))
                    .build()
            };
            limiter_pairs(&runtime, &limiter, &keys, n_keys);
            measured(|| limiter_pairs(&runtime, &limiter, &keys, pairs));
        }
        other => panic!("sem, store or limiter, not {other:?}"),
    }
}
