//! The Redis store's balances ([`QuotaStore`]): `scripts/quota.lua` decides every step. A key's four
//! names share its hash tag (`<prefix>{E}:quota`, `:reservations`, `:amounts`, `:settled`), so that each
//! call touches one slot, on a Redis Cluster too; deadlines are on the Redis clock.
//!
//! The keys with a balance are also in an index, `<prefix>quotas` (`<prefix>{quotas}` on a Cluster),
//! which a view in this process follows as `overrides.rs` does: a reservation on a key the view knows
//! has none is answered with no round trip (settlements and reads of a balance always ask Redis).
//! Funding adds the key to the index (`index.lua`, at most [`MAX_QUOTAS`] keys, never removed) before
//! its balance is set, so the view never misses a metered key for longer than an announcement takes
//! to arrive. The view starts with the store's first quota call.

use super::error::invoke;
use super::naming::{KeyNames, Member};
use super::overrides;
use super::scripts;
use super::store::{fields, number, RedisStore, ToArg};
use crate::clock::millis;
use crate::error::StoreError;
use crate::id::PermitId;
use crate::quota::{
    Balance, Extension, Fund, QuotaStore, Reserve, Settle, Settlement, MAX_BALANCE,
    MAX_OPEN_RESERVATIONS, MAX_QUOTAS, SETTLED_MEMORY,
};

/// What `quota.lua` answers: the outcome and the key's balance.
struct Answer {
    outcome: i64,
    balance: Balance,
    expires_at_ms: u64,
}

impl RedisStore {
    /// Runs `quota.lua`'s `op` on `key` with `args`. Retried once on a dead connection when `retry`:
    /// every operation but a top-up gives the same result when it runs twice.
    async fn quota_call(
        &self,
        key: &str,
        op: &str,
        args: &[&dyn ToArg],
        retry: bool,
    ) -> Result<Answer, StoreError> {
        let names = KeyNames::new(&self.prefix, key, self.conn.is_cluster());
        let tag = names.tag();
        let mut invocation = scripts::QUOTA.prepare_invoke();
        for role in [":quota", ":reservations", ":amounts", ":settled"] {
            invocation.key(format!("{tag}{role}"));
        }
        invocation
            .arg(op)
            .arg(self.offset())
            .arg(millis(SETTLED_MEMORY))
            .arg(MAX_OPEN_RESERVATIONS);
        for arg in args {
            arg.push(&mut invocation);
        }
        let out: Vec<i64> = match retry {
            true => invoke(&self.conn, &invocation).await?,
            false => invocation.invoke_async(&mut self.conn.clone()).await?,
        };
        let [outcome, balance, reserved, expired, expires_at_ms] = fields(&out)?;
        Ok(Answer {
            outcome,
            balance: Balance {
                balance: number(balance)?,
                reserved: number(reserved)?,
                expired: number(expired)?,
            },
            expires_at_ms: number(expires_at_ms)?,
        })
    }
}

fn unexpected(op: &str, outcome: i64) -> StoreError {
    StoreError::Protocol(format!("quota.lua answered {op} with outcome {outcome}"))
}

impl QuotaStore for RedisStore {
    async fn fund(&self, key: &str, fund: Fund) -> Result<Balance, StoreError> {
        let (mode, n, retry) = match fund {
            Fund::Set(n) => ("s", n, true),
            Fund::Add(n) => ("a", n, false),
        };
        let metered = &self.metered;
        let added = overrides::change(&self.conn, &metered.names, MAX_QUOTAS, '+', key, 1).await?;
        let Some(version) = added else {
            return Err(StoreError::TooManyQuotas { max: MAX_QUOTAS });
        };
        metered.view.note(key, true, version);
        let answer = self
            .quota_call(key, "f", &[&mode, &n, &MAX_BALANCE], retry)
            .await?;
        match answer.outcome {
            1 => Ok(answer.balance),
            -2 => Err(StoreError::Rejected(format!(
                "the balance would pass the largest, {MAX_BALANCE}"
            ))),
            other => Err(unexpected("fund", other)),
        }
    }

    async fn balance(&self, key: &str) -> Result<Option<Balance>, StoreError> {
        let answer = self.quota_call(key, "b", &[], true).await?;
        match answer.outcome {
            1 => Ok(Some(answer.balance)),
            -1 => Ok(None),
            other => Err(unexpected("balance", other)),
        }
    }

    async fn reserve(
        &self,
        key: &str,
        id: &PermitId,
        amount: u64,
        ttl_ms: u64,
    ) -> Result<Reserve, StoreError> {
        if self.metered.unmetered(&self.conn, key) {
            return Ok(Reserve::Unmetered);
        }
        let args: [&dyn ToArg; 3] = [&Member(id), &amount, &ttl_ms];
        let answer = self.quota_call(key, "r", &args, true).await?;
        let balance = answer.balance;
        match answer.outcome {
            1 => Ok(Reserve::Reserved {
                balance,
                expires_at_ms: answer.expires_at_ms,
            }),
            0 => Ok(Reserve::Exhausted { balance }),
            2 => Ok(Reserve::Settled { balance }),
            -1 => Ok(Reserve::Unmetered),
            -3 => Err(StoreError::TooManyReservations {
                max: MAX_OPEN_RESERVATIONS,
            }),
            other => Err(unexpected("reserve", other)),
        }
    }

    async fn settle(
        &self,
        key: &str,
        id: &PermitId,
        settle: Settle,
    ) -> Result<Settlement, StoreError> {
        let how = match settle {
            Settle::Commit => "c",
            Settle::Refund => "r",
        };
        let answer = self
            .quota_call(key, "s", &[&Member(id), &how], true)
            .await?;
        match answer.outcome {
            1 => Ok(Settlement::Settled(answer.balance)),
            2 => Ok(Settlement::Already(answer.balance)),
            0 => Ok(Settlement::NotFound(Some(answer.balance))),
            -1 => Ok(Settlement::NotFound(None)),
            other => Err(unexpected("settle", other)),
        }
    }

    async fn extend(&self, key: &str, id: &PermitId, ttl_ms: u64) -> Result<Extension, StoreError> {
        let answer = self
            .quota_call(key, "e", &[&Member(id), &ttl_ms], true)
            .await?;
        match answer.outcome {
            1 => Ok(Extension::Extended {
                expires_at_ms: answer.expires_at_ms,
                balance: answer.balance,
            }),
            0 => Ok(Extension::NotOpen(Some(answer.balance))),
            -1 => Ok(Extension::NotOpen(None)),
            other => Err(unexpected("extend", other)),
        }
    }
}
