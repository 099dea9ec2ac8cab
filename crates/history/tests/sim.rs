//! No false alarms: a store simulated one operation at a time, which never lets a key's leases weigh more
//! than its limit and gives every new lease a larger token, is driven by clients whose operations overlap
//! in time (invoke, then the store's step, then complete). Their history, with unknown outcomes, given
//! ids shared by processes (re-entries), leases that lapse, slow answers and limits that change, must show
//! no certain over-admission and no token going backwards.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};

use inflight_history::check_text;
use proptest::prelude::*;
use serde_json::{json, Value};

const KEYS: [&str; 3] = ["a", "b", "c"];
const US: u64 = 1_000;
const MS: u64 = 1_000_000;

struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        // xorshift64*
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) % n
    }

    fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }
}

struct Lease {
    weight: u32,
    expires: u64,
    token: u64,
}

/// A key of the store: its limit, its token generation, its leases by id.
struct Key {
    limit: u32,
    generation: u64,
    leases: HashMap<String, Lease>,
}

impl Key {
    fn count(&self) -> u32 {
        self.leases.values().map(|lease| lease.weight).sum()
    }
}

#[derive(Clone, Debug)]
struct Handle {
    keys: Vec<&'static str>,
    id: String,
    weight: u32,
    lease: u64,
    tokens: Vec<u64>,
}

enum Step {
    Acquire(Handle),
    Release(Handle),
    Renew(Handle),
}

/// What the store answered.
enum Answer {
    Admitted(Vec<u64>),
    Full,
    Released(bool),
    Renewed,
    Readded(Vec<u64>),
    Lost,
}

struct Sim {
    rng: Rng,
    keys: HashMap<&'static str, Key>,
    lines: Vec<Value>,
    ids: u64,
}

impl Sim {
    fn limits(&self, keys: &[&str]) -> Vec<u32> {
        keys.iter().map(|key| self.keys[key].limit).collect()
    }

    /// The store's step, at `now`: one atomic decision.
    fn apply(&mut self, now: u64, step: &Step) -> Answer {
        for key in self.keys.values_mut() {
            key.leases.retain(|_, lease| lease.expires > now);
        }
        match step {
            Step::Acquire(h) => {
                let room = h.keys.iter().all(|key| {
                    let key = &self.keys[key];
                    let held = key.leases.get(&h.id).map_or(0, |lease| lease.weight);
                    key.count() - held + h.weight <= key.limit
                });
                if !room {
                    return Answer::Full;
                }
                let tokens = h.keys.iter().map(|key| {
                    let key = self.keys.get_mut(key).expect("a key");
                    let token = match key.leases.get(&h.id) {
                        Some(lease) => lease.token,
                        None => {
                            key.generation += 1;
                            key.generation
                        }
                    };
                    let lease = Lease {
                        weight: h.weight,
                        expires: now + h.lease,
                        token,
                    };
                    key.leases.insert(h.id.clone(), lease);
                    token
                });
                Answer::Admitted(tokens.collect())
            }
            Step::Release(h) => {
                let mut released = false;
                for (key, token) in h.keys.iter().zip(&h.tokens) {
                    let leases = &mut self.keys.get_mut(key).expect("a key").leases;
                    if leases.get(&h.id).is_some_and(|lease| lease.token == *token) {
                        leases.remove(&h.id);
                        released = true;
                    }
                }
                Answer::Released(released)
            }
            Step::Renew(h) => {
                let lease =
                    |key: &Key, token: u64| key.leases.get(&h.id).map(|lease| lease.token == token);
                let found: Vec<Option<bool>> = h
                    .keys
                    .iter()
                    .zip(&h.tokens)
                    .map(|(k, t)| lease(&self.keys[k], *t))
                    .collect();
                let other = found.contains(&Some(false));
                let room = h.keys.iter().zip(&found).all(|(key, found)| {
                    found.is_some() || self.keys[key].count() + h.weight <= self.keys[key].limit
                });
                if other || !room {
                    return Answer::Lost;
                }
                let present = found.iter().all(Option::is_some);
                let mut tokens = Vec::new();
                for key in &h.keys {
                    let key = self.keys.get_mut(key).expect("a key");
                    // A renewal extends a lease as it is (weight included), or adds it anew.
                    if let Some(lease) = key.leases.get_mut(&h.id) {
                        lease.expires = now + h.lease;
                        tokens.push(lease.token);
                        continue;
                    }
                    key.generation += 1;
                    let token = key.generation;
                    let lease = Lease {
                        weight: h.weight,
                        expires: now + h.lease,
                        token,
                    };
                    key.leases.insert(h.id.clone(), lease);
                    tokens.push(token);
                }
                match present {
                    true => Answer::Renewed,
                    false => Answer::Readded(tokens),
                }
            }
        }
    }

    /// What a client does next, given the permits it holds.
    fn next_step(&mut self, held: &mut Vec<Handle>) -> Step {
        if held.is_empty() || (held.len() < 3 && self.rng.chance(45)) {
            let first = self.rng.below(3) as usize;
            let mut keys = vec![KEYS[first]];
            if self.rng.chance(25) {
                keys.push(KEYS[(first + 1 + self.rng.below(2) as usize) % 3]);
            }
            self.ids += 1;
            let id = match self.rng.chance(30) {
                true => format!("given-{}", self.rng.below(2)),
                false => format!("id-{}", self.ids),
            };
            return Step::Acquire(Handle {
                keys,
                id,
                weight: 1 + self.rng.below(3) as u32,
                lease: (2 + self.rng.below(20)) * MS,
                tokens: Vec::new(),
            });
        }
        let handle = held.swap_remove(self.rng.below(held.len() as u64) as usize);
        match self.rng.chance(55) {
            true => Step::Release(handle),
            false => Step::Renew(handle),
        }
    }

    /// The line of a completed step.
    fn line(
        &mut self,
        who: &str,
        step: &Step,
        answer: Option<&Answer>,
        at: (u64, u64),
        limits: &[u32],
    ) -> Value {
        let (op, h) = match step {
            Step::Acquire(h) => ("acquire", h),
            Step::Release(h) => ("release", h),
            Step::Renew(h) => ("renew", h),
        };
        let (result, tokens) = match answer {
            None => ("error", None),
            Some(Answer::Admitted(tokens)) => ("admitted", Some(tokens.clone())),
            Some(Answer::Full) => ("full", None),
            Some(Answer::Released(true)) => ("released", None),
            Some(Answer::Released(false)) => ("gone", None),
            Some(Answer::Renewed) => ("renewed", None),
            Some(Answer::Readded(tokens)) => ("readded", Some(tokens.clone())),
            Some(Answer::Lost) => ("lost", None),
        };
        let mut line = json!({
            "process": who, "op": op, "keys": h.keys, "id": h.id, "weight": h.weight,
            "lease_ms": h.lease / MS, "limits": limits, "invoke_ns": at.0, "complete_ns": at.1,
            "result": result,
        });
        // Tokens as a client logs them: per key, the first key's only, or not at all.
        let tokens =
            tokens.or_else(|| (op != "acquire" && self.rng.chance(50)).then(|| h.tokens.clone()));
        match (tokens, self.rng.below(10)) {
            (Some(tokens), 0..=4) if !tokens.is_empty() => line["tokens"] = json!(tokens),
            (Some(tokens), 5..=8) if !tokens.is_empty() => line["token"] = json!(tokens[0]),
            _ => {}
        }
        line
    }
}

/// A run of `clients` clients (over 3 processes) doing `steps` steps each.
fn simulate(seed: u64, clients: usize, steps: usize) -> Vec<Value> {
    let mut sim = Sim {
        rng: Rng(seed | 1),
        keys: HashMap::new(),
        lines: Vec::new(),
        ids: 0,
    };
    for key in KEYS {
        let limit = 1 + sim.rng.below(4) as u32;
        sim.keys.insert(
            key,
            Key {
                limit,
                generation: 0,
                leases: HashMap::new(),
            },
        );
    }
    // (instant, sequence, client, phase: 0 invoke, 1 the store's step, 2 complete)
    let mut queue = BinaryHeap::new();
    let mut held: Vec<Vec<Handle>> = vec![Vec::new(); clients];
    let mut doing: Vec<Option<Doing>> = (0..clients).map(|_| None).collect();
    let mut left = vec![steps; clients];
    let mut sequence = 0u64;
    for client in 0..clients {
        queue.push(Reverse((
            1_000_000 * MS + client as u64 * US,
            sequence,
            client,
            0,
        )));
        sequence += 1;
    }
    while let Some(Reverse((now, _, client, phase))) = queue.pop() {
        let next = match phase {
            0 => {
                let step = sim.next_step(&mut held[client]);
                doing[client] = Some((step, now, None, Vec::new()));
                now + sim.rng.below(2_000) * US
            }
            1 => {
                let (step, _, answer, limits) = doing[client].as_mut().expect("a step under way");
                if sim.rng.chance(3) {
                    let key = KEYS[sim.rng.below(3) as usize];
                    sim.keys.get_mut(key).expect("a key").limit = 1 + sim.rng.below(4) as u32;
                }
                // An unknown outcome: the step ran, or did not.
                let unknown = sim.rng.chance(8);
                let ran = !unknown || sim.rng.chance(50);
                let answered = ran.then(|| sim.apply(now, step));
                *limits = sim.limits(&step_keys(step));
                *answer = if unknown { None } else { answered };
                let slow = sim.rng.chance(5);
                now + sim.rng.below(if slow { 15_000 } else { 2_000 }) * US
            }
            _ => {
                let (step, invoked, answer, limits) =
                    doing[client].take().expect("a step under way");
                let who = format!("p{}", client % 3);
                let line = sim.line(&who, &step, answer.as_ref(), (invoked, now), &limits);
                sim.lines.push(line);
                match (step, answer) {
                    (Step::Acquire(mut h), Some(Answer::Admitted(tokens))) => {
                        h.tokens = tokens;
                        held[client].push(h);
                    }
                    (Step::Renew(mut h), Some(Answer::Readded(tokens))) => {
                        h.tokens = tokens;
                        held[client].push(h);
                    }
                    (Step::Renew(h), Some(Answer::Renewed) | None) => held[client].push(h),
                    _ => {}
                }
                left[client] -= 1;
                if left[client] == 0 {
                    continue;
                }
                let stall = sim.rng.chance(7);
                now + sim.rng.below(if stall { 40_000 } else { 3_000 }) * US
            }
        };
        queue.push(Reverse((next, sequence, client, (phase + 1) % 3)));
        sequence += 1;
    }
    sim.lines
}

/// A client's step under way: the step, its invoke, the store's answer, the limits then.
type Doing = (Step, u64, Option<Answer>, Vec<u32>);

fn step_keys(step: &Step) -> Vec<&'static str> {
    match step {
        Step::Acquire(h) | Step::Release(h) | Step::Renew(h) => h.keys.clone(),
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(96))]

    #[test]
    fn a_store_that_keeps_its_limits_is_never_reported_over_them(
        seed in any::<u64>(), clients in 2usize..9, steps in 20usize..120,
    ) {
        let lines = simulate(seed, clients, steps);
        let text: Vec<String> = lines.iter().map(Value::to_string).collect();
        let text = text.join("\n");
        let report = check_text("sim", &text).expect("a readable history");
        prop_assert!(report.admissions > 0);
        prop_assert!(report.ok, "{}\n{}", report.text(), text);
    }
}

/// The simulation is not vacuous: the checker sees its keys held, and one admission added to its
/// history on a full key is caught.
#[test]
fn the_simulation_holds_its_keys_and_one_extra_admission_is_caught() {
    let mut lines = simulate(7, 6, 100);
    let check = |lines: &[Value]| {
        let text: Vec<String> = lines.iter().map(Value::to_string).collect();
        check_text("sim", &text.join("\n")).expect("a readable history")
    };
    let report = check(&lines);
    assert!(report.ok, "{}", report.text());
    assert!(
        report.keys.iter().any(|key| key.peak_held >= 2),
        "{}",
        report.text()
    );
    let end = lines
        .iter()
        .map(|line| line["complete_ns"].as_u64().unwrap())
        .max()
        .unwrap();
    for key in KEYS {
        let limit = report
            .keys
            .iter()
            .find(|k| k.key == key)
            .and_then(|k| k.limit)
            .unwrap();
        lines.push(json!({
            "process": "intruder", "op": "acquire", "keys": [key], "id": "intruder", "weight": limit + 1,
            "lease_ms": 1, "limits": [limit], "invoke_ns": end, "complete_ns": end, "result": "admitted",
        }));
    }
    let report = check(&lines);
    assert_eq!(report.over_admissions, 3, "{}", report.text());
}
