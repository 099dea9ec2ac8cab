//! The Redis store's balances ([`QuotaStore`]): `scripts/quota.lua` decides every step. A key's six
//! names share its hash tag (`<prefix>{E}:quota`, `:reservations`, `:amounts`, `:settled`, and the
//! fundings remembered by idempotency key, `:funded` and `:fundings`), so that each call touches one
//! slot, on a Redis Cluster too; deadlines are on the Redis clock.
//!
//! Every call may be sent twice (the cluster client and the Sentinel follower re-send a command whose
//! connection dropped, and this store tries once more itself): reservations, settlements and extensions
//! are idempotent by reservation id, and a funding by its idempotency key, remembered in the same script
//! that applies it (and so replicated with it, to the replica a failover promotes).
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
    Balance, Extension, Fund, Funding, IdempotencyKey, QuotaStore, Reserve, Settle, Settlement,
    MAX_BALANCE, MAX_OPEN_RESERVATIONS, MAX_QUOTAS, MAX_REMEMBERED_FUNDINGS, SETTLED_MEMORY,
};

/// What `quota.lua` answers: the outcome and the key's balance.
struct Answer {
    outcome: i64,
    balance: Balance,
    expires_at_ms: u64,
}

impl RedisStore {
    /// Runs `quota.lua`'s `op` on `key` with `args`, once more on a dead connection: every operation
    /// gives the same result when it runs twice (a funding by its idempotency key).
    async fn quota_call(
        &self,
        key: &str,
        op: &str,
        args: &[&dyn ToArg],
    ) -> Result<Answer, StoreError> {
        let names = KeyNames::new(&self.prefix, key, self.conn.is_cluster());
        let tag = names.tag();
        let mut invocation = scripts::QUOTA.prepare_invoke();
        for role in [
            ":quota",
            ":reservations",
            ":amounts",
            ":settled",
            ":funded",
            ":fundings",
        ] {
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
        let out: Vec<i64> = invoke(&self.conn, &invocation).await?;
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
    async fn fund(
        &self,
        key: &str,
        fund: Fund,
        idempotency: &IdempotencyKey,
    ) -> Result<Funding, StoreError> {
        let (mode, n) = match fund {
            Fund::Set(n) => ("s", n),
            Fund::Add(n) => ("a", n),
        };
        let metered = &self.metered;
        let added = overrides::change(&self.conn, &metered.names, MAX_QUOTAS, '+', key, 1).await?;
        let Some(version) = added else {
            return Err(StoreError::TooManyQuotas { max: MAX_QUOTAS });
        };
        metered.view.note(key, true, version);
        let once: [&dyn ToArg; 6] = [
            &mode,
            &n,
            &MAX_BALANCE,
            &Member(idempotency.id()),
            &millis(idempotency.memory()),
            &MAX_REMEMBERED_FUNDINGS,
        ];
        let answer = self.quota_call(key, "f", &once).await?;
        match answer.outcome {
            1 => Ok(Funding::Applied(answer.balance)),
            3 => Ok(Funding::Repeated(answer.balance)),
            -4 => Ok(Funding::KeyReused),
            -2 => Err(StoreError::Rejected(format!(
                "the balance would pass the largest, {MAX_BALANCE}"
            ))),
            other => Err(unexpected("fund", other)),
        }
    }

    async fn balance(&self, key: &str) -> Result<Option<Balance>, StoreError> {
        let answer = self.quota_call(key, "b", &[]).await?;
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
        let answer = self.quota_call(key, "r", &args).await?;
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
        let answer = self.quota_call(key, "s", &[&Member(id), &how]).await?;
        match answer.outcome {
            1 => Ok(Settlement::Settled(answer.balance)),
            2 => Ok(Settlement::Already(answer.balance)),
            0 => Ok(Settlement::NotFound(Some(answer.balance))),
            -1 => Ok(Settlement::NotFound(None)),
            other => Err(unexpected("settle", other)),
        }
    }

    async fn extend(&self, key: &str, id: &PermitId, ttl_ms: u64) -> Result<Extension, StoreError> {
        let answer = self.quota_call(key, "e", &[&Member(id), &ttl_ms]).await?;
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
