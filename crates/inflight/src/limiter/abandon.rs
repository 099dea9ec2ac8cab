//! An admission under a given id that its caller abandons while the store decides (a timeout wrapped
//! around `acquire`, a client gone): the decision is finished by the limiter's settler and, if it
//! admitted, its lease is released by the admission's own token, which names no other admission of the id. (Under a
//! generated id the release needs no token: see `admission.rs`.)

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::core::Core;
use super::settler::{Attempt, Deferred};
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
                holder: standing.holder.as_deref(),
                shadow: standing.shadow,
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
    /// Hands the decision to the settler: once it answers, a lease it made is released by its token.
    fn drop(&mut self) {
        let Some(decision) = self.decision.take() else {
            return;
        };
        let decision = Arc::new(Mutex::new(Some(decision)));
        // The admission's token once known; `None` until the decision answers, and when it made no lease.
        let made: Arc<Mutex<Option<u64>>> = Arc::default();
        let (store, keys, id) = (self.core.store.clone(), self.keys.clone(), self.id.clone());
        let attempt_id = id.clone();
        let attempt: Attempt = Box::new(move || {
            let deciding = decision.lock().unwrap_or_else(|e| e.into_inner()).take();
            let (store, keys, id, made) = (
                store.clone(),
                keys.clone(),
                attempt_id.clone(),
                made.clone(),
            );
            Box::pin(async move {
                if let Some(deciding) = deciding {
                    if let Ok(Admission::Admitted { grant, .. }) = deciding.await {
                        *made.lock().unwrap_or_else(|e| e.into_inner()) = Some(grant.token);
                    }
                }
                let token = *made.lock().unwrap_or_else(|e| e.into_inner());
                match token {
                    Some(token) => store.release(&keys, &id, token).await.map(drop),
                    None => Ok(()),
                }
            })
        });
        self.core.settler.settle(Deferred {
            what: "abandoned admission",
            key: self.keys[0].clone(),
            id,
            within: Duration::from_millis(self.lease_ms),
            attempt,
        });
    }
}
