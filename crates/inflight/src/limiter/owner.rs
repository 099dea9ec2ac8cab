//! How a permit gets back to its limiter: released now, in the background, or handed off.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::Core;
use crate::error::StoreError;
use crate::permit::{BoxFuture, Owner, PermitState};
use crate::renewer;
use crate::store::Store;

impl<S: Store> Owner for Core<S> {
    fn release_dropped(self: Arc<Self>, state: Arc<PermitState>) {
        state.released.store(true, Ordering::Release);
        self.registry.remove(state.seq);
        match self.store.release_now(&state.key, &state.id) {
            Some(Ok(_)) => {}
            Some(Err(error)) => tracing::warn!(%error, key = %state.key, "release failed"),
            None => renewer::spawn_release(self, state),
        }
    }

    fn release(
        self: Arc<Self>,
        state: Arc<PermitState>,
    ) -> BoxFuture<'static, Result<(), StoreError>> {
        state.released.store(true, Ordering::Release);
        self.registry.remove(state.seq);
        // If this future is dropped before the store answers, or the store is away, the release goes on
        // in the background like a dropped permit's.
        let mut pending = PendingRelease {
            core: Some(self),
            state,
        };
        Box::pin(async move {
            let Some(core) = pending.core.clone() else {
                return Ok(());
            };
            let result = core
                .store
                .release(&pending.state.key, &pending.state.id)
                .await;
            if !matches!(&result, Err(error) if error.is_transient()) {
                pending.core.take();
            }
            result.map(drop)
        })
    }

    fn detach(&self, state: &PermitState) {
        // No longer this limiter's: a renewal already on its way must not re-add it, nor shutdown release it.
        state.released.store(true, Ordering::Release);
        self.registry.remove(state.seq);
    }
}

/// An explicit release not yet taken by the store: finished in the background if dropped.
struct PendingRelease<S: Store> {
    core: Option<Arc<Core<S>>>,
    state: Arc<PermitState>,
}

impl<S: Store> Drop for PendingRelease<S> {
    fn drop(&mut self) {
        if let Some(core) = self.core.take() {
            renewer::spawn_release(core, self.state.clone());
        }
    }
}
