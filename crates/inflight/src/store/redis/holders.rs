//! [`Holders`] on Redis: `holders.lua` on the key's slot, its answer read back into holders and waiters;
//! listing pages take turns in the [`ListingLane`](super::ListingLane) with the busy keys' pages.

use std::sync::Arc;

use redis::Value;

use super::error::invoke;
use super::naming::{KeyNames, Member};
use super::scripts;
use super::store::RedisStore;
use crate::clock::millis;
use crate::error::StoreError;
use crate::id::PermitId;
use crate::options::DEFAULT_LEASE;
use crate::store::holders::{parse_cursor, Holder, Holders, PermitPage, Waiter};

impl Holders for RedisStore {
    /// Holders in `ZSCAN` order over the key's leases; the cursor is `ZSCAN`'s.
    async fn permits(&self, key: &str, cursor: Option<&str>) -> Result<PermitPage, StoreError> {
        let cursor = parse_cursor(cursor)?;
        // A page is paced with the busy keys' (ListingLane): however many lists are walked at once,
        // Redis is left to admissions about half the time.
        let turn = self.listing_lane.take_turn().await;
        let answer: Value = self.holders_call(key, "list", cursor.to_string()).await?;
        drop(turn);
        let unexpected = || StoreError::Protocol("unexpected answer of holders.lua".into());
        let (next, holders, waiters): (String, Vec<Vec<u8>>, Vec<Vec<u8>>) =
            redis::from_redis_value(answer).map_err(|_| unexpected())?;
        let holders = holders
            .chunks_exact(4)
            .map(|row| holder(row).ok_or_else(unexpected))
            .collect::<Result<_, _>>()?;
        let waiters = waiters
            .chunks_exact(2)
            .map(|row| waiter(row).ok_or_else(unexpected))
            .collect::<Result<_, _>>()?;
        Ok(PermitPage {
            holders,
            waiters,
            unlisted: 0,
            cursor: (next != "0").then_some(next),
        })
    }

    async fn revoke(&self, key: &str, id: &PermitId) -> Result<bool, StoreError> {
        let revoked: i64 = self.holders_call(key, "revoke", Member(id).bytes()).await?;
        Ok(revoked == 1)
    }

    async fn revoke_waiter(&self, key: &str, ticket: &str) -> Result<bool, StoreError> {
        let revoked: i64 = self.holders_call(key, "revoke_waiter", ticket).await?;
        Ok(revoked == 1)
    }
}

impl RedisStore {
    async fn holders_call<T: redis::FromRedisValue>(
        &self,
        key: &str,
        call: &str,
        arg: impl redis::ToRedisArgs,
    ) -> Result<T, StoreError> {
        let mut invocation = scripts::HOLDERS.prepare_invoke();
        KeyNames::new(&self.prefix, key, self.conn.is_cluster()).declare(&mut invocation);
        invocation.arg(self.offset()).arg(call).arg(arg);
        invoke(&self.conn, &invocation).await
    }
}

/// A permit id as Redis stores it ([`Member`]), read back.
fn permit_id(bytes: &[u8]) -> Option<PermitId> {
    match bytes {
        [0xFF, uuid @ ..] => Some(PermitId::from(
            uuid::Uuid::from_slice(uuid).ok()?.to_string(),
        )),
        text => Some(PermitId::from(std::str::from_utf8(text).ok()?)),
    }
}

/// `id, deadline, entry, holder field` (common.lua): the entry's weight and token, the holder field's
/// admission time and label; without them, a plain lease admitted a default lease before its deadline,
/// and its token not kept.
fn holder(row: &[Vec<u8>]) -> Option<Holder> {
    let [id, deadline, entry, noted] = row else {
        return None;
    };
    let text = |bytes: &[u8]| std::str::from_utf8(bytes).ok().map(str::to_owned);
    let expires_at_ms: u64 = text(deadline)?.parse().ok()?;
    let entry = text(entry)?;
    let mut fields = entry.split(' ');
    let weight = fields
        .next()
        .filter(|w| !w.is_empty())
        .map_or(Some(1), |w| w.parse().ok())?;
    let lease_ms = fields
        .next()
        .map_or(Some(millis(DEFAULT_LEASE)), |l| l.parse().ok())?;
    let token: u64 = fields
        .next()
        .filter(|t| !t.is_empty())
        .map_or(Some(0), |t| t.parse().ok())?;
    let noted = text(noted)?;
    let (admitted_at_ms, label) = match noted.split_once(' ') {
        Some((at, label)) => (at.parse().ok()?, Some(label).filter(|l| !l.is_empty())),
        // A token is the Redis clock in microseconds at admission (or just past the key's last one).
        None if token > 0 => (token / 1000, None),
        None => (expires_at_ms.saturating_sub(lease_ms), None),
    };
    Some(Holder {
        id: permit_id(id)?,
        token,
        weight,
        admitted_at_ms,
        lease_expires_at_ms: expires_at_ms,
        holder: label.map(Arc::from),
    })
}

/// `member, info` (queue.lua): the member's level, weight and ticket; the info's arrival time, flow
/// and label.
fn waiter(row: &[Vec<u8>]) -> Option<Waiter> {
    let [member, info] = row else {
        return None;
    };
    let member = std::str::from_utf8(member).ok()?;
    let (place, rest) = member.split_once(' ')?;
    let (weight, ticket) = rest.split_once(' ')?;
    let priority = 255 - u8::from_str_radix(place.get(..2)?, 16).ok()?;
    let info = std::str::from_utf8(info).ok()?;
    let (since, flow, label) = match info.split_once(' ') {
        Some((since, rest)) => {
            let (length, rest) = rest.split_once(' ')?;
            let length: usize = length.parse().ok()?;
            (
                since.parse().ok()?,
                rest.get(..length)?,
                rest.get(length..)?,
            )
        }
        None => (0, "", ""),
    };
    Some(Waiter {
        ticket: Arc::from(ticket),
        priority,
        flow: Arc::from(flow),
        weight: weight.parse().ok()?,
        waiting_since_ms: since,
        holder: Some(label).filter(|l| !l.is_empty()).map(Arc::from),
    })
}
