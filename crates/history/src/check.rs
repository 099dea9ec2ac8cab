//! Over-admission: per key, one sweep over the certainly-held pieces in time order (ends before starts
//! at the same instant, since a piece is `[start, end)`), each slot counted once at its weight. An
//! *episode* is a stretch of instants in which the certainly-held weight exceeds the key's limit.

use std::collections::HashMap;

use crate::held::Held;
use crate::read::{History, Limit, Sym};

/// Examples kept per key (the first episodes, each at its peak).
pub(crate) const EXAMPLES: usize = 3;

/// Holders listed in an example.
const HOLDERS: usize = 16;

/// What the sweep found on one key.
#[derive(Debug, Default)]
pub(crate) struct KeyCheck {
    pub(crate) key: Sym,
    /// The most weight certainly held at once.
    pub(crate) peak: u64,
    pub(crate) episodes: u64,
    pub(crate) largest_excess: u64,
    pub(crate) examples: Vec<Example>,
}

/// An instant of an episode at which its excess was largest.
#[derive(Debug)]
pub(crate) struct Example {
    pub(crate) at_ns: u64,
    pub(crate) held: u64,
    pub(crate) limit: u32,
    /// (the line that proves the slot held, the slot's weight) of each holder.
    pub(crate) holders: Vec<(u32, u32)>,
}

/// Each key with a certainly-held piece, in the order of their names.
pub(crate) fn over_admission(history: &History, held: &Held) -> Vec<KeyCheck> {
    // (key, instant, 0 an end or 1 a start, piece)
    let mut events: Vec<(Sym, u64, u8, u32)> = Vec::with_capacity(held.pieces.len() * 2);
    for (n, piece) in held.pieces.iter().enumerate() {
        let key = held.slots[piece.slot as usize].0;
        events.push((key, piece.start, 1, n as u32));
        events.push((key, piece.end, 0, n as u32));
    }
    events.sort_unstable();
    let mut count = vec![0u32; held.slots.len()];
    let mut checks: Vec<KeyCheck> = events
        .chunk_by(|a, b| a.0 == b.0)
        .map(|events| key(history, held, events, &mut count))
        .collect();
    checks.sort_by(|a, b| history.names.get(a.key).cmp(history.names.get(b.key)));
    checks
}

/// One key's sweep; `count` (pieces of each slot in force) is all zeros before and after.
fn key(
    history: &History,
    held: &Held,
    events: &[(Sym, u64, u8, u32)],
    count: &mut [u32],
) -> KeyCheck {
    let key = events[0].0;
    let checked = match history.limits.get(&key).copied() {
        Some(Limit::At(n)) => Some(n),
        _ => None,
    };
    let mut check = KeyCheck {
        key,
        ..KeyCheck::default()
    };
    let (mut total, mut in_episode, mut episode_peak) = (0u64, false, 0u64);
    for instant in events.chunk_by(|a, b| a.1 == b.1) {
        for &(_, _, start, n) in instant {
            let slot = held.pieces[n as usize].slot as usize;
            let weight = u64::from(held.weights[slot]);
            if start == 1 {
                count[slot] += 1;
                if count[slot] == 1 {
                    total += weight;
                }
            } else {
                count[slot] -= 1;
                if count[slot] == 0 {
                    total -= weight;
                }
            }
        }
        check.peak = check.peak.max(total);
        let Some(limit) = checked.filter(|limit| total > u64::from(*limit)) else {
            in_episode = false;
            continue;
        };
        let excess = total - u64::from(limit);
        if !in_episode {
            in_episode = true;
            episode_peak = 0;
            check.episodes += 1;
        }
        check.largest_excess = check.largest_excess.max(excess);
        if excess > episode_peak {
            episode_peak = excess;
            if check.episodes as usize <= EXAMPLES {
                check.examples.truncate(check.episodes as usize - 1);
                check.examples.push(Example {
                    at_ns: instant[0].1,
                    held: total,
                    limit,
                    holders: Vec::new(),
                });
            }
        }
    }
    for example in &mut check.examples {
        example.holders = holders(held, events, example.at_ns);
    }
    check
}

/// The holders in force at `at` among the pieces of `events` (once per slot, by its latest piece).
fn holders(held: &Held, events: &[(Sym, u64, u8, u32)], at: u64) -> Vec<(u32, u32)> {
    let mut slots: HashMap<u32, (u64, u32)> = HashMap::new();
    for &(_, _, start, n) in events {
        let piece = &held.pieces[n as usize];
        if start == 1 && piece.start <= at && at < piece.end {
            let latest = slots.entry(piece.slot).or_insert((piece.start, piece.op));
            if piece.start >= latest.0 {
                *latest = (piece.start, piece.op);
            }
        }
    }
    let mut holders: Vec<(u32, u32)> = slots
        .into_iter()
        .map(|(slot, (_, op))| (op, held.weights[slot as usize]))
        .collect();
    holders.sort_unstable();
    holders.truncate(HOLDERS);
    holders
}
