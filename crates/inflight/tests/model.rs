//! Property test: the memory store makes the same decisions as a simple model for random sequences of
//! acquire / release / renew / set-limit / advance-time, and of permits without a lease.
#![allow(missing_docs)]

mod support;

use std::collections::HashMap;

use inflight::store::OverrideChange;
use inflight::{ClassLimits as Policy, Limit, ManualClock, MemoryStore, Store};
use proptest::prelude::*;
use support::ops::{apply_store, class, op, policy, Op, Outcome};

#[derive(Default)]
struct ModelKey {
    /// id -> (weight, deadline, lease length)
    leases: HashMap<u8, (u32, u64, u64)>,
    held: u32,
    override_limit: Option<u32>,
}

/// The simplest possible statement of the rules.
struct Model {
    now: u64,
    policy: Policy,
    keys: HashMap<u8, ModelKey>,
    holds: Vec<(u8, u32)>,
}

impl ModelKey {
    fn in_flight(&self) -> u32 {
        self.held + self.leases.values().map(|(w, _, _)| w).sum::<u32>()
    }
}

impl Model {
    fn key(&mut self, key: u8) -> &mut ModelKey {
        let now = self.now;
        let k = self.keys.entry(key).or_default();
        k.leases.retain(|_, (_, deadline, _)| *deadline > now);
        k
    }

    fn apply(&mut self, op: &Op) -> Outcome {
        let (now, policy) = (self.now, self.policy);
        match *op {
            Op::Acquire {
                key,
                also,
                id,
                weight,
                lease_ms,
            } => {
                let keys: Vec<u8> = std::iter::once(key).chain(also).collect();
                let mut limited = Vec::new();
                for (index, key) in keys.iter().enumerate() {
                    let class = class(policy, *key);
                    let k = self.key(*key);
                    let Limit::Limited(max) = class.resolve(k.override_limit) else {
                        continue;
                    };
                    if weight > max {
                        return Outcome::TooHeavy { index, limit: max };
                    }
                    let in_flight: u32 = k.in_flight();
                    let held = k.leases.get(&id).map_or(0, |(w, _, _)| *w);
                    if weight > held && in_flight - held + weight > max {
                        return Outcome::Full {
                            index,
                            limit: max,
                            in_flight,
                        };
                    }
                    limited.push(*key);
                }
                if limited.is_empty() {
                    return Outcome::Unlimited;
                }
                for key in &limited {
                    self.key(*key)
                        .leases
                        .insert(id, (weight, now + lease_ms, lease_ms));
                }
                let in_flight = match limited[0] == key {
                    true => self.key(key).in_flight(),
                    false => 0,
                };
                Outcome::Admitted {
                    in_flight,
                    expires_at_ms: now + lease_ms,
                }
            }
            Op::Release { key, id } => {
                Outcome::Released(self.key(key).leases.remove(&id).is_some())
            }
            Op::Renew { key, id, lease_ms } => {
                let class = class(policy, key);
                let k = self.key(key);
                let limited = class.resolve(k.override_limit) != Limit::Unlimited;
                let in_flight = if limited { k.in_flight() } else { 0 };
                match k.leases.get_mut(&id) {
                    Some((_, deadline, own)) => {
                        *own = lease_ms.unwrap_or(*own);
                        *deadline = now + *own;
                        Outcome::Renewed {
                            in_flight,
                            expires_at_ms: *deadline,
                        }
                    }
                    // An unlimited key records nothing, so has nothing to lose.
                    None if !limited => Outcome::Renewed {
                        in_flight,
                        expires_at_ms: now + lease_ms.unwrap_or(30_000),
                    },
                    None => Outcome::Lost,
                }
            }
            Op::SetLimit { key, limit } => {
                let class = class(policy, key);
                let k = self.key(key);
                k.override_limit = (limit > 0).then_some(limit);
                let in_flight = k.in_flight();
                Outcome::Status {
                    limit: class.resolve(k.override_limit),
                    in_flight,
                }
            }
            Op::Advance { ms } => {
                self.now += ms;
                Outcome::Nothing
            }
            Op::Hold { key, weight } => {
                let class = class(policy, key);
                let k = self.key(key);
                let Limit::Limited(max) = class.resolve(k.override_limit) else {
                    return Outcome::Unlimited;
                };
                if weight > max {
                    return Outcome::TooHeavy {
                        index: 0,
                        limit: max,
                    };
                }
                let in_flight = k.in_flight();
                if in_flight + weight > max {
                    return Outcome::Full {
                        index: 0,
                        limit: max,
                        in_flight,
                    };
                }
                k.held += weight;
                self.holds.push((key, weight));
                Outcome::Admitted {
                    in_flight: in_flight + weight,
                    expires_at_ms: 0,
                }
            }
            Op::Wait { .. } | Op::Leave { .. } => unreachable!("the model keeps no queue"),
            Op::Unhold { nth } => {
                if self.holds.is_empty() {
                    return Outcome::Nothing;
                }
                let (key, weight) = self.holds.remove(nth % self.holds.len());
                self.keys.get_mut(&key).unwrap().held -= weight;
                Outcome::Nothing
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn the_memory_store_decides_as_the_model(policy in policy(), ops in prop::collection::vec(op(true), 1..80)) {
        let rt = tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap();
        let start = 1_000_000;
        let clock = ManualClock::new(start);
        let store = MemoryStore::with_clock(clock.clone());
        let mut model = Model { now: start, policy, keys: HashMap::new(), holds: Vec::new() };
        let mut holds = Vec::new();
        for (step, op) in ops.iter().enumerate() {
            let want = model.apply(op);
            let got = rt.block_on(apply_store(&store, &|d| clock.advance(d), policy, &mut holds, op));
            prop_assert_eq!(&got, &want, "step {} {:?}", step, op);
            if step % 7 == 0 {
                rt.block_on(store.maintain()).unwrap();
            }
        }
        for k in 0..3u8 {
            let want: u32 = model.key(k).in_flight();
            let got = rt.block_on(store.status(&format!("key-{k}"), class(policy, k), OverrideChange::Keep)).unwrap().in_flight;
            prop_assert_eq!(got, want);
        }
    }
}
