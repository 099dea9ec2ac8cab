//! The memory store's balances ([`QuotaStore`]): one account per metered key, changed under its shard's
//! lock of the map, so that each step is atomic. Deadlines run on the store's injected clock; expired
//! reservations are refunded whenever their key is touched.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::future::{ready, Future};
use std::sync::Arc;

use dashmap::DashMap;

use super::key::Hasher;
use super::MemoryStore;
use crate::clock::{millis, Clock};
use crate::error::StoreError;
use crate::id::PermitId;
use crate::quota::{
    Balance, Extension, Fund, QuotaStore, Reserve, Settle, Settlement, MAX_BALANCE,
    MAX_OPEN_RESERVATIONS, MAX_QUOTAS, SETTLED_MEMORY,
};

/// Every metered key's account.
#[derive(Default)]
pub(super) struct Quotas {
    accounts: DashMap<Arc<str>, Account, Hasher>,
}

/// How a remembered reservation ended.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Ended {
    Settled(Settle),
    Expired,
}

#[derive(Default)]
struct Account {
    balance: u64,
    reserved: u64,
    /// Open reservations: id -> (amount, deadline, sequence number).
    open: HashMap<PermitId, (u64, u64, u64), Hasher>,
    /// The same, by deadline.
    deadlines: BTreeMap<(u64, u64), PermitId>,
    /// Settled ones, remembered: id -> (how, when forgotten).
    settled: HashMap<PermitId, (Ended, u64), Hasher>,
    /// The same, oldest first.
    forget: VecDeque<(u64, PermitId)>,
    next_seq: u64,
}

impl Account {
    fn balance(&self, expired: u32) -> Balance {
        Balance {
            balance: self.balance,
            reserved: self.reserved,
            expired,
        }
    }

    /// Refunds the reservations past their deadline and forgets old settlements; how many expired.
    fn sweep(&mut self, now: u64) -> u32 {
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
    fn extend(&mut self, id: &PermitId, deadline: u64) -> Option<u64> {
        let (_, old, seq) = self.open.get_mut(id)?;
        self.deadlines.remove(&(*old, *seq));
        *old = deadline;
        self.deadlines.insert((deadline, *seq), id.clone());
        Some(deadline)
    }

    fn reserve(
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

    fn settle(&mut self, id: &PermitId, settle: Settle, now: u64, expired: u32) -> Settlement {
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

impl<C: Clock> MemoryStore<C> {
    /// Runs `f` on `key`'s account, its expired reservations refunded first; `None` when unmetered.
    fn with_account<R>(&self, key: &str, f: impl FnOnce(&mut Account, u64, u32) -> R) -> Option<R> {
        let mut account = self.inner.quotas.accounts.get_mut(key)?;
        let now = self.inner.time.now_ms();
        let expired = account.sweep(now);
        Some(f(&mut account, now, expired))
    }

    fn fund_now(&self, key: &str, fund: Fund) -> Result<Balance, StoreError> {
        let too_large = |balance: u64| {
            StoreError::Rejected(format!(
                "a balance of {balance} would pass the largest, {MAX_BALANCE}"
            ))
        };
        // (Checked before a new key's account is made: a refused funding leaves the key unmetered.)
        let (Fund::Set(n) | Fund::Add(n)) = fund;
        if n > MAX_BALANCE {
            return Err(too_large(n));
        }
        let quotas = &self.inner.quotas.accounts;
        if !quotas.contains_key(key) && quotas.len() >= MAX_QUOTAS {
            return Err(StoreError::TooManyQuotas { max: MAX_QUOTAS });
        }
        let now = self.inner.time.now_ms();
        let mut account = quotas.entry(Arc::from(key)).or_default();
        let expired = account.sweep(now);
        let balance = match fund {
            Fund::Set(n) => n,
            Fund::Add(n) => account.balance.saturating_add(n),
        };
        if balance > MAX_BALANCE {
            return Err(too_large(balance));
        }
        account.balance = balance;
        Ok(account.balance(expired))
    }
}

impl<C: Clock> QuotaStore for MemoryStore<C> {
    fn fund(
        &self,
        key: &str,
        fund: Fund,
    ) -> impl Future<Output = Result<Balance, StoreError>> + Send {
        ready(self.fund_now(key, fund))
    }

    fn balance(
        &self,
        key: &str,
    ) -> impl Future<Output = Result<Option<Balance>, StoreError>> + Send {
        ready(Ok(self.with_account(key, |account, _, expired| {
            account.balance(expired)
        })))
    }

    fn reserve(
        &self,
        key: &str,
        id: &PermitId,
        amount: u64,
        ttl_ms: u64,
    ) -> impl Future<Output = Result<Reserve, StoreError>> + Send {
        let decided = self.with_account(key, |account, now, expired| {
            let crowded = account.open.len() >= MAX_OPEN_RESERVATIONS as usize;
            if crowded && !account.open.contains_key(id) {
                return Err(StoreError::TooManyReservations {
                    max: MAX_OPEN_RESERVATIONS,
                });
            }
            Ok(account.reserve(id, amount, ttl_ms, now, expired))
        });
        ready(decided.unwrap_or(Ok(Reserve::Unmetered)))
    }

    fn settle(
        &self,
        key: &str,
        id: &PermitId,
        settle: Settle,
    ) -> impl Future<Output = Result<Settlement, StoreError>> + Send {
        let settled = self.with_account(key, |account, now, expired| {
            account.settle(id, settle, now, expired)
        });
        ready(Ok(settled.unwrap_or(Settlement::NotFound(None))))
    }

    fn extend(
        &self,
        key: &str,
        id: &PermitId,
        ttl_ms: u64,
    ) -> impl Future<Output = Result<Extension, StoreError>> + Send {
        let extended = self.with_account(key, |account, now, expired| {
            let moved = account.extend(id, now.saturating_add(ttl_ms));
            let balance = account.balance(expired);
            match moved {
                Some(expires_at_ms) => Extension::Extended {
                    expires_at_ms,
                    balance,
                },
                None => Extension::NotOpen(Some(balance)),
            }
        });
        ready(Ok(extended.unwrap_or(Extension::NotOpen(None))))
    }
}
