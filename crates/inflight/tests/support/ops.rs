//! Random operation sequences on a store, for the property tests (model.rs, stores_agree.rs).
#![allow(dead_code, unreachable_pub)]

use std::sync::Arc;
use std::time::Duration;

use inflight::store::{
    AcquireRequest, Admission, LocalAdmission, LocalSlots, OverrideChange, RenewRequest, Renewal,
    Ticket,
};
use inflight::{ClassLimits as Policy, Floors, Limit, PermitId, Store, Wakeups};
use proptest::prelude::*;

#[derive(Clone, Debug)]
pub enum Op {
    /// A permit of this process, without a lease (`Store::hold`).
    Hold {
        key: u8,
        weight: u32,
    },
    /// Drops the n-th such permit still held.
    Unhold {
        nth: usize,
    },
    /// On `key`, and on `also` too when given (one admission on both, or on neither).
    Acquire {
        key: u8,
        also: Option<u8>,
        id: u8,
        weight: u32,
        lease_ms: u64,
    },
    Release {
        key: u8,
        id: u8,
    },
    /// `lease_ms: None` keeps the length the lease was acquired with.
    Renew {
        key: u8,
        id: u8,
        lease_ms: Option<u64>,
    },
    SetLimit {
        key: u8,
        limit: u32,
    },
    Advance {
        ms: u64,
    },
    /// A waiter's ask on `key` with its ticket `ticket`, whose id, priority, flow and flow weight follow
    /// from the ticket ([`waiter`]); `floored`: the key's class keeps a floor for the highest level;
    /// `handoff`: a release may hand it the slot (`Ticket::handoff`).
    Wait {
        key: u8,
        ticket: u8,
        weight: u32,
        lease_ms: u64,
        floored: bool,
        handoff: bool,
    },
    /// The waiter of `ticket` gives up its place on `key`.
    Leave {
        key: u8,
        ticket: u8,
    },
}

/// A waiter's id, priority, flow and flow weight, from its ticket: ids 10 and up (apart from the plain
/// acquires'), three levels, two flows of weights 1 and 2.
pub fn waiter(ticket: u8) -> (u8, u8, &'static str, u32) {
    let flow = if ticket % 2 == 0 { "a" } else { "b" };
    (10 + ticket, ticket / 2 % 3, flow, 1 + u32::from(ticket % 2))
}

/// The floor of [`Op::Wait`]'s `floored` classes: one slot kept for level 2.
pub fn floors() -> Floors {
    Floors::new(&[(2, 1)]).unwrap()
}

/// Coarse operations of waiters and others on two keys: waiters' asks (queued, admitted in turn),
/// leaves, plain acquires (which may not pass the queue), releases of both, limits changed, time.
/// `floored` decides for the whole sequence whether the keys' class has a floor.
pub fn waits_op(floored: bool) -> impl Strategy<Value = Op> {
    prop_oneof![
        5 => (0..2u8, 0..6u8, prop_oneof![4 => Just(1u32), 1 => Just(2u32)], 0..3u64)
            .prop_map(move |(key, ticket, weight, l)| Op::Wait { key, ticket, weight, lease_ms: (l + 1) * 2_000, floored, handoff: !floored }),
        2 => (0..2u8, 0..4u8, 1..3u32, 0..3u64)
            .prop_map(|(key, id, weight, l)| Op::Acquire { key, also: None, id, weight, lease_ms: (l + 1) * 2_000 }),
        3 => (0..2u8, prop_oneof![0..4u8, 10..40u8]).prop_map(|(key, id)| Op::Release { key, id }),
        1 => (0..2u8, 0..6u8).prop_map(|(key, ticket)| Op::Leave { key, ticket }),
        1 => (0..2u8, 1..5u32).prop_map(|(key, limit)| Op::SetLimit { key, limit }),
        2 => (0..4u64).prop_map(|steps| Op::Advance { ms: steps * 1_000 }),
    ]
}

/// `ops` with every ticket given up (left) never asked with again, as a waiter's is not: later asks and
/// leaves of its number take the next of the same priority, flow and flow weight (6 on), under an id
/// of their own. (Redis keeps a given-up ticket given up for a while, against asks reordered behind
/// their leave, which the memory store's never are: the twins agree where tickets are used once.)
pub fn fresh_after_leave(mut ops: Vec<Op>) -> Vec<Op> {
    let mut moved = [0u8; 6];
    for op in &mut ops {
        match op {
            Op::Wait { ticket, .. } => *ticket += moved[usize::from(*ticket)],
            Op::Leave { ticket, .. } => {
                let n = usize::from(*ticket);
                *ticket += moved[n];
                moved[n] = (moved[n] + 6).min(234);
            }
            _ => {}
        }
    }
    ops
}

/// Operations; with `holds`, also permits without a lease (`Store::hold`: the memory store).
pub fn op(holds: bool) -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0..3u8, prop::option::weighted(0.25, 0..3u8), 0..6u8, 1..4u32, 1..5_000u64)
            .prop_map(|(key, also, id, weight, lease_ms)| Op::Acquire { key, also: also.filter(|a| *a != key), id, weight, lease_ms }),
        2 => (0..3u8, 0..6u8).prop_map(|(key, id)| Op::Release { key, id }),
        1 => (0..3u8, 0..6u8, prop::option::weighted(0.7, 1..5_000u64))
            .prop_map(|(key, id, lease_ms)| Op::Renew { key, id, lease_ms }),
        1 => (0..3u8, 0..5u32).prop_map(|(key, limit)| Op::SetLimit { key, limit }),
        2 => (0..3_000u64).prop_map(|ms| Op::Advance { ms }),
        2 => (0..3u8, 1..3u32).prop_map(|(key, weight)| Op::Hold { key, weight }),
        1 => (0..8usize).prop_map(|nth| Op::Unhold { nth }),
    ]
    .prop_filter("permits without a lease", move |op| holds || !matches!(op, Op::Hold { .. } | Op::Unhold { .. }))
}

/// Operations whose times are whole half-seconds, for stores on a clock that also moves by itself (Redis
/// `TIME`): a few real milliseconds between two operations can then never change a decision.
pub fn coarse_op() -> impl Strategy<Value = Op> {
    op(false).prop_map(|op| match op {
        Op::Acquire {
            key,
            also,
            id,
            weight,
            lease_ms,
        } => Op::Acquire {
            key,
            also,
            id,
            weight,
            lease_ms: (lease_ms % 4 + 1) * 1_000,
        },
        Op::Renew { key, id, lease_ms } => Op::Renew {
            key,
            id,
            lease_ms: lease_ms.map(|ms| (ms % 4 + 1) * 1_000),
        },
        Op::Advance { ms } => Op::Advance { ms: ms % 6 * 500 },
        other => other,
    })
}

/// Coarse operations crowding two keys with up to 256 permits each, so that the Redis store's sorted sets
/// grow past their compact encoding (more than 128 members), expire and empty again. Their times are
/// whole 2.5 s steps: a sequence of hundreds of round trips may take over half a second of Redis's own
/// time on a loaded machine, and that must not cross a step.
pub fn crowded_op() -> impl Strategy<Value = Op> {
    // Most operations on the first key, so that it fills up.
    let key = || prop_oneof![4 => Just(0u8), 1 => Just(1u8)];
    prop_oneof![
        12 => (key(), any::<u8>(), prop_oneof![8 => Just(1u32), 1 => 2..4u32], 0..4u64)
            .prop_map(|(key, id, weight, l)| Op::Acquire { key, also: None, id, weight, lease_ms: (l + 1) * 50_000 }),
        3 => (key(), any::<u8>()).prop_map(|(key, id)| Op::Release { key, id }),
        2 => (key(), any::<u8>(), 0..4u64)
            .prop_map(|(key, id, l)| Op::Renew { key, id, lease_ms: Some((l + 1) * 50_000) }),
        1 => (key(), 120..400u32).prop_map(|(key, limit)| Op::SetLimit { key, limit }),
        1 => (0..6u64).prop_map(|steps| Op::Advance { ms: steps * 2_500 }),
    ]
}

/// Permits that [`crowded_sequences`] first takes on key 0, so that every sequence is crowded from
/// the start rather than only when chance piles its acquires up.
pub const CROWD: u8 = 180;

/// Sequences of `ops` on keys with room for a few hundred permits each, after [`CROWD`] acquires of
/// key 0 (weight 1, distinct ids, the longest lease) that every policy admits.
pub fn crowded_sequences(
    ops: impl Strategy<Value = Op>,
) -> impl Strategy<Value = (Policy, Vec<Op>)> {
    let policy = prop_oneof![Just(Policy::new(300, 0)), Just(Policy::new(200, 250))];
    (policy, prop::collection::vec(ops, 400..700)).prop_map(|(policy, ops)| {
        let crowd = (0..CROWD).map(|id| Op::Acquire {
            key: 0,
            also: None,
            id,
            weight: 1,
            lease_ms: 200_000,
        });
        (policy, crowd.chain(ops).collect())
    })
}

pub fn policy() -> impl Strategy<Value = Policy> {
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
pub enum Outcome {
    Admitted {
        in_flight: u32,
        expires_at_ms: u64,
    },
    Unlimited,
    Full {
        index: usize,
        limit: u32,
        in_flight: u32,
    },
    TooHeavy {
        index: usize,
        limit: u32,
    },
    Released(bool),
    Renewed {
        in_flight: u32,
        expires_at_ms: u64,
    },
    Lost,
    Queued {
        index: usize,
        limit: u32,
        in_flight: u32,
    },
    Left(bool),
    Status {
        limit: Limit,
        in_flight: u32,
    },
    Nothing,
}

/// The limits of key `k`'s class: `policy` for even keys, and for odd ones its default and ceiling
/// swapped, so that the keys of one admission are of different classes.
pub fn class(policy: Policy, k: u8) -> Policy {
    match k % 2 {
        0 => policy,
        _ => Policy::new(policy.max_limit, policy.default_limit),
    }
}

/// Applies `op` to `store`; `advance` moves the store's clock.
pub async fn apply_store<S: Store + Wakeups>(
    store: &S,
    advance: &dyn Fn(Duration),
    policy: Policy,
    holds: &mut Vec<(Arc<dyn LocalSlots>, u32)>,
    op: &Op,
) -> Outcome {
    let key = |k: u8| format!("key-{k}");
    let id = |i: u8| PermitId::from(format!("id-{i}"));
    match *op {
        Op::Acquire {
            key: k,
            also,
            id: i,
            weight,
            lease_ms,
        } => {
            let id = id(i);
            let places: Vec<u8> = std::iter::once(k).chain(also).collect();
            let limits: Vec<Policy> = places.iter().map(|k| class(policy, *k)).collect();
            let keys: Vec<String> = places.into_iter().map(key).collect();
            let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
            let req = AcquireRequest {
                keys: &keys,
                id: &id,
                weight,
                lease_ms,
                limits: &limits,
                generated: false,
                ticket: None,
                priority: 0,
                floors: &[],
                holder: None,
                shadow: 0,
            };
            match store.acquire(req).await.unwrap() {
                queued @ Admission::Queued { .. } => panic!("no ticket was asked for: {queued:?}"),
                admission => outcome(admission),
            }
        }
        Op::Wait {
            key: k,
            ticket,
            weight,
            lease_ms,
            floored,
            handoff,
        } => {
            let (i, priority, flow, flow_weight) = waiter(ticket);
            let (id, name) = (id(i), format!("ticket-{ticket}"));
            let keys = [key(k)];
            let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
            let floors = [if floored { floors() } else { Floors::NONE }];
            let req = AcquireRequest {
                keys: &keys,
                id: &id,
                weight,
                lease_ms,
                limits: &[class(policy, k)],
                generated: false,
                ticket: Some(Ticket {
                    name: &name,
                    flow,
                    flow_weight,
                    lease_ms: inflight::TICKET_LEASE_MS,
                    handoff,
                }),
                priority,
                floors: if floored { &floors } else { &[] },
                holder: None,
                shadow: 0,
            };
            outcome(store.acquire(req).await.unwrap())
        }
        Op::Leave { key: k, ticket } => {
            let keys = [Arc::from(key(k))];
            // With its id: a slot a release handed it is given back.
            let (handed, name) = (id(waiter(ticket).0), format!("ticket-{ticket}"));
            let left = store.leave(&keys, &name, Some(&handed));
            Outcome::Left(left.await.unwrap())
        }
        Op::Release { key: k, id: i } => {
            let keys = [Arc::from(key(k))];
            Outcome::Released(store.release(&keys, &id(i), 0).await.unwrap())
        }
        Op::Renew {
            key: k,
            id: i,
            lease_ms,
        } => {
            let req = RenewRequest {
                keys: Arc::from([Arc::from(key(k))]),
                id: id(i),
                lease_ms,
                limits: vec![class(policy, k)],
                readd_weight: None,
                token: 0,
                counted: 0,
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
            let change = OverrideChange::Set(limit);
            let s = store
                .status(&key(k), class(policy, k), change)
                .await
                .unwrap();
            Outcome::Status {
                limit: s.limit,
                in_flight: s.in_flight,
            }
        }
        Op::Advance { ms } => {
            advance(Duration::from_millis(ms));
            Outcome::Nothing
        }
        Op::Hold { key: k, weight } => match store
            .hold(&[&key(k)], &[class(policy, k)], weight, false)
            .unwrap()
        {
            LocalAdmission::Taken { slots, grant, .. } => {
                holds.push((slots, weight));
                Outcome::Admitted {
                    in_flight: grant.in_flight,
                    expires_at_ms: grant.expires_at_ms,
                }
            }
            LocalAdmission::Decided(Admission::Unlimited) => Outcome::Unlimited,
            LocalAdmission::Decided(Admission::Full {
                index,
                limit,
                in_flight,
                ..
            }) => Outcome::Full {
                index,
                limit,
                in_flight,
            },
            LocalAdmission::Decided(Admission::TooHeavy { index, limit }) => {
                Outcome::TooHeavy { index, limit }
            }
            LocalAdmission::Decided(other) => panic!("unexpected {other:?}"),
        },
        Op::Unhold { nth } => {
            if !holds.is_empty() {
                let (slots, weight) = holds.remove(nth % holds.len());
                slots.give_back(weight);
            }
            Outcome::Nothing
        }
    }
}

/// An admission as both stores must agree on it.
fn outcome(admission: Admission) -> Outcome {
    match admission {
        Admission::Admitted { grant, .. } => Outcome::Admitted {
            in_flight: grant.in_flight,
            expires_at_ms: grant.expires_at_ms,
        },
        Admission::Unlimited => Outcome::Unlimited,
        Admission::Full {
            index,
            limit,
            in_flight,
            ..
        } => Outcome::Full {
            index,
            limit,
            in_flight,
        },
        Admission::Queued {
            index,
            limit,
            in_flight,
            ..
        } => Outcome::Queued {
            index,
            limit,
            in_flight,
        },
        Admission::TooHeavy { index, limit } => Outcome::TooHeavy { index, limit },
    }
}
