//! An admission under a given id that its caller abandons while the store decides (a timeout wrapped
//! around `acquire`, a client gone): the decision is finished in the background and, if it admitted, its
//! lease is released by the admission's own token, which names no other admission of the id. (Under a
//! generated id the release needs no token: see `admission.rs`.)

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use super::core::Core;
use super::standing::Standing;
use crate::error::StoreError;
use crate::id::PermitId;
use crate::policy::ClassLimits;
use crate::store::{AcquireRequest, Admission, Keys, Store};

type Decision = Pin<Box<dyn Future<Output = Result<Admission, StoreError>> + Send>>;

/// The store's decision of one admission, owned, so that it can outlive its caller.
pub(super) struct Deciding<S: Store> {
    decision: Option<Decision>,
    core: Arc<Core<S>>,
    keys: Keys,
    id: PermitId,
    lease_ms: u64,
}

impl<S: Store> Deciding<S> {
    /// Asks the store to admit `id` on `keys`.
    pub(super) fn start(
        core: &Arc<Core<S>>,
        (keys, id): (Keys, PermitId),
        (weight, lease_ms): (u32, u64),
        limits: &[ClassLimits],
        standing: Standing,
    ) -> Self {
        let store = core.store.clone();
        let (asked, named, limits) = (keys.clone(), id.clone(), limits.to_vec());
        let decision: Decision = Box::pin(async move {
            let keys: Vec<&str> = asked.iter().map(|key| &**key).collect();
            let request = AcquireRequest {
                keys: &keys,
                id: &named,
                weight,
                lease_ms,
                limits: &limits,
                generated: false,
                ticket: standing.ticket(),
                priority: standing.priority,
                floors: standing.floors(),
            };
            store.acquire(request).await
        });
        Self {
            decision: Some(decision),
            core: core.clone(),
            keys,
            id,
            lease_ms,
        }
    }

    /// The store's answer; dropped before it, the decision goes on without the caller.
    pub(super) async fn answer(mut self) -> Result<Admission, StoreError> {
        let Some(decision) = self.decision.as_mut() else {
            return Err(StoreError::Protocol("an admission decided twice".into()));
        };
        let answer = decision.await;
        self.decision = None;
        answer
    }
}

impl<S: Store> Drop for Deciding<S> {
    fn drop(&mut self) {
        let Some(decision) = self.decision.take() else {
            return;
        };
        // Off every runtime nothing can finish it: a lease it made ends at its deadline.
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let (core, keys, id, lease_ms) = (
            self.core.clone(),
            self.keys.clone(),
            self.id.clone(),
            self.lease_ms,
        );
        runtime.spawn(async move {
            if let Ok(Admission::Admitted { grant, .. }) = decision.await {
                let release = core.release_of(keys, id, lease_ms, grant.token);
                core.settler.settle(release);
            }
        });
    }
}
