//! The memory store against what a Rust user would otherwise write: a per-key tokio semaphore in a
//! `DashMap<String, Arc<Semaphore>>`, `try_acquire_owned` then drop. One key, and 100,000 keys.
//!
//! `cargo bench -p inflight --bench memory`. Criterion measures each in turn, so a burst of load from
//! elsewhere skews their ratio; `examples/memory_ratio.rs` interleaves them to measure the ratio itself.
#![allow(missing_docs)]

mod common;

use std::hint::black_box;
use std::time::Instant;

use common::{Semaphores, LIMIT};
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use inflight::store::LocalAdmission;
use inflight::{ClassLimits, Limiter, MemoryStore, Policy, Store};

fn pairs(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let _guard = rt.enter();
    let mut group = c.benchmark_group("acquire+release");
    group.throughput(Throughput::Elements(1));
    for n_keys in [1usize, 100_000] {
        let keys: Vec<String> = (0..n_keys).map(|n| format!("app-{n:08}")).collect();

        let semaphores = Semaphores::default();
        let mut i = 0;
        group.bench_function(BenchmarkId::new("tokio_semaphore_per_key", n_keys), |b| {
            b.iter(|| {
                i = (i + 1) % n_keys;
                semaphores.pair(&keys[i]);
            })
        });

        let store = MemoryStore::new();
        let policy = [ClassLimits::new(LIMIT, 0)];
        let mut i = 0;
        group.bench_function(BenchmarkId::new("inflight_memory_store", n_keys), |b| {
            b.iter(|| match store.hold(&[&keys[i]], &policy, 1, false) {
                Some(LocalAdmission::Taken { slots, .. }) => {
                    i = (i + 1) % n_keys;
                    slots.give_back(1);
                }
                _ => panic!("room"),
            })
        });

        let limiter = Limiter::builder(MemoryStore::new())
            .policy(Policy::new(LIMIT, 0))
            .build();
        let mut i = 0;
        // Awaited inside one async loop, as a request handler awaits it (no executor call per pair).
        group.bench_function(BenchmarkId::new("inflight_limiter", n_keys), |b| {
            b.iter_custom(|iters| {
                rt.block_on(async {
                    let started = Instant::now();
                    for _ in 0..iters {
                        i = (i + 1) % n_keys;
                        let permit = limiter.try_acquire(&keys[i]).await.expect("room");
                        drop(black_box(permit));
                    }
                    started.elapsed()
                })
            })
        });
    }
    group.finish();
}

criterion_group!(benches, pairs);
criterion_main!(benches);
