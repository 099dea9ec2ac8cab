//! A proxied request whose permit is lost while it runs (`--on-revoke end`): an admin revoked it, or its
//! lease was gone at renewal with the key full without it. Its slot is free already, so the proxy ends
//! it: 409 `revoked` while it still waits for the upstream's headers, else its body is cut short. Each is
//! counted in `inflight_proxy_streams_revoked_total{class}`.
//!
//! The loss is heard at the permit's next renewal (a third of its lease). Only a permit with a lease in
//! the store can be lost: a permit of the in-process memory store without a label, or of an unlimited
//! key, is held as before. A permit that can be lost is heard through one boxed future, made when the
//! request first waits (for the upstream's headers), and kept by its response's body.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use http::StatusCode;
use inflight::Permit;

use crate::error::ApiError;
use crate::metrics::ProxiedClass;

/// The permit a proxied request holds, from its admission to the end of its response's body: released
/// when the body ends (its last frame read, or an error), or when the request or its body is dropped.
pub(super) enum Held {
    /// A permit whose loss goes unheard (no lease to lose, `--on-revoke finish`), held for its drop (the
    /// release); None once released.
    Kept(#[allow(dead_code)] Option<Permit>),
    /// One whose loss ends the request, checked whenever polled until the request first waits; then
    /// heard ([`Held::Heard`]), so that the loss wakes it.
    Checked(Permit, Arc<ProxiedClass>),
    /// Its loss, heard: the future holds the permit, and completes (dropping it) once it is lost.
    Heard(Pin<Box<dyn Future<Output = ()> + Send>>, Arc<ProxiedClass>),
    /// Lost: the request was ended.
    Lost,
}

impl Held {
    /// `permit`, whose loss ends the request when it can be lost (it has a lease in the store) and
    /// `ends` (`--on-revoke end`): then counted under the class `class` gives.
    pub(super) fn new(
        permit: Option<Permit>,
        ends: bool,
        class: impl FnOnce() -> Arc<ProxiedClass>,
    ) -> Self {
        match permit {
            Some(permit) if ends && permit.expires_at_ms() != 0 => Self::Checked(permit, class()),
            permit => Self::Kept(permit),
        }
    }

    /// Released: the body has ended.
    pub(super) fn release(&mut self) {
        *self = Self::Kept(None);
    }

    /// True once the permit is lost (counted the first time, when the permit is let go). With `wake`,
    /// the task is woken when it is, from then on.
    #[inline]
    pub(super) fn is_lost(&mut self, cx: &mut Context<'_>, wake: bool) -> bool {
        match self {
            Self::Kept(_) => false,
            _ => self.is_lost_heard(cx, wake),
        }
    }

    /// [`Held::is_lost`] of a permit whose loss ends the request: out of line, so that a request whose
    /// loss goes unheard carries none of it.
    #[inline(never)]
    fn is_lost_heard(&mut self, cx: &mut Context<'_>, wake: bool) -> bool {
        let lost = match self {
            Self::Kept(_) => return false,
            Self::Lost => return true,
            Self::Checked(permit, _) if !wake => permit.is_lost(),
            Self::Checked(..) => {
                let Self::Checked(permit, class) = std::mem::replace(self, Self::Lost) else {
                    unreachable!("matched above")
                };
                let lost = async move { permit.lost().await };
                *self = Self::Heard(Box::pin(lost), class);
                return self.is_lost_heard(cx, true);
            }
            Self::Heard(lost, _) => lost.as_mut().poll(cx).is_ready(),
        };
        if lost {
            if let Self::Checked(_, class) | Self::Heard(_, class) = self {
                class.revoked();
            }
            *self = Self::Lost;
        }
        lost
    }

    /// `answered` (the upstream's answer), unless the permit is lost first: then None (and the request
    /// to the upstream is dropped with `answered`). It takes `answered` pinned where it lies, so that the
    /// proxy's future (which hyper moves, every byte copied) neither grows nor copies it again.
    #[inline]
    pub(super) fn poll_unless_lost<F: Future>(
        &mut self,
        answered: Pin<&mut F>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<F::Output>> {
        if self.is_lost(cx, true) {
            return Poll::Ready(None);
        }
        answered.poll(cx).map(Some)
    }
}

/// 409 `revoked`: the request's permit was lost before its upstream answered.
pub(super) fn revoked() -> ApiError {
    ApiError::new(
        StatusCode::CONFLICT,
        "revoked",
        "The request's slot was revoked before its upstream answered.",
    )
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use inflight::{AcquireOptions, Limiter, MemoryStore, Policy};

    use super::*;

    fn class() -> Arc<ProxiedClass> {
        crate::metrics::Metrics::new(false).proxied_class("lost-test")
    }

    #[tokio::test]
    async fn a_revoked_permit_is_heard_lost_once_and_let_go() {
        let limiter = Limiter::builder(MemoryStore::new())
            .policy(Policy::new(1, 0))
            .lease(Duration::from_millis(300))
            .build();
        let options = AcquireOptions::new().holder("10.0.0.7");
        let permit = limiter.acquire("app", options).await.unwrap();
        let id = permit.id().clone();
        let mut held = Held::new(Some(permit), true, class);
        assert!(
            matches!(held, Held::Checked(..)),
            "a labelled permit has a lease"
        );
        let heard = std::future::poll_fn(|cx| Poll::Ready(held.is_lost(cx, true))).await;
        assert!(!heard, "not lost yet");
        assert!(matches!(held, Held::Heard(..)));
        assert!(limiter.revoke("app", &id).await.unwrap());
        // Heard at the next renewal, which wakes the body (a third of the lease; bounded generously).
        let heard = std::future::poll_fn(|cx| match held.is_lost(cx, false) {
            true => Poll::Ready(()),
            false => Poll::Pending,
        });
        tokio::time::timeout(Duration::from_secs(10), heard)
            .await
            .expect("the loss wakes the body");
        assert!(matches!(held, Held::Lost));
        assert!(limiter.try_acquire("app").await.is_ok(), "the slot is free");
    }

    #[tokio::test]
    async fn a_permit_without_a_lease_is_not_revocable() {
        let limiter = Limiter::builder(MemoryStore::new())
            .policy(Policy::new(1, 0))
            .build();
        let permit = limiter.try_acquire("app").await.unwrap();
        let mut held = Held::new(Some(permit), true, class);
        assert!(matches!(held, Held::Kept(Some(_))), "no lease to lose");
        assert!(!std::future::poll_fn(|cx| Poll::Ready(held.is_lost(cx, true))).await);
        held.release();
        assert!(limiter.try_acquire("app").await.is_ok(), "released");
    }
}
