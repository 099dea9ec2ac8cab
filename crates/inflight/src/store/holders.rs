//! Who holds a key's slots and who waits for them, and taking either away (a capability beyond
//! [`Store`], as [`crate::store::BusyKeys`] is): what an operator needs to find a stuck stream or a
//! runaway tenant and act on it at once rather than wait out a lease.

use std::future::Future;
use std::sync::Arc;

use super::Store;
use crate::error::StoreError;
use crate::id::PermitId;

/// How many holders one page of a listing answers with, and the most waiters: at most this many in
/// memory; on Redis a page is one `ZSCAN` step over the key's leases (`COUNT` this), about as many
/// (a few more where a step ends in a crowded bucket; every lease of a key with at most 128).
pub const MAX_PAGE: usize = 100;

/// The longest holder label ([`crate::AcquireOptions::holder`]), in bytes.
pub const MAX_HOLDER_LEN: usize = 128;

/// How long a revoked lease is remembered as revoked, past its deadline: its holder's next renewal,
/// however late within its lease, finds it revoked rather than lost and never adds it back.
pub const REVOKED_GRACE_MS: u64 = 60_000;

/// A lease on a key, as [`Holders::permits`] lists it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Holder {
    /// The permit's id: with it (and its token), anyone can release the permit.
    pub id: PermitId,
    /// The admission's fencing token; 0 where the store keeps none (a generated id's first lease on
    /// Redis, which any release of the id may end).
    pub token: u64,
    /// How many slots it takes.
    pub weight: u32,
    /// When it was admitted (the store's clock, ms since the Unix epoch).
    pub admitted_at_ms: u64,
    /// When its lease ends unless renewed (the store's clock).
    pub lease_expires_at_ms: u64,
    /// The label given at admission, if any.
    pub holder: Option<Arc<str>>,
}

/// A ticket in a key's queue, as [`Holders::permits`] lists it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Waiter {
    /// The ticket's name ([`crate::store::Turn::name`]): what [`Holders::revoke_waiter`] takes.
    pub ticket: Arc<str>,
    /// Its priority level.
    pub priority: u8,
    /// Its flow ("": the flow of waiters that name none).
    pub flow: Arc<str>,
    /// How many slots it waits for.
    pub weight: u32,
    /// When it took its place (the store's clock).
    pub waiting_since_ms: u64,
    /// The label given at admission, if any.
    pub holder: Option<Arc<str>>,
}

/// One page of a key's holders and waiters.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PermitPage {
    /// Holders with unexpired leases, [`MAX_PAGE`] or about as many.
    pub holders: Vec<Holder>,
    /// Waiters in queue order (the next admitted first), at most [`MAX_PAGE`]; on the first page only.
    pub waiters: Vec<Waiter>,
    /// Slots held without a lease, so not listed one by one: permits a store in this process admitted
    /// on its fast path ([`crate::store::Store::hold`]). On the first page only.
    pub unlisted: u32,
    /// Where the next page starts; `None` on the last page.
    pub cursor: Option<String>,
}

/// A store that lists and revokes the holders and waiters of a key. Every process sharing the store
/// sees the same holders and waiters, and a revocation by any of them.
pub trait Holders: Store {
    /// One page of `key`'s holders (and, on the first page, `cursor` `None`, its waiters). A holder
    /// present from the first page to the last is listed at least once; nothing is changed.
    fn permits(
        &self,
        key: &str,
        cursor: Option<&str>,
    ) -> impl Future<Output = Result<PermitPage, StoreError>> + Send;

    /// Removes the lease `id` from `key` at once, whatever its token, and remembers it as revoked for
    /// its lease and [`REVOKED_GRACE_MS`], so that its holder's next renewal reports it lost instead of
    /// adding it back; the slots go to the head of the queue as a release's would. Whether it held one.
    fn revoke(
        &self,
        key: &str,
        id: &PermitId,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send;

    /// Removes `ticket` from `key`'s queue and tells its waiter, whose admission ends with
    /// [`crate::AcquireError::Revoked`]; an ask of the waiter still on its way takes no place. Whether
    /// the ticket was there.
    fn revoke_waiter(
        &self,
        key: &str,
        ticket: &str,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send;
}

/// A cursor as the stores write it: a number.
pub(crate) fn parse_cursor(cursor: Option<&str>) -> Result<u64, StoreError> {
    match cursor {
        None | Some("") => Ok(0),
        Some(text) => text
            .parse()
            .map_err(|_| StoreError::Rejected(format!("not a cursor of this listing: {text:?}"))),
    }
}
