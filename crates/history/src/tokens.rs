//! Fencing tokens going backwards: per key, one sweep in time order over the admissions of one key
//! (admitted acquires and renewals that re-added the lease) that name a token.
//!
//! Admission B, invoked after admission A completed, goes backwards when
//! - A is of another id, `token(B) <= token(A)`, and B created its lease: every new lease takes a new,
//!   larger token. B may instead have joined a lease of its id (a re-entry repeats that lease's token)
//!   when another admission of its id and key with the same token, or with a token unknown (an acquire or
//!   renewal of unknown outcome, a token not logged), was invoked before B completed;
//! - A is of the same id and `token(B) < token(A)`: a re-entry repeats the token of the lease it joins,
//!   never an older one;
//! - a release or a lost renewal of the same id that names A's token ran entirely between A and B (so
//!   A's lease was gone) and `token(B) <= token(A)`.
//!
//! Only admissions of one key are compared: on Redis Cluster a permit over keys in several slots carries
//! the token of one slot only, and a line gives one token for its first key.

use std::collections::HashMap;

use crate::held::Held;
use crate::read::{History, Kind, Outcome, Sym};

/// Examples kept.
pub(crate) const EXAMPLES: usize = 10;

/// One admission whose token went backwards, and the line it is compared with.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Backwards {
    pub(crate) key: Sym,
    /// The later admission.
    pub(crate) later: u32,
    pub(crate) later_token: u64,
    /// The earlier admission, or the release or lost renewal that ended its lease.
    pub(crate) earlier: u32,
    pub(crate) earlier_token: u64,
}

/// What the sweep found.
#[derive(Debug, Default)]
pub(crate) struct TokenCheck {
    /// Admissions compared (of one key, with a token).
    pub(crate) compared: u64,
    pub(crate) count: u64,
    pub(crate) examples: Vec<Backwards>,
}

/// (token, id, line) of the largest tokens so far: the largest, and the largest of any other id.
type Top = [Option<(u64, Sym, u32)>; 2];

#[derive(Clone, Copy, Default)]
struct Id {
    /// The largest token of this id's admissions completed, and its line.
    admitted: Option<(u64, u32)>,
    /// The largest token of a lease of this id certainly ended, and the line that ended it.
    ended: Option<(u64, u32)>,
}

/// Checks the tokens of `history`; `held` gives the releases and lost renewals that ended a lease.
pub(crate) fn tokens(history: &History, held: &Held) -> TokenCheck {
    // (key, instant, 0 an admission's invoke or 1 a completion, 0 admission or 1 ender, index)
    let mut events: Vec<(Sym, u64, u8, u8, u32)> = Vec::new();
    let mut check = TokenCheck::default();
    for (n, op) in history.ops.iter().enumerate() {
        if op.admits() && op.keys.len() == 1 && op.token(0).is_some() {
            check.compared += 1;
            events.push((op.keys[0], op.invoke_ns, 0, 0, n as u32));
            events.push((op.keys[0], op.complete_ns, 1, 0, n as u32));
        }
    }
    for (n, closer) in held.closers.iter().enumerate() {
        let key = held.slots[closer.slot as usize].0;
        events.push((key, closer.complete, 1, 1, n as u32));
    }
    events.sort_unstable();
    let joins = joins(history);
    let mut ids: HashMap<Sym, Id> = HashMap::new();
    for events in events.chunk_by(|a, b| a.0 == b.0) {
        ids.clear();
        let mut top: Top = [None, None];
        for &(key, _, phase, what, n) in events {
            if what == 1 {
                let closer = &held.closers[n as usize];
                let id = held.slots[closer.slot as usize].1;
                let ended = &mut ids.entry(id).or_default().ended;
                if ended.is_none_or(|(token, _)| token < closer.token) {
                    *ended = Some((closer.token, closer.op));
                }
                continue;
            }
            let op = &history.ops[n as usize];
            let token = op.token(0).expect("admissions with a token");
            let id = ids.entry(op.id).or_default();
            if phase == 1 {
                if id.admitted.is_none_or(|(t, _)| t < token) {
                    id.admitted = Some((token, n));
                }
                raise(&mut top, token, op.id, n);
                continue;
            }
            let other = match top {
                _ if joins[n as usize] => None,
                [Some((_, first, _)), second] if first == op.id => second,
                [first, _] => first,
            };
            let earlier = other
                .filter(|(t, _, _)| token <= *t)
                .map(|(t, _, line)| (t, line))
                .or(id.admitted.filter(|(t, _)| token < *t))
                .or(id.ended.filter(|(t, _)| token <= *t));
            if let Some((earlier_token, earlier)) = earlier {
                check.count += 1;
                if check.examples.len() < EXAMPLES {
                    check.examples.push(Backwards {
                        key,
                        later: n,
                        later_token: token,
                        earlier,
                        earlier_token,
                    });
                }
            }
        }
    }
    check
}

/// Per line: an admission that may have joined a lease of its id rather than created one.
fn joins(history: &History) -> Vec<bool> {
    // (key, id, token (None first), invoke, line) of whatever may have created a lease.
    let mut sources: Vec<(Sym, Sym, Option<u64>, u64, u32)> = Vec::new();
    for (n, op) in history.ops.iter().enumerate() {
        let creates = matches!(
            (op.kind, op.outcome),
            (Kind::Acquire, Outcome::Admitted | Outcome::Error)
                | (Kind::Renew, Outcome::Readded | Outcome::Error)
        );
        if creates {
            for (pos, key) in op.keys.iter().enumerate() {
                // The lease an unknown outcome leaves may carry a token its line never saw.
                let token = op.token(pos).filter(|_| op.outcome != Outcome::Error);
                sources.push((*key, op.id, token, op.invoke_ns, n as u32));
            }
        }
    }
    sources.sort_unstable();
    let mut joins = vec![false; history.ops.len()];
    for slot in sources.chunk_by(|a, b| (a.0, a.1) == (b.0, b.1)) {
        let unknown = slot
            .iter()
            .take_while(|s| s.2.is_none())
            .map(|s| s.3)
            .min()
            .unwrap_or(u64::MAX);
        for same in slot
            .chunk_by(|a, b| a.2 == b.2)
            .filter(|s| s[0].2.is_some())
        {
            for &(_, _, _, _, n) in same {
                let op = &history.ops[n as usize];
                // The earliest invoke of another line with this token (sorted by invoke).
                let other = same.iter().find(|s| s.4 != n).map_or(u64::MAX, |s| s.3);
                joins[n as usize] = unknown.min(other) <= op.complete_ns;
            }
        }
    }
    joins
}

/// Records a completed admission in the two largest tokens of distinct ids.
fn raise(top: &mut Top, token: u64, id: Sym, line: u32) {
    match *top {
        [Some((t, first, _)), _] if first == id && token > t => top[0] = Some((token, id, line)),
        [Some((_, first, _)), _] if first == id => {}
        [first, _] if first.is_none_or(|(t, _, _)| token > t) => {
            *top = [Some((token, id, line)), first];
        }
        [_, second] if second.is_none_or(|(t, _, _)| token > t) => {
            top[1] = Some((token, id, line));
        }
        _ => {}
    }
}
