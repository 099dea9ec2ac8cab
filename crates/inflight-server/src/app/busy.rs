//! The busy keys of a worker's limiter, whatever its store: what `GET /v1/keys` and the status page list.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use inflight::{Busiest, BusyKeys, Limiter, StoreError};

type Listing = Pin<Box<dyn Future<Output = Result<Busiest, StoreError>> + Send>>;

/// Lists busy keys through a limiter ([`Limiter::busy`]), its store's type left behind.
#[derive(Clone)]
pub struct BusyLister(Arc<dyn Fn(String, usize) -> Listing + Send + Sync>);

impl BusyLister {
    /// Lists through `limiter` (a clone of the worker's).
    pub fn new<S: BusyKeys>(limiter: Limiter<S>) -> Self {
        Self(Arc::new(move |prefix, limit| {
            let limiter = limiter.clone();
            Box::pin(async move { limiter.busy(&prefix, limit).await })
        }))
    }

    /// The keys starting with `prefix` with permits in flight, busiest first, at most `limit`.
    pub async fn list(&self, prefix: &str, limit: usize) -> Result<Busiest, StoreError> {
        (self.0)(prefix.to_owned(), limit).await
    }
}
