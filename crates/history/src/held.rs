//! Where each permit is certainly held: per *slot* (a key and a permit id, which the store counts once),
//! the pieces of time in which some line proves the slot held, whatever the order in which the store
//! ran the operations that overlap.
//!
//! Each *confirmation* (an admitted acquire, a renewal answered "renewed" or "readded") of a slot gives
//! the piece `[complete, invoke + lease)`: the store set the lease between invoke and complete, so it
//! lasts at least until invoke + lease. The piece is cut:
//! - at the invoke of an *ender* (a release, whatever its result, or a renewal answered "lost") that
//!   may have run after the confirmation (it completed after the confirmation's invoke, or its outcome
//!   is unknown and may land later) and whose token does not show it belongs to another lease;
//! - at `max(invoke, confirmation's invoke) + lease` of another *setter* (an admitted or unknown acquire,
//!   a renewal that renewed, re-added or is unknown) of the slot that may have run after it with a
//!   token that does not differ: re-acquiring an id a key holds refreshes its lease, shorter or longer.
//!
//! An ender's or a renewal's token is its own, or else the largest token of its process's admissions of
//! the slot completed before it was invoked (the lease it names, when the store fences by token: the
//! lease it found was the newest of its id), unless one of those admissions logged no token. The slot's
//! weight is the smallest weight of its admissions and renewals (a re-entry may change it).

use std::collections::{BTreeMap, HashMap};

use crate::read::{History, Kind, Op, Outcome, Sym};

/// A stretch of time in which a slot is certainly held, and the confirmation that proves it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Piece {
    pub(crate) slot: u32,
    pub(crate) start: u64,
    pub(crate) end: u64,
    pub(crate) op: u32,
}

/// A release or a lost renewal that certainly ended the lease of `token` (for the token check).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Closer {
    pub(crate) slot: u32,
    pub(crate) complete: u64,
    pub(crate) token: u64,
    pub(crate) op: u32,
}

/// Every slot's pieces.
#[derive(Default)]
pub(crate) struct Held {
    /// Each slot's key and id.
    pub(crate) slots: Vec<(Sym, Sym)>,
    /// Each slot's weight.
    pub(crate) weights: Vec<u32>,
    pub(crate) pieces: Vec<Piece>,
    pub(crate) closers: Vec<Closer>,
}

/// An operation of one slot, as the cuts need it.
#[derive(Clone, Copy, Debug)]
struct Event {
    invoke: u64,
    complete: u64,
    /// An unknown outcome: it may run at any time after its invoke.
    unknown: bool,
    token: Option<u64>,
    /// Setters: the lease it sets (none known: 0).
    lease: u64,
    op: u32,
}

/// The slots' pieces of `history`: O(n log n) over its lines.
pub(crate) fn held(history: &History) -> Held {
    let mut held = Held::default();
    let mut index: HashMap<(Sym, Sym), u32> = HashMap::new();
    let mut entries: Vec<(u32, u32, u32)> = Vec::new();
    for (n, op) in history.ops.iter().enumerate() {
        if !matches!(op.kind, Kind::Acquire | Kind::Release | Kind::Renew) {
            continue;
        }
        for (pos, key) in op.keys.iter().enumerate() {
            let next = u32::try_from(held.slots.len()).expect("fewer than 2^32 slots");
            let slot = *index.entry((*key, op.id)).or_insert_with(|| {
                held.slots.push((*key, op.id));
                next
            });
            entries.push((slot, n as u32, pos as u32));
        }
    }
    held.weights = vec![0; held.slots.len()];
    entries.sort_unstable();
    let mut scratch = Scratch::default();
    let end = history.end_ns();
    for group in entries.chunk_by(|a, b| a.0 == b.0) {
        scratch.slot(history, group, end, &mut held);
    }
    held
}

/// What one slot's pass needs, kept between slots.
#[derive(Default)]
struct Scratch {
    /// (process, complete, invoke, the token a later line of the process names) of admissions.
    admits: Vec<(Sym, u64, u64, Option<u64>)>,
    enders: Sweep,
    setters: Sweep,
    confirmations: Vec<Event>,
}

impl Scratch {
    fn slot(&mut self, history: &History, group: &[(u32, u32, u32)], end: u64, held: &mut Held) {
        let slot = group[0].0;
        let ops = &history.ops;
        self.admits.clear();
        for &(_, n, pos) in group {
            let op = &ops[n as usize];
            if op.admits() {
                let token = op.token(pos as usize);
                self.admits
                    .push((op.process, op.complete_ns, op.invoke_ns, token));
            }
        }
        self.admits.sort_unstable();
        // Each becomes what a later line of its process names: the largest token so far, or none
        // while an admission of unknown token may be the largest (until one invoked after it).
        let (mut process, mut largest, mut unknown_until) = (Sym::MAX, 0, None);
        for admit in &mut self.admits {
            if admit.0 != process {
                (process, largest, unknown_until) = (admit.0, 0, None);
            }
            match admit.3 {
                Some(token) => {
                    largest = largest.max(token);
                    if unknown_until.is_some_and(|until| admit.2 > until) {
                        unknown_until = None;
                    }
                }
                None => unknown_until = unknown_until.max(Some(admit.1)),
            }
            admit.3 = unknown_until.is_none().then_some(largest);
        }
        self.enders.by_invoke.clear();
        self.setters.by_invoke.clear();
        let mut weight = u32::MAX;
        for &(_, n, pos) in group {
            let op = &ops[n as usize];
            let event = Event {
                invoke: op.invoke_ns,
                complete: op.complete_ns,
                unknown: op.outcome == Outcome::Error,
                token: self.token(op, pos as usize),
                lease: op.lease_ns.unwrap_or(0),
                op: n,
            };
            match (op.kind, op.outcome) {
                (Kind::Release, _) | (Kind::Renew, Outcome::Lost) => {
                    self.enders.by_invoke.push(event);
                    // After it, the lease of the token it names is gone: its own token, or (a
                    // release of one key that removed a lease) its process's last lease. A lost
                    // renewal of several keys may have found some of them.
                    let own = op.token(pos as usize);
                    let named = match op.outcome {
                        Outcome::Released if op.keys.len() == 1 => event.token,
                        Outcome::Released | Outcome::Gone => own,
                        Outcome::Lost => own.filter(|_| op.keys.len() == 1),
                        _ => None,
                    };
                    if let Some(token) = named {
                        held.closers.push(Closer {
                            slot,
                            complete: event.complete,
                            token,
                            op: n,
                        });
                    }
                }
                (Kind::Acquire, Outcome::Admitted | Outcome::Error)
                | (Kind::Renew, Outcome::Renewed | Outcome::Readded | Outcome::Error) => {
                    weight = weight.min(op.weight);
                    self.setters.by_invoke.push(event);
                }
                _ => {}
            }
        }
        held.weights[slot as usize] = weight;
        self.enders.start();
        self.setters.start();
        self.confirmations.clear();
        let known = self.setters.by_invoke.iter().filter(|e| !e.unknown);
        self.confirmations.extend(known);
        self.cut(end, slot, held);
    }

    /// The token `op` names for its key at `pos`: its own, or (a release or a renewal) the largest of
    /// its process's admissions of this slot completed before its invoke.
    fn token(&self, op: &Op, pos: usize) -> Option<u64> {
        if let Some(token) = op.token(pos) {
            return Some(token);
        }
        // An admission (or a re-added lease) has a token of its own, never an earlier one.
        if op.kind == Kind::Acquire || op.outcome == Outcome::Readded {
            return None;
        }
        let at = self
            .admits
            .partition_point(|&(p, complete, _, _)| (p, complete) <= (op.process, op.invoke_ns));
        let (process, _, _, token) = *self.admits.get(at.checked_sub(1)?)?;
        token.filter(|_| process == op.process)
    }

    /// Each confirmation's piece, cut by the enders and setters that may have run after it.
    fn cut(&mut self, end: u64, slot: u32, held: &mut Held) {
        for c in &self.confirmations {
            self.enders.advance(c.invoke);
            self.setters.advance(c.invoke);
            if self.enders.active.min(c.token).is_some() {
                continue;
            }
            let mut until = end.min(c.invoke.saturating_add(c.lease));
            if let Some(lease) = self.setters.active.min(c.token) {
                until = until.min(c.invoke.saturating_add(lease));
            }
            // Operations invoked at or after it, while the piece lasts.
            let enders = self.enders.from(c.invoke).iter();
            let first = enders
                .take_while(|e| e.invoke < until)
                .find(|e| agree(e.token, c.token));
            if let Some(e) = first {
                until = e.invoke;
            }
            for s in self.setters.from(c.invoke) {
                if s.invoke >= until {
                    break;
                }
                if s.op != c.op && agree(s.token, c.token) {
                    until = until.min(s.invoke.saturating_add(s.lease));
                }
            }
            if c.complete < until {
                held.pieces.push(Piece {
                    slot,
                    start: c.complete,
                    end: until,
                    op: c.op,
                });
            }
        }
    }
}

/// Enders or setters of one slot by invoke, and those of known outcome by complete: `active` holds those
/// invoked before the instant swept to that may still run after it (in flight then, or of unknown
/// outcome), at their lease (for enders, only whether any agree counts).
#[derive(Default)]
struct Sweep {
    by_invoke: Vec<Event>,
    by_complete: Vec<Event>,
    active: Active,
    /// How many of `by_invoke` entered `active`, and of `by_complete` left it.
    entered: usize,
    left: usize,
}

impl Sweep {
    /// Sorts `by_invoke`; the sweep starts.
    fn start(&mut self) {
        self.by_invoke.sort_unstable_by_key(|e| e.invoke);
        self.by_complete.clear();
        let known = self.by_invoke.iter().filter(|e| !e.unknown);
        self.by_complete.extend(known);
        self.by_complete.sort_unstable_by_key(|e| e.complete);
        (self.active, self.entered, self.left) = (Active::default(), 0, 0);
    }

    /// Moves the sweep on to `at` (never back).
    fn advance(&mut self, at: u64) {
        while let Some(e) = self.by_invoke.get(self.entered).filter(|e| e.invoke < at) {
            self.active.add(e.token, e.lease);
            self.entered += 1;
        }
        while let Some(e) = self.by_complete.get(self.left).filter(|e| e.complete < at) {
            self.active.remove(e.token, e.lease);
            self.left += 1;
        }
    }

    /// Those invoked at or after `at`.
    fn from(&self, at: u64) -> &[Event] {
        &self.by_invoke[self.by_invoke.partition_point(|e| e.invoke < at)..]
    }
}

/// Two operations may concern the same lease: unless both name a token and the tokens differ.
fn agree(a: Option<u64>, b: Option<u64>) -> bool {
    match (a, b) {
        (Some(a), Some(b)) => a == b,
        _ => true,
    }
}

/// Operations that may still run: the smallest value (a lease) among those that agree with a token.
#[derive(Default)]
struct Active {
    all: Multiset,
    unknown: Multiset,
    by_token: HashMap<u64, Multiset>,
}

impl Active {
    fn add(&mut self, token: Option<u64>, value: u64) {
        self.all.add(value);
        match token {
            Some(token) => self.by_token.entry(token).or_default().add(value),
            None => self.unknown.add(value),
        }
    }

    fn remove(&mut self, token: Option<u64>, value: u64) {
        self.all.remove(value);
        match token {
            Some(token) => {
                if let Some(set) = self.by_token.get_mut(&token) {
                    set.remove(value);
                }
            }
            None => self.unknown.remove(value),
        }
    }

    /// The smallest value of those that agree with `token`.
    fn min(&self, token: Option<u64>) -> Option<u64> {
        match token {
            None => self.all.min(),
            Some(token) => {
                let named = self.by_token.get(&token).and_then(Multiset::min);
                match (self.unknown.min(), named) {
                    (Some(a), Some(b)) => Some(a.min(b)),
                    (a, b) => a.or(b),
                }
            }
        }
    }
}

#[derive(Default)]
struct Multiset(BTreeMap<u64, u32>);

impl Multiset {
    fn add(&mut self, value: u64) {
        *self.0.entry(value).or_insert(0) += 1;
    }

    fn remove(&mut self, value: u64) {
        if let Some(count) = self.0.get_mut(&value) {
            *count -= 1;
            if *count == 0 {
                self.0.remove(&value);
            }
        }
    }

    fn min(&self) -> Option<u64> {
        self.0.keys().next().copied()
    }
}
