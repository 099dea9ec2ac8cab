//! A metered key's account in the memory store (`quota.rs`): its balance, its open reservations and
//! the settlements it remembers, and the rules of each step on them.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::Arc;

use dashmap::DashMap;

use super::funded::Fundings;
use super::hash::Hasher;
use crate::clock::millis;
use crate::id::PermitId;
use crate::quota::{Balance, Reserve, Settle, Settlement, MAX_OPEN_RESERVATIONS, SETTLED_MEMORY};

/// Every metered key's account.
#[derive(Default)]
pub(super) struct Quotas {
    pub(super) accounts: DashMap<Arc<str>, Account, Hasher>,
}

/// How a remembered reservation ended.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Ended {
    Settled(Settle),
    Expired,
}

#[derive(Default)]
pub(super) struct Account {
    pub(super) balance: u64,
    reserved: u64,
    /// Open reservations: id -> (amount, deadline, sequence number).
    pub(super) open: HashMap<PermitId, (u64, u64, u64), Hasher>,
    /// The same, by deadline.
    deadlines: BTreeMap<(u64, u64), PermitId>,
    /// Settled ones, remembered: id -> (how, when forgotten).
    settled: HashMap<PermitId, (Ended, u64), Hasher>,
    /// The same, oldest first.
    forget: VecDeque<(u64, PermitId)>,
    next_seq: u64,
    /// The fundings applied, by idempotency key, while remembered.
    pub(super) fundings: Fundings,
}

impl Account {
    pub(super) fn balance(&self, expired: u32) -> Balance {
        Balance {
            balance: self.balance,
            reserved: self.reserved,
            expired,
        }
    }

    /// Refunds the reservations past their deadline and forgets old settlements; how many expired.
    pub(super) fn sweep(&mut self, now: u64) -> u32 {
        let mut expired = 0;
        while let Some(entry) = self.deadlines.first_entry() {
            if entry.key().0 > now {
                break;
            }
            let id = entry.remove();
            if let Some((amount, _, _)) = self.open.remove(&id) {
                self.balance += amount;
                self.reserved -= amount;
                self.remember(id, Ended::Expired, now);
                expired += 1;
            }
        }
        while self.forget.front().is_some_and(|(at, _)| *at <= now) {
            self.forget_oldest();
        }
        expired
    }

    fn remember(&mut self, id: PermitId, ended: Ended, now: u64) {
        let at = now.saturating_add(millis(SETTLED_MEMORY));
        self.settled.insert(id.clone(), (ended, at));
        self.forget.push_back((at, id));
        if self.forget.len() > MAX_OPEN_RESERVATIONS as usize {
            self.forget_oldest();
        }
    }

    fn forget_oldest(&mut self) {
        if let Some((at, id)) = self.forget.pop_front() {
            if self.settled.get(&id).is_some_and(|(_, when)| *when == at) {
                self.settled.remove(&id);
            }
        }
    }

    /// Moves an open reservation's deadline; `None` when `id` is not open.
    pub(super) fn extend(&mut self, id: &PermitId, deadline: u64) -> Option<u64> {
        let (_, old, seq) = self.open.get_mut(id)?;
        self.deadlines.remove(&(*old, *seq));
        *old = deadline;
        self.deadlines.insert((deadline, *seq), id.clone());
        Some(deadline)
    }

    pub(super) fn reserve(
        &mut self,
        id: &PermitId,
        amount: u64,
        ttl_ms: u64,
        now: u64,
        expired: u32,
    ) -> Reserve {
        let deadline = now.saturating_add(ttl_ms);
        // Held already: the same reservation, its deadline moved.
        if let Some(expires_at_ms) = self.extend(id, deadline) {
            return Reserve::Reserved {
                balance: self.balance(expired),
                expires_at_ms,
            };
        }
        if self.settled.contains_key(id) {
            return Reserve::Settled {
                balance: self.balance(expired),
            };
        }
        if self.balance < amount {
            return Reserve::Exhausted {
                balance: self.balance(expired),
            };
        }
        self.balance -= amount;
        self.reserved += amount;
        let seq = self.next_seq;
        self.next_seq += 1;
        self.open.insert(id.clone(), (amount, deadline, seq));
        self.deadlines.insert((deadline, seq), id.clone());
        Reserve::Reserved {
            balance: self.balance(expired),
            expires_at_ms: deadline,
        }
    }

    pub(super) fn settle(
        &mut self,
        id: &PermitId,
        settle: Settle,
        now: u64,
        expired: u32,
    ) -> Settlement {
        let Some((amount, deadline, seq)) = self.open.remove(id) else {
            let already = self.settled.get(id).map(|(ended, _)| *ended);
            let balance = self.balance(expired);
            return match already {
                Some(ended) if ended == Ended::Settled(settle) => Settlement::Already(balance),
                _ => Settlement::NotFound(Some(balance)),
            };
        };
        self.deadlines.remove(&(deadline, seq));
        self.reserved -= amount;
        if settle == Settle::Refund {
            self.balance += amount;
        }
        self.remember(id.clone(), Ended::Settled(settle), now);
        Settlement::Settled(self.balance(expired))
    }
}
