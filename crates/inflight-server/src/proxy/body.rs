//! The body of a proxied response: the upstream's frames as they come, holding the permit, counted in
//! `inflight_in_flight`, and cut short if the server's shutdown grace period ends first, or (`--on-revoke
//! end`) once its permit is revoked (`lost.rs`). It holds the request's charge too: committed once the
//! body has been sent to its end, refunded when it fails, is cut, or is dropped before its end (the client
//! went away).

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use inflight::Reservation;
use pin_project_lite::pin_project;
use tokio::sync::watch;

use super::access::Line;
use super::lost::Held;
use crate::metrics::Proxying;

pin_project! {
    pub(super) struct ProxyBody {
        #[pin]
        inner: hyper::body::Incoming,
        // Released when the body ends or fails, else when it is dropped (after the upstream's connection).
        held: Held,
        cut: Cut,
        _proxying: Option<Proxying>,
        charge: Option<Reservation>,
        // Written when the body is dropped: after the permit's release and the charge's settlement.
        _line: Option<Line>,
    }

    impl PinnedDrop for ProxyBody {
        fn drop(this: Pin<&mut Self>) {
            let this = this.project();
            // The end that the server saw without reading it (its length said so): committed. Any other
            // end before the last frame: the reservation is dropped, refunded.
            if let Some(charge) = this.charge.take().filter(|_| this.inner.is_end_stream()) {
                drop(charge.commit());
            }
        }
    }
}

impl ProxyBody {
    pub(super) fn new(
        inner: hyper::body::Incoming,
        held: Held,
        cut: watch::Receiver<bool>,
        proxying: Option<Proxying>,
        charge: Option<Reservation>,
    ) -> Self {
        Self {
            inner,
            held,
            cut: Cut::Watching(cut),
            _proxying: proxying,
            charge,
            _line: None,
        }
    }

    /// The body, with the access line to write when it is dropped (the response has ended).
    pub(super) fn logged(mut self, line: Option<Line>) -> Self {
        self._line = line;
        self
    }
}

impl Body for ProxyBody {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        let mut this = self.project();
        if this.cut.is_cut(cx, false) {
            this.charge.take();
            return cut_short();
        }
        if this.held.is_lost(cx, false) {
            this.charge.take();
            return revoked();
        }
        let Poll::Ready(frame) = this.inner.as_mut().poll_frame(cx) else {
            // Waiting for the upstream: the cut and the permit's loss must wake this body too.
            return if this.cut.is_cut(cx, true) {
                this.charge.take();
                cut_short()
            } else if this.held.is_lost(cx, true) {
                this.charge.take();
                revoked()
            } else {
                Poll::Pending
            };
        };
        match &frame {
            // Sent to the end (the commit finishes in the background), once the slot is released.
            None => {
                this.held.release();
                drop(this.charge.take().map(Reservation::commit));
            }
            Some(Err(_)) => {
                this.held.release();
                drop(this.charge.take());
            }
            Some(Ok(_)) => {}
        }
        Poll::Ready(frame.map(|frame| frame.map_err(axum::Error::new)))
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// Whether the server's shutdown grace period is over; a body registers to be woken by the cut only once
/// it waits for its upstream.
enum Cut {
    Watching(watch::Receiver<bool>),
    Waiting(Pin<Box<dyn Future<Output = ()> + Send>>),
}

impl Cut {
    /// True once cut (or once the server's end of the channel is gone). With `wake`, the task is woken
    /// when the cut comes, from then on.
    fn is_cut(&mut self, cx: &mut Context<'_>, wake: bool) -> bool {
        match self {
            Self::Watching(cut) if !wake => !matches!(cut.has_changed(), Ok(false)),
            Self::Watching(cut) => {
                let mut cut = cut.clone();
                *self = Self::Waiting(Box::pin(async move {
                    let _ = cut.wait_for(|cut| *cut).await;
                }));
                self.is_cut(cx, true)
            }
            Self::Waiting(waiting) => waiting.as_mut().poll(cx).is_ready(),
        }
    }
}

/// The grace period is over: the response ends with an error, which closes the connection.
fn cut_short() -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
    Poll::Ready(Some(Err(axum::Error::new("the server is shutting down"))))
}

/// The permit was revoked: the response ends with an error, which closes the connection (HTTP/1.1) or
/// resets the stream (HTTP/2), and the upstream's connection is dropped with the body.
fn revoked() -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
    Poll::Ready(Some(Err(axum::Error::new("the permit was revoked"))))
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    use std::task::{Wake, Waker};

    use super::*;

    #[derive(Default)]
    struct Wakes(AtomicUsize);

    impl Wake for Wakes {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    /// A waker, and the count of its wakes.
    fn counted() -> (Arc<Wakes>, Waker) {
        let wakes = Arc::new(Wakes::default());
        (wakes.clone(), Waker::from(wakes))
    }

    #[test]
    fn a_body_that_never_waited_sees_the_cut_when_next_read() {
        let (cut, receiver) = watch::channel(false);
        let mut watching = Cut::Watching(receiver);
        let (wakes, waker) = counted();
        let mut cx = Context::from_waker(&waker);
        assert!(!watching.is_cut(&mut cx, false));
        cut.send_replace(true);
        assert!(watching.is_cut(&mut cx, false));
        assert_eq!(
            wakes.0.load(Ordering::SeqCst),
            0,
            "it never asked to be woken"
        );
    }

    #[test]
    fn a_body_waiting_for_its_upstream_is_woken_by_the_cut() {
        let (cut, receiver) = watch::channel(false);
        let mut waiting = Cut::Watching(receiver);
        let (wakes, waker) = counted();
        let mut cx = Context::from_waker(&waker);
        assert!(!waiting.is_cut(&mut cx, true));
        assert!(!waiting.is_cut(&mut cx, false), "still not cut");
        cut.send_replace(true);
        assert_eq!(wakes.0.load(Ordering::SeqCst), 1, "woken by the cut");
        assert!(waiting.is_cut(&mut cx, false));
    }

    #[test]
    fn a_server_gone_counts_as_cut() {
        let (cut, receiver) = watch::channel(false);
        let (mut watching, mut waiting) =
            (Cut::Watching(receiver.clone()), Cut::Watching(receiver));
        let (_, waker) = counted();
        let mut cx = Context::from_waker(&waker);
        assert!(!waiting.is_cut(&mut cx, true));
        drop(cut);
        assert!(watching.is_cut(&mut cx, false));
        assert!(waiting.is_cut(&mut cx, false));
    }
}
