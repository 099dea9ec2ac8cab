//! [`Answer`]: a script's answer to one admission, named once for Rust: `base.lua`'s `answer` gives
//! its numbers in this order (`batch.lua`, `lone.lua` and `dify.lua` alike), as the Python client's `_core.Answer`
//! reads them.

use crate::error::StoreError;

/// What an admission decided (`base.lua`'s names).
pub(super) mod decision {
    pub(in crate::store::redis) const FULL: i64 = 0;
    pub(in crate::store::redis) const ADMITTED: i64 = 1;
    /// Every key unlimited: nothing recorded.
    pub(in crate::store::redis) const UNLIMITED: i64 = 2;
    /// The weight is over the refusing key's limit.
    pub(in crate::store::redis) const TOO_HEAVY: i64 = 3;
    /// Full, and the waiter's ticket is in the refusing key's queue.
    pub(in crate::store::redis) const WAITS: i64 = 4;
    /// Full, and the refusing key's queue is at its bound.
    pub(in crate::store::redis) const WAITERS_BOUND: i64 = 5;
}

/// A script's answer to one admission.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) struct Answer {
    /// One of [`decision`]'s.
    pub(super) decision: i64,
    /// The refusing key's place among the admission's keys (0-based), or -1.
    pub(super) index: i64,
    /// The refusing key's limit and in-flight count, or the first key's.
    pub(super) limit: i64,
    pub(super) in_flight: i64,
    pub(super) expires_at_ms: i64,
    /// Expired leases the admission removed.
    pub(super) reclaimed: i64,
    pub(super) token: i64,
    /// What the id held before on the first limited key: weight (0: nothing), lease length, token.
    pub(super) held: [i64; 3],
    /// Which keys recorded the lease (bit i: key i).
    pub(super) counted: i64,
    /// Tickets of its keys' queues it found expired (their waiters' processes stopped renewing them).
    pub(super) tickets_expired: i64,
    /// Which keys of the admission's shadow mask it went past the limit of (bit i: key i): answered in
    /// `counted`'s bits 16 to 31.
    pub(super) shadowed: i64,
}

impl Answer {
    /// How many numbers an answer is.
    pub(super) const LEN: usize = 12;

    /// Reads the script's numbers.
    pub(super) fn read(numbers: &[i64]) -> Result<Self, StoreError> {
        let Ok(
            [decision, index, limit, in_flight, expires_at_ms, reclaimed, token, weight, lease_ms, held_token, counted, tickets_expired],
        ) = <[i64; Self::LEN]>::try_from(numbers)
        else {
            let error = format!("an admission answered {numbers:?}");
            return Err(StoreError::Protocol(error));
        };
        Ok(Answer {
            decision,
            index,
            limit,
            in_flight,
            expires_at_ms,
            reclaimed,
            token,
            held: [weight, lease_ms, held_token],
            // (An admission has at most 16 keys: `base.lua` answers both in one number.)
            counted: counted & 0xFFFF,
            tickets_expired,
            shadowed: counted >> 16,
        })
    }
}
