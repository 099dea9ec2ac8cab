//! The fundings a memory store's account remembers by idempotency key (`quota.rs`), with their
//! answers, so that the same funding again is answered as the first time: each for its key's
//! [`IdempotencyKey::memory`], at most [`MAX_REMEMBERED_FUNDINGS`] (the one forgotten soonest goes first).

use std::collections::{BTreeMap, HashMap};

use super::hash::Hasher;
use crate::clock::millis;
use crate::quota::{fingerprint, Balance, Fund, Funding, IdempotencyKey, MAX_REMEMBERED_FUNDINGS};

/// A funding applied: what it was, and the balance and reserved amount it was answered with.
struct Applied {
    fund: (char, u64),
    balance: u64,
    reserved: u64,
    /// When it is forgotten, and a sequence number: its place in `Fundings::by_time`.
    at: (u64, u64),
}

#[derive(Default)]
pub(super) struct Fundings {
    by_key: HashMap<IdempotencyKey, Applied, Hasher>,
    by_time: BTreeMap<(u64, u64), IdempotencyKey>,
    next_seq: u64,
}

impl Fundings {
    /// Forgets the fundings whose time has passed.
    pub(super) fn forget_past(&mut self, now: u64) {
        while let Some(entry) = self.by_time.first_entry() {
            if entry.key().0 > now {
                break;
            }
            self.by_key.remove(&entry.remove());
        }
    }

    /// The answer to a funding under a key remembered ([`Funding::Repeated`], with `expired`, or
    /// [`Funding::KeyReused`]); `None` for a key not remembered.
    pub(super) fn answer(&self, key: &IdempotencyKey, fund: Fund, expired: u32) -> Option<Funding> {
        let applied = self.by_key.get(key)?;
        if applied.fund != fingerprint(fund) {
            return Some(Funding::KeyReused);
        }
        Some(Funding::Repeated(Balance {
            balance: applied.balance,
            reserved: applied.reserved,
            expired,
        }))
    }

    /// Remembers a funding just applied under `key`, answered with `balance`; at the bound, the one
    /// forgotten soonest makes room first (so this one is always kept).
    pub(super) fn remember(
        &mut self,
        key: IdempotencyKey,
        fund: Fund,
        balance: &Balance,
        now: u64,
    ) {
        if self.by_key.len() >= MAX_REMEMBERED_FUNDINGS as usize && !self.by_key.contains_key(&key)
        {
            if let Some((_, soonest)) = self.by_time.pop_first() {
                self.by_key.remove(&soonest);
            }
        }
        let at = (now.saturating_add(millis(key.memory())), self.next_seq);
        self.next_seq += 1;
        let applied = Applied {
            fund: fingerprint(fund),
            balance: balance.balance,
            reserved: balance.reserved,
            at,
        };
        self.by_time.insert(at, key.clone());
        if let Some(old) = self.by_key.insert(key, applied) {
            self.by_time.remove(&old.at);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quota::{FUNDING_MEMORY, GENERATED_FUNDING_MEMORY};

    const NOW: u64 = 1_700_000_000_000;

    fn balance(balance: u64) -> Balance {
        Balance {
            balance,
            ..Balance::default()
        }
    }

    #[test]
    fn a_key_is_answered_as_the_first_time_until_its_memory_passes() {
        let mut fundings = Fundings::default();
        let (given, generated) = (IdempotencyKey::from("p-1"), IdempotencyKey::generate());
        fundings.remember(given.clone(), Fund::Add(5), &balance(15), NOW);
        fundings.remember(generated.clone(), Fund::Set(3), &balance(3), NOW);
        assert_eq!(
            fundings.answer(&given, Fund::Add(5), 2),
            Some(Funding::Repeated(Balance {
                balance: 15,
                reserved: 0,
                expired: 2
            }))
        );
        assert_eq!(
            fundings.answer(&given, Fund::Add(6), 0),
            Some(Funding::KeyReused)
        );
        assert_eq!(
            fundings.answer(&given, Fund::Set(5), 0),
            Some(Funding::KeyReused)
        );
        fundings.forget_past(NOW + millis(GENERATED_FUNDING_MEMORY));
        assert_eq!(fundings.answer(&generated, Fund::Set(3), 0), None);
        assert!(fundings.answer(&given, Fund::Add(5), 0).is_some());
        fundings.forget_past(NOW + millis(FUNDING_MEMORY));
        assert_eq!(fundings.answer(&given, Fund::Add(5), 0), None);
        assert!(fundings.by_time.is_empty() && fundings.by_key.is_empty());
    }

    #[test]
    fn past_the_bound_the_key_forgotten_soonest_goes_first() {
        let mut fundings = Fundings::default();
        let keep = IdempotencyKey::from("kept");
        fundings.remember(keep.clone(), Fund::Add(1), &balance(1), NOW);
        let first = IdempotencyKey::generate();
        fundings.remember(first.clone(), Fund::Add(1), &balance(2), NOW);
        for i in 1..MAX_REMEMBERED_FUNDINGS {
            let key = IdempotencyKey::generate();
            fundings.remember(key, Fund::Add(1), &balance(2), NOW + u64::from(i));
        }
        assert_eq!(fundings.by_key.len(), MAX_REMEMBERED_FUNDINGS as usize);
        assert_eq!(fundings.by_time.len(), MAX_REMEMBERED_FUNDINGS as usize);
        assert_eq!(fundings.answer(&first, Fund::Add(1), 0), None);
        assert!(fundings.answer(&keep, Fund::Add(1), 0).is_some());
        // The newest is kept, even when it would be forgotten soonest.
        let newest = IdempotencyKey::generate();
        fundings.remember(newest.clone(), Fund::Add(1), &balance(3), NOW - 1);
        assert!(fundings.answer(&newest, Fund::Add(1), 0).is_some());
        assert_eq!(fundings.by_key.len(), MAX_REMEMBERED_FUNDINGS as usize);
        assert_eq!(fundings.by_time.len(), MAX_REMEMBERED_FUNDINGS as usize);
    }
}
