//! The memory store's balances ([`QuotaStore`]): one account per metered key (`account.rs`), changed
//! under its shard's lock of the map, so that each step is atomic. Deadlines run on the store's injected
//! clock; expired reservations are refunded whenever their key is touched. Fundings are remembered by
//! idempotency key in the account (`funded.rs`).

use std::future::{ready, Future};
use std::sync::Arc;

use super::account::Account;
use super::MemoryStore;
use crate::clock::Clock;
use crate::error::StoreError;
use crate::id::PermitId;
use crate::quota::{
    Balance, Extension, Fund, Funding, IdempotencyKey, QuotaStore, Reserve, Settle, Settlement,
    MAX_BALANCE, MAX_OPEN_RESERVATIONS, MAX_QUOTAS,
};

impl<C: Clock> MemoryStore<C> {
    /// Runs `f` on `key`'s account, its expired reservations refunded (and old fundings forgotten)
    /// first; `None` when unmetered.
    fn with_account<R>(&self, key: &str, f: impl FnOnce(&mut Account, u64, u32) -> R) -> Option<R> {
        let mut account = self.inner.quotas.accounts.get_mut(key)?;
        let now = self.inner.time.now_ms();
        let expired = account.sweep(now);
        account.fundings.forget_past(now);
        Some(f(&mut account, now, expired))
    }

    fn fund_now(
        &self,
        key: &str,
        fund: Fund,
        idempotency: &IdempotencyKey,
    ) -> Result<Funding, StoreError> {
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
        account.fundings.forget_past(now);
        if let Some(answer) = account.fundings.answer(idempotency, fund, expired) {
            return Ok(answer);
        }
        let balance = match fund {
            Fund::Set(n) => n,
            Fund::Add(n) => account.balance.saturating_add(n),
        };
        if balance > MAX_BALANCE {
            return Err(too_large(balance));
        }
        account.balance = balance;
        let balance = account.balance(expired);
        account
            .fundings
            .remember(idempotency.clone(), fund, &balance, now);
        Ok(Funding::Applied(balance))
    }
}

impl<C: Clock> QuotaStore for MemoryStore<C> {
    fn fund(
        &self,
        key: &str,
        fund: Fund,
        idempotency: &IdempotencyKey,
    ) -> impl Future<Output = Result<Funding, StoreError>> + Send {
        ready(self.fund_now(key, fund, idempotency))
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
