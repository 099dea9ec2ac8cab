//! [`Limiter::permits`], [`Limiter::revoke`] and [`Limiter::revoke_waiter`]: a key's holders and
//! waiters in every process sharing the store, and taking one away.

use super::Limiter;
use crate::error::StoreError;
use crate::id::PermitId;
use crate::store::{Holders, PermitPage};

impl<S: Holders> Limiter<S> {
    /// One page of `key`'s holders (and, on the first page, its waiters), from every process sharing
    /// the store; `cursor` is the last page's ([`PermitPage::cursor`]), `None` for the first.
    ///
    /// ```
    /// use inflight::{AcquireOptions, Limiter, MemoryStore, Policy};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// let limiter = Limiter::builder(MemoryStore::new()).policy(Policy::new(4, 0)).build();
    /// let _held = limiter.acquire("app-1", AcquireOptions::new().holder("10.0.0.7")).await.unwrap();
    /// let page = limiter.permits("app-1", None).await.unwrap();
    /// assert_eq!(page.holders[0].holder.as_deref(), Some("10.0.0.7"));
    /// assert_eq!(page.cursor, None);
    /// # }
    /// ```
    pub async fn permits(&self, key: &str, cursor: Option<&str>) -> Result<PermitPage, StoreError> {
        self.core.store.permits(key, cursor).await
    }

    /// Takes the lease `id` on `key` away at once, whatever its token: its slot is free, and its holder
    /// hears at its next renewal that it is lost ([`crate::Permit::lost`]) and cannot take it back.
    /// Whether a lease was there.
    pub async fn revoke(&self, key: &str, id: &PermitId) -> Result<bool, StoreError> {
        self.core.store.revoke(key, id).await
    }

    /// Takes `ticket` (as [`Limiter::permits`] lists it) out of `key`'s queue: its waiter's admission
    /// ends with [`crate::AcquireError::Revoked`]. Whether it was there.
    pub async fn revoke_waiter(&self, key: &str, ticket: &str) -> Result<bool, StoreError> {
        self.core.store.revoke_waiter(key, ticket).await
    }
}
