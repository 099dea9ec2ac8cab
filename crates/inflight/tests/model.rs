//! Property test: the memory store makes the same decisions as a simple model for random sequences of
//! acquire / release / renew / set-limit / advance-time.
#![allow(missing_docs)]

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use inflight::store::{
    AcquireRequest, Admission, LocalAdmission, LocalHold, RenewRequest, Renewal,
};
use inflight::{Limit, ManualClock, MemoryStore, PermitId, Policy, Store};
use proptest::prelude::*;

#[derive(Clone, Debug)]
enum Op {
    /// A permit of this process, without a lease (`Store::acquire_local`).
    Hold {
        key: u8,
        weight: u32,
    },
    /// Drops the n-th such permit still held.
    Unhold {
        nth: usize,
    },
    Acquire {
        key: u8,
        id: u8,
        weight: u32,
        lease_ms: u64,
    },
    Release {
        key: u8,
        id: u8,
    },
    Renew {
        key: u8,
        id: u8,
        lease_ms: u64,
    },
    SetLimit {
        key: u8,
        limit: u32,
    },
    Advance {
        ms: u64,
    },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0..3u8, 0..6u8, 1..4u32, 1..5_000u64)
            .prop_map(|(key, id, weight, lease_ms)| Op::Acquire { key, id, weight, lease_ms }),
        2 => (0..3u8, 0..6u8).prop_map(|(key, id)| Op::Release { key, id }),
        1 => (0..3u8, 0..6u8, 1..5_000u64).prop_map(|(key, id, lease_ms)| Op::Renew { key, id, lease_ms }),
        1 => (0..3u8, 0..5u32).prop_map(|(key, limit)| Op::SetLimit { key, limit }),
        2 => (0..3_000u64).prop_map(|ms| Op::Advance { ms }),
        2 => (0..3u8, 1..3u32).prop_map(|(key, weight)| Op::Hold { key, weight }),
        1 => (0..8usize).prop_map(|nth| Op::Unhold { nth }),
    ]
}

fn policy() -> impl Strategy<Value = Policy> {
    prop_oneof![
        Just(Policy::new(0, 0)),
        Just(Policy::new(3, 0)),
        Just(Policy::new(2, 4)),
        Just(Policy::new(0, 2)),
        Just(Policy::new(5, 3)),
    ]
}

/// What a decision looks like, stripped to what both sides must agree on.
#[derive(Debug, PartialEq, Eq)]
enum Outcome {
    Admitted { in_flight: u32, expires_at_ms: u64 },
    Unlimited,
    Full { limit: u32, in_flight: u32 },
    TooHeavy { limit: u32 },
    Released(bool),
    Renewed { in_flight: u32, expires_at_ms: u64 },
    Lost,
    Status { limit: Limit, in_flight: u32 },
    Nothing,
}

#[derive(Default)]
struct ModelKey {
    leases: HashMap<u8, (u32, u64)>,
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
        self.held + self.leases.values().map(|(w, _)| w).sum::<u32>()
    }
}

impl Model {
    fn key(&mut self, key: u8) -> &mut ModelKey {
        let now = self.now;
        let k = self.keys.entry(key).or_default();
        k.leases.retain(|_, (_, deadline)| *deadline > now);
        k
    }

    fn apply(&mut self, op: &Op) -> Outcome {
        let (now, policy) = (self.now, self.policy);
        match *op {
            Op::Acquire {
                key,
                id,
                weight,
                lease_ms,
            } => {
                let k = self.key(key);
                let Limit::Limited(max) = policy.resolve(k.override_limit) else {
                    return Outcome::Unlimited;
                };
                if weight > max {
                    return Outcome::TooHeavy { limit: max };
                }
                let in_flight: u32 = k.in_flight();
                let held = k.leases.get(&id).map_or(0, |(w, _)| *w);
                if weight > held && in_flight - held + weight > max {
                    return Outcome::Full {
                        limit: max,
                        in_flight,
                    };
                }
                k.leases.insert(id, (weight, now + lease_ms));
                Outcome::Admitted {
                    in_flight: in_flight - held + weight,
                    expires_at_ms: now + lease_ms,
                }
            }
            Op::Release { key, id } => {
                Outcome::Released(self.key(key).leases.remove(&id).is_some())
            }
            Op::Renew { key, id, lease_ms } => {
                let k = self.key(key);
                let in_flight: u32 = k.in_flight();
                match k.leases.get_mut(&id) {
                    Some((_, deadline)) => {
                        *deadline = now + lease_ms;
                        Outcome::Renewed {
                            in_flight,
                            expires_at_ms: now + lease_ms,
                        }
                    }
                    None => Outcome::Lost,
                }
            }
            Op::SetLimit { key, limit } => {
                let k = self.key(key);
                k.override_limit = (limit > 0).then_some(limit);
                let in_flight = k.in_flight();
                Outcome::Status {
                    limit: policy.resolve(k.override_limit),
                    in_flight,
                }
            }
            Op::Advance { ms } => {
                self.now += ms;
                Outcome::Nothing
            }
            Op::Hold { key, weight } => {
                let k = self.key(key);
                let Limit::Limited(max) = policy.resolve(k.override_limit) else {
                    return Outcome::Unlimited;
                };
                if weight > max {
                    return Outcome::TooHeavy { limit: max };
                }
                let in_flight = k.in_flight();
                if in_flight + weight > max {
                    return Outcome::Full {
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

async fn apply_store<S: Store>(
    store: &S,
    clock: &ManualClock,
    policy: Policy,
    holds: &mut Vec<(Arc<dyn LocalHold>, u32)>,
    op: &Op,
) -> Outcome {
    let key = |k: u8| format!("key-{k}");
    let id = |i: u8| PermitId::from(format!("id-{i}"));
    match *op {
        Op::Acquire {
            key: k,
            id: i,
            weight,
            lease_ms,
        } => {
            let (key, id) = (key(k), id(i));
            let req = AcquireRequest {
                key: &key,
                id: &id,
                weight,
                lease_ms,
                policy,
            };
            match store.acquire(req).await.unwrap() {
                Admission::Admitted { grant, .. } => Outcome::Admitted {
                    in_flight: grant.in_flight,
                    expires_at_ms: grant.expires_at_ms,
                },
                Admission::Unlimited => Outcome::Unlimited,
                Admission::Full {
                    limit, in_flight, ..
                } => Outcome::Full { limit, in_flight },
                Admission::TooHeavy { limit } => Outcome::TooHeavy { limit },
            }
        }
        Op::Release { key: k, id: i } => {
            Outcome::Released(store.release(&key(k), &id(i)).await.unwrap())
        }
        Op::Renew {
            key: k,
            id: i,
            lease_ms,
        } => {
            let req = RenewRequest {
                key: key(k).into(),
                id: id(i),
                lease_ms,
                policy,
                readd_weight: None,
            };
            match store.renew(&[req]).await.unwrap().pop().unwrap() {
                Renewal::Renewed(g) => Outcome::Renewed {
                    in_flight: g.in_flight,
                    expires_at_ms: g.expires_at_ms,
                },
                Renewal::Readded(_) => panic!("no re-add was asked for"),
                Renewal::Lost => Outcome::Lost,
            }
        }
        Op::SetLimit { key: k, limit } => {
            let s = store.set_limit(&key(k), Some(limit), policy).await.unwrap();
            Outcome::Status {
                limit: s.limit,
                in_flight: s.in_flight,
            }
        }
        Op::Advance { ms } => {
            clock.advance(Duration::from_millis(ms));
            Outcome::Nothing
        }
        Op::Hold { key: k, weight } => {
            match store.acquire_local(&key(k), weight, policy).unwrap() {
                LocalAdmission::Held { hold, grant, .. } => {
                    holds.push((hold, weight));
                    Outcome::Admitted {
                        in_flight: grant.in_flight,
                        expires_at_ms: grant.expires_at_ms,
                    }
                }
                LocalAdmission::Decided(Admission::Unlimited) => Outcome::Unlimited,
                LocalAdmission::Decided(Admission::Full {
                    limit, in_flight, ..
                }) => Outcome::Full { limit, in_flight },
                LocalAdmission::Decided(Admission::TooHeavy { limit }) => {
                    Outcome::TooHeavy { limit }
                }
                LocalAdmission::Decided(other) => panic!("unexpected {other:?}"),
            }
        }
        Op::Unhold { nth } => {
            if !holds.is_empty() {
                let (hold, weight) = holds.remove(nth % holds.len());
                hold.release(weight);
            }
            Outcome::Nothing
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn the_memory_store_decides_as_the_model(policy in policy(), ops in prop::collection::vec(op(), 1..80)) {
        let rt = tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap();
        let start = 1_000_000;
        let clock = ManualClock::new(start);
        let store = MemoryStore::with_clock(clock.clone());
        let mut model = Model { now: start, policy, keys: HashMap::new(), holds: Vec::new() };
        let mut holds = Vec::new();
        for (step, op) in ops.iter().enumerate() {
            let want = model.apply(op);
            let got = rt.block_on(apply_store(&store, &clock, policy, &mut holds, op));
            prop_assert_eq!(&got, &want, "step {} {:?}", step, op);
            if step % 7 == 0 {
                rt.block_on(store.maintain());
            }
        }
        for k in 0..3u8 {
            let want: u32 = model.key(k).in_flight();
            let got = rt.block_on(store.status(&format!("key-{k}"), policy)).unwrap().in_flight;
            prop_assert_eq!(got, want);
        }
    }
}
